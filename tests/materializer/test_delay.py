"""Delays and schedules (issue 14 item 4; docs/packs.md, "Delays and schedules"): a work type's fixed
delay and a per-delivery ``run_after`` from ``extract.run_after``, bounded by ``max_s``, counted from
the receipt's ``accepted_at`` (database clock) in the router and the backfill alike; a delayed lane
head holds its lane; a bad value never fails the delivery. Real PostgreSQL throughout.

Controls: every router test fans out to an undelayed work type next to the delayed one and asserts
it is runnable at once (the assertions tell a delay from none); ``test_without_delay_policy`` is the
same deliveries under a manifest without ``delay`` (every clamp/instant assertion would fail there).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from connector.common.delivery.backfill import backfill
from connector.common.delivery.materialization import (
    SCHEDULE_CLAMPED,
    SCHEDULE_DELAY,
    SCHEDULE_INVALID,
    SCHEDULE_PAST,
    SCHEDULE_RUN_AFTER,
    schedule_run_after,
)
from connector.common.packs.document import ManifestError, parse_manifest
from connector.common.packs.extraction import instant_seconds
from connector.common.packs.manifest import DelayPolicy
from connector.common.store import work_items
from connector.common.store.lanes import lanes_of

from .conftest import apply, insert_receipts, manifest, rows, scalar, wait_until, work_type

# --------------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------------


def _doc(delay: Any = None, *, fan_delay: Any = None, extract_run_after: Any = None) -> dict[str, Any]:
    doc = manifest(work_types={"remind": work_type(**({"delay": delay} if delay is not None else {}))})
    route = doc["routes"][0]
    route["fan_out"] = [{"work_type": "remind", **({"delay": fan_delay} if fan_delay is not None else {})}]
    if extract_run_after is not None:
        route["extract"]["run_after"] = extract_run_after
    return doc


@pytest.mark.parametrize(
    ("delay", "fan_delay", "extract", "error"),
    [
        ({"run_after_field": True}, None, {"pointer": "/at"}, "run_after_field needs max_s"),
        ({"max_s": 60}, None, None, "max_s bounds run_after_field"),
        ({"fixed_s": 120, "run_after_field": True, "max_s": 60}, None, {"pointer": "/at"}, "must not exceed"),
        ({"fixed_s": -1}, None, None, "greater than or equal to 0"),
        ({"fixed_s": 400 * 86400}, None, None, "less than or equal to"),
        ({"run_after_field": True, "max_s": 60}, None, None, "delay.run_after_field needs extract.run_after"),
        (None, {"run_after_field": True, "max_s": 60}, None, "delay.run_after_field needs extract.run_after"),
        ({"run_after_field": True, "max_s": 60}, None, {"header": "X-At"}, "header values are not kept"),
        ({"fixed_s": 1, "later": 2}, None, None, "Extra inputs are not permitted"),
    ],
)
def test_manifest_refuses_unbounded_or_unreadable_delays(delay, fan_delay, extract, error) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_manifest(_doc(delay, fan_delay=fan_delay, extract_run_after=extract))
    assert any(error in e for e in caught.value.errors), caught.value.errors


def test_manifest_accepts_delays_and_the_route_override_replaces_the_work_type_s() -> None:
    m = parse_manifest(
        _doc(
            {"fixed_s": 30},
            fan_delay={"run_after_field": True, "max_s": 600},
            extract_run_after={"pointer": "/at"},
        )
    )
    assert m.work_types["remind"].delay == DelayPolicy(fixed_s=30)
    assert m.routes[0].fan_out[0].delay == DelayPolicy(run_after_field=True, max_s=600)
    assert parse_manifest(_doc()).work_types["remind"].delay is None  # the default: no delay


# --------------------------------------------------------------------------------------------------
# The schedule (pure)
# --------------------------------------------------------------------------------------------------

BASE = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
FIELD = DelayPolicy(fixed_s=30, run_after_field=True, max_s=3600)


@pytest.mark.parametrize(
    ("value", "expected", "schedule"),
    [
        ("2026-12-01T12:10:00Z", BASE + timedelta(minutes=10), SCHEDULE_RUN_AFTER),
        ("2026-12-01T13:10:00+01:00", BASE + timedelta(minutes=10), SCHEDULE_RUN_AFTER),
        ("2026-12-01T12:10:00.250Z", BASE + timedelta(minutes=10, milliseconds=250), SCHEDULE_RUN_AFTER),
        (str(int(BASE.timestamp()) + 600), BASE + timedelta(minutes=10), SCHEDULE_RUN_AFTER),
        (f"{BASE.timestamp() + 600.5}", BASE + timedelta(seconds=600.5), SCHEDULE_RUN_AFTER),
        ("2026-12-01T11:00:00Z", None, SCHEDULE_PAST),  # past: runs now (not the fixed delay)
        ("2026-12-01T12:00:00Z", None, SCHEDULE_PAST),
        ("2027-06-01T00:00:00Z", BASE + timedelta(hours=1), SCHEDULE_CLAMPED),  # beyond max_s
        (str(int(BASE.timestamp()) * 1000), BASE + timedelta(seconds=30), SCHEDULE_INVALID),  # millis
        ("tomorrow", BASE + timedelta(seconds=30), SCHEDULE_INVALID),
        ("2026-02-31T00:00:00Z", BASE + timedelta(seconds=30), SCHEDULE_INVALID),
        ("-5", BASE + timedelta(seconds=30), SCHEDULE_INVALID),
        (None, BASE + timedelta(seconds=30), SCHEDULE_DELAY),  # missing: the fixed delay
    ],
)
def test_schedule_of_an_extracted_run_after(value, expected, schedule) -> None:
    assert schedule_run_after(FIELD, BASE.timestamp(), value) == (expected, schedule)


def test_schedule_without_a_field_or_a_fixed_delay() -> None:
    assert schedule_run_after(DelayPolicy(fixed_s=5), BASE.timestamp(), "2026-12-01T12:10:00Z") == (
        BASE + timedelta(seconds=5),
        SCHEDULE_DELAY,
    )  # the field is ignored when the policy does not ask for it
    no_fixed = DelayPolicy(run_after_field=True, max_s=60)
    assert schedule_run_after(no_fixed, BASE.timestamp(), None) == (None, None)
    assert schedule_run_after(no_fixed, BASE.timestamp(), "junk") == (None, SCHEDULE_INVALID)


def test_instant_parser_is_the_verifier_s() -> None:
    """One parser: the ingress verifier's RFC 3339 reader is the one extraction uses."""
    from connector.ingress import verify

    assert verify.rfc3339_seconds("1970-01-01T01:00:00.5+01:00") == 0.5
    assert instant_seconds(" 1970-01-01T00:00:10Z ") == 10.0
    assert instant_seconds("253402300800") is None  # after 9999-12-31
    assert instant_seconds("") is None


