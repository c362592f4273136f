"""``connector admin find`` / ``connector admin trace`` against a real admin server: the table, the
trace view, ``--json``, usage errors (exit 2) and API errors with their reason (exit 1)."""

from __future__ import annotations

import json

import pytest

from .conftest import VIEW, VIEW_REPLAY, Seed
from .test_cli import cli  # noqa: F401  (the fixture)
from .test_find import _as_ingress_keys


async def test_find_table_json_and_errors(
    cli,  # noqa: F811
    seed: Seed,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pack = await seed.pack()
    dead = await seed.item(pack, state="dead")
    ok = await seed.item(pack, state="succeeded")
    await _as_ingress_keys(seed)
    delivery = await seed.one(
        "SELECT r.provider_delivery_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
        " JOIN connector_ingress_receipt r ON r.receipt_id = e.receipt_id WHERE w.work_id = %s",
        (dead,),
    )
    code, out, _ = await cli("find", "--delivery-id", delivery, token=VIEW)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["RECEIPT", "ACCEPTED", "ROUTE", "DELIVERY_ID"]
    assert len(lines) == 2 and f"{dead}:sync=dead" in lines[1] and "shop/orders" in lines[1]

    code, out, _ = await cli("find", "--namespace", "shop", "--json", token=VIEW)
    assert code == 0
    data = json.loads(out)
    assert sorted(int(w["work_id"]) for d in data["deliveries"] for w in d["work_items"]) == [dead, ok]

    code, out, err = await cli("find", "--namespace", "shop", "--limit", "1", token=VIEW)
    assert code == 0 and "--page-token" in err
    code, out, _ = await cli("find", "--namespace", "shop", "--limit", "1", "--all", "--json", token=VIEW)
    assert len(json.loads(out)["deliveries"]) == 2

    code, _, err = await cli("find", token=VIEW)
    assert code == 1 and err.startswith("error: INVALID_ARGUMENT FILTER_REQUIRED: ")
    code, _, err = await cli("find", "--since", "1h", "--until", "2h", token=VIEW)
    assert code == 1 and "INVALID_TIME_RANGE" in err
    for argv, message in ((("--state", "deadish"), "invalid choice"), (("--correlation", "x"), "NAME=VALUE")):
        with pytest.raises(SystemExit) as exit_:  # argparse: a usage error
            await cli("find", *argv, token=VIEW)
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err


async def test_trace_view_json_and_errors(cli, seed: Seed) -> None:  # noqa: F811
    pack = await seed.pack()
    head = await seed.item(pack, state="dead", source_lane="order:1")
    blocked = await seed.item(pack, state="blocked", source_lane="order:1")
    code, out, _ = await cli("trace", "--work-id", str(blocked), token=VIEW)
    assert code == 0, out
    assert "verified        hmac-sha256 with key env:SHOP_SECRET" in out
    assert "trace id        - (tracing was off)" in out
    assert f"why         lane_blocked: blocked in source lane 'order:1' behind work item {head} (dead" in out
    assert f"lane        source 'order:1': head {head} (dead), 1 ahead" in out
    assert "do-not-leak" not in out

    code, out, _ = await cli("trace", "--work-id", str(blocked), "--json", token=VIEW)
    data = json.loads(out)
    (wt,) = data["events"][0]["work_items"]
    assert wt["wait"]["reason"] == "WAIT_REASON_LANE_BLOCKED" and int(wt["wait"]["blocking_work_id"]) == head

    code, out, _ = await cli("trace", "--work-id", str(head), "--payload", token=VIEW_REPLAY)
    assert code == 0 and "do-not-leak" in out and "why         dead:" in out

    code, _, err = await cli("trace", token=VIEW)
    assert code == 2 and "give one of" in err
    code, _, err = await cli("trace", "5", "--work-id", "6", token=VIEW)
    assert code == 2 and "give one of" in err
    code, _, err = await cli("trace", "999999", token=VIEW)
    assert code == 1 and err.startswith("error: NOT_FOUND RECEIPT_NOT_FOUND: ")
    code, _, err = await cli("trace", "--work-id", str(head), "--payload", token=VIEW)
    assert code == 1 and "PAYLOAD_NOT_ALLOWED" in err


async def test_trace_view_lists_attempts(cli, seed: Seed) -> None:  # noqa: F811
    from connector.common.store.work_items import claim, finalize

    pack = await seed.pack()
    item = await seed.item(pack, state="pending", failure_class=None, finished_ago_s=None)
    await seed.conn.execute("UPDATE connector_work_item SET attempts = 0, lease_token = 0")
    for op in (finalize.FailOp.RETRY, finalize.FailOp.DEAD):
        ((_, token, *_),) = await claim.work_item_claim_batch(
            seed.conn, [pack], ["default"], [1], owner="exec-a", lease_s=30
        )
        batch = finalize.FailBatch()
        batch.add(item, token, op, failure_class="http_503", summary=f"upstream said 503 ({op.name})")
        await finalize.work_item_fail_batch(seed.conn, batch)
        await seed.conn.execute(
            "UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (item,)
        )
    code, out, _ = await cli("trace", "--work-id", str(item), token=VIEW)
    assert code == 0, out
    lines = [x.strip() for x in out.splitlines() if x.strip().startswith("attempt ")]
    assert len(lines) == 2, out
    assert lines[0].startswith("attempt 1   retry") and "token 1  owner exec-a" in lines[0]
    assert lines[0].endswith("http_503: upstream said 503 (RETRY)")
    assert lines[1].startswith("attempt 2   dead") and lines[1].endswith("http_503: upstream said 503 (DEAD)")
    assert "not kept" not in out
    code, out, _ = await cli("trace", "--work-id", str(item), "--json", token=VIEW)
    (wt,) = json.loads(out)["events"][0]["work_items"]
    assert [a["outcome"] for a in wt["attempts"]] == ["retry", "dead"]