# --------------------------------------------------------------------------------------------------
# Router and backfill against PostgreSQL
# --------------------------------------------------------------------------------------------------


def _delayed_doc(**remind: Any) -> dict[str, Any]:
    doc = manifest(
        work_types={
            "remind": work_type(delay={"fixed_s": 300, "run_after_field": True, "max_s": 3600}, **remind),
            "now": work_type(),
        }
    )
    route = doc["routes"][0]
    route["extract"]["run_after"] = {"pointer": "/at"}
    route["fan_out"] = [{"work_type": "remind"}, {"work_type": "now"}]
    return doc


def _bodies(t0: datetime) -> list[bytes]:
    import json

    values: list[Any] = [
        (t0 + timedelta(seconds=600)).strftime("%Y-%m-%dT%H:%M:%SZ"),  # RFC 3339
        int(t0.timestamp()) + 1200,  # Unix seconds as a JSON number
        (t0 - timedelta(days=1)).isoformat(),  # past
        (t0 + timedelta(days=30)).isoformat(),  # beyond max_s: clamped
        "next tuesday",  # unreadable: the fixed delay
        None,  # missing: the fixed delay
        {"nested": 1},  # not a scalar: missing
    ]
    out = []
    for i, v in enumerate(values):
        doc: dict[str, Any] = {"type": "t", "data": {"id": f"o{i}"}}
        if v is not None:
            doc["at"] = v
        out.append(json.dumps(doc).encode())
    return out


async def _schedule(adb, ids: list[int], work_type: str) -> list[tuple[Any, ...]]:
    """(seconds from accepted_at to run_after, run_after <= created_at) per receipt, in order."""
    return await rows(
        adb,
        """SELECT round(extract(epoch FROM w.run_after - r.accepted_at)::numeric, 3)::float8,
                  w.run_after <= w.created_at, w.state
           FROM connector_work_item w JOIN connector_event e USING (event_id)
           JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id
           WHERE e.receipt_id = ANY(%s) AND w.work_type = %s ORDER BY e.receipt_id""",
        (ids, work_type),
    )


async def test_router_schedules_every_value_and_fails_no_delivery(adb, make_router) -> None:
    await apply(adb, _delayed_doc())
    t0 = (await scalar(adb, "SELECT date_trunc('second', now())")).astimezone(UTC)
    ids = await insert_receipts(adb, _bodies(t0))
    accepted = await rows(
        adb, "SELECT accepted_at FROM connector_ingress_receipt WHERE receipt_id = ANY(%s) ORDER BY 1", (ids,)
    )
    result = await (await make_router()).drain()
    assert (result.materialized, result.work_items) == (7, 14)  # no receipt failed or retried
    got = await _schedule(adb, ids, "remind")
    offset = (accepted[0][0] - t0).total_seconds()  # accepted_at is a little after t0
    assert got[0][0] == pytest.approx(600 - offset, abs=0.002)  # the RFC 3339 instant itself
    assert got[1][0] == pytest.approx(1200 - offset, abs=0.002)  # the Unix seconds instant
    assert got[2][1] is True  # past: due at once
    assert got[3][0] == 3600.0  # clamped to max_s after acceptance
    assert [g[0] for g in got[4:]] == [300.0, 300.0, 300.0]  # unreadable / missing: fixed delay
    assert {g[2] for g in got} == {"pending"}
    # Control: the undelayed work type of the same deliveries is due at once.
    assert all(due for _, due, _ in await _schedule(adb, ids, "now"))


async def test_without_delay_policy(adb, make_router) -> None:
    """Control for the test above: the same deliveries without ``delay`` are all due at once."""
    doc = _delayed_doc()
    del doc["work_types"]["remind"]["delay"]
    await apply(adb, doc)
    t0 = (await scalar(adb, "SELECT now()")).astimezone(UTC)
    ids = await insert_receipts(adb, _bodies(t0))
    await (await make_router()).drain()
    assert all(due for _, due, _ in await _schedule(adb, ids, "remind"))


async def test_route_override_and_priority_never_shorten_a_delay(adb, make_router) -> None:
    doc = _delayed_doc(priority=100)
    doc["routes"][0]["fan_out"][1]["delay"] = {"fixed_s": 45}  # the undelayed type, delayed here
    await apply(adb, doc)
    ids = await insert_receipts(adb, _bodies(datetime.now(UTC))[4:5])
    await (await make_router()).drain()
    assert (await _schedule(adb, ids, "remind"))[0][0] == 300.0  # not 300 - 100 s of head start
    assert (await _schedule(adb, ids, "now"))[0][0] == 45.0


async def test_delayed_item_is_not_claimed_before_its_time_by_the_database_clock(adb, make_router) -> None:
    doc = manifest(work_types={"sync": work_type(delay={"fixed_s": 1.5})})
    applied = await apply(adb, doc)
    pack = applied.installed_pack_id
    await insert_receipts(adb, [b'{"type": "t", "data": {"id": "x"}}'])
    await (await make_router()).drain()
    claimed: list[Any] = []

    async def claim() -> bool:
        claimed.extend(
            await work_items.claim.work_item_claim_batch(
                adb, [pack], ["default"], [10], owner="t", lease_s=30
            )
        )
        return bool(claimed)

    assert not await claim()  # right after routing: scheduled, not due
    await wait_until(claim, timeout=30, what="the delayed item to become claimable")
    late = await scalar(
        adb,
        """SELECT extract(epoch FROM w.started_at - r.accepted_at) FROM connector_work_item w
           JOIN connector_event e USING (event_id) JOIN connector_ingress_receipt r USING (receipt_id)""",
    )
    assert float(late) >= 1.5


async def test_a_delayed_lane_head_holds_its_lane(adb, make_router) -> None:
    """Order is never broken by a delay: the second delivery for the same object (no run_after of
    its own) waits behind the scheduled first one; another object's item (control) runs at once."""
    doc = manifest(
        work_types={
            "sync": work_type(lanes={"source_fifo": True}, delay={"run_after_field": True, "max_s": 60})
        }
    )
    doc["routes"][0]["extract"]["run_after"] = {"pointer": "/at"}
    applied = await apply(adb, doc)
    pack = applied.installed_pack_id
    at = (await scalar(adb, "SELECT now() + interval '2 seconds'")).astimezone(UTC).isoformat()
    await insert_receipts(
        adb,
        [
            f'{{"type": "t", "data": {{"id": "A"}}, "at": "{at}"}}'.encode(),
            b'{"type": "t", "data": {"id": "A"}}',
            b'{"type": "t", "data": {"id": "B"}}',
        ],
    )
    await (await make_router()).drain()
    states = await rows(adb, "SELECT source_lane_key, state FROM connector_work_item ORDER BY work_id")
    assert [s for _, s in states] == ["pending", "blocked", "pending"]

    async def claim(n: int = 10) -> list[Any]:
        return list(
            await work_items.claim.work_item_claim_batch(adb, [pack], ["default"], [n], owner="t", lease_s=30)
        )

    first = await claim()
    assert [r[9] for r in first] == ["sync:order:B"]  # control: the undelayed lane runs now
    seen: list[Any] = []

    async def head_due() -> bool:
        seen.extend(await claim())
        return bool(seen)

    await wait_until(head_due, timeout=30, what="the delayed head")
    assert len(seen) == 1 and seen[0][9] == "sync:order:A"
    assert (await claim()) == []  # the second member is still behind its head
    head = seen[0]
    await work_items.finalize.work_item_finalize(
        adb, [head[0]], [head[1]], work_items.finalize.FailBatch(), lanes_of(pack, head[9], None)
    )
    after = await claim()
    assert [(r[9], r[6] > head[6]) for r in after] == [("sync:order:A", True)]


async def test_backfill_counts_the_delay_from_the_receipt_not_the_backfill(adb, make_router) -> None:
    doc = manifest(work_types={"sync": work_type(delay={"fixed_s": 7200})})
    applied = await apply(adb, doc)
    pack = applied.installed_pack_id
    await adb.execute(
        "UPDATE connector_claim_authority SET claim_path = 'legacy_event', phase = 'legacy_active',"
        " cutover_receipt_id = NULL WHERE installed_pack_id = %s",
        (pack,),
    )
    ids = await insert_receipts(adb, [b'{"type": "t", "data": {"id": "x"}}'])
    await (await make_router()).drain()
    # The delivery was accepted an hour before the cutover's backfill.
    await adb.execute(
        "UPDATE connector_ingress_receipt SET accepted_at = accepted_at - interval '1 hour'"
        " WHERE receipt_id = %s",
        (ids[0],),
    )
    await adb.execute(
        "UPDATE connector_claim_authority SET claim_path = 'none', phase = 'quiescing'"
        " WHERE installed_pack_id = %s",
        (pack,),
    )
    assert (await backfill(adb)).work_items == 1
    got = await _schedule(adb, ids, "sync")
    assert got[0][0] == 7200.0  # from accepted_at: due in one hour, not two
