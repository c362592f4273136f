"""Every console page over HTTP against the admin API and a seeded database: what each page shows,
the actions in place (pause / resume, circuits, cutover gates) and the bulk replay flow (estimate →
confirmation naming the count → job → progress → done), for an operator and a read-only session."""

from __future__ import annotations

import asyncio
import html
import re

import grpc
import psycopg
import pytest

from connector.v1 import admin_service_pb2 as pb
from connector.v1 import admin_service_pb2_grpc

from .conftest import OPERATOR, VIEW, Browserless, Console, Seed, digest
from .stage import CIRCUIT_TARGET, SUMMARY, stage


def _forms(page: str) -> list[str]:
    return re.findall(r'<form method="post" action="([^"]+)"', page)


async def _operator_actions(console: Console, scene_crm: int, scene_shop: int) -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{console.admin.server.port}")
    stub = admin_service_pb2_grpc.AdminServiceStub(channel)
    md = (("authorization", f"Bearer {OPERATOR}"),)
    await stub.OpenCircuit(
        pb.OpenCircuitRequest(installed_pack_id=scene_crm, target=CIRCUIT_TARGET, reason="crm maintenance"),
        metadata=md,
    )
    await stub.PausePack(
        pb.PausePackRequest(installed_pack_id=scene_crm, reason="INC-42 provider outage"), metadata=md
    )
    await channel.close()


async def test_every_page_shows_the_cluster(console: Console, seed: Seed, db: psycopg.Connection) -> None:
    scene = await stage(seed, db)
    await _operator_actions(console, scene.crm, scene.shop)
    op = await console.login(OPERATOR)
    pages = {}
    for path in ("/", "/deliveries?namespace=shop", f"/deliveries/{scene.receipt_of_dead}", "/failures",
                 f"/failures/group?pack={scene.shop}&work_type=sync&failure_class=downstream_rejected&summary=crm+refused+the+change%3A+422",
                 "/lanes", "/cutover", "/processes", "/jobs"):  # fmt: skip
        status, text, _ = await op.get(path)
        assert status == 200, (path, status, text[:800])
        pages[path.split("?")[0]] = html.unescape(text)
    overview = pages["/"]
    # the cards: from the figures (GetFigures) where the admin API serves them, else from the queue counts
    assert ("Accepted / s" if hasattr(pb, "GetFiguresRequest") else "Unrouted receipts") in overview
    assert "shop" in overview and "crm" in overview
    assert 'hx-get="/overview/queues?pack=0"' in overview  # the pack table: loaded once, not polled
    status, queues, _ = await op.get("/overview/queues?pack=0")
    # from the sampled figures (nothing counted): the cluster's row and one per pack
    assert status == 200 and all(t in queues for t in ("cluster", ">shop<", ">crm<", "connector admin stats"))
    status, live, _ = await op.get("/overview/live?pack=0&window=hour", headers={"HX-Request": "true"})
    assert status == 200 and live.lstrip().startswith('<div id="live"') and "<html" not in live
    deliveries = pages["/deliveries"]
    assert f'href="/deliveries/{scene.receipt_of_dead}"' in deliveries and "dead" in deliveries
    delivery = pages[f"/deliveries/{scene.receipt_of_dead}"]
    first = scene.dead[0]
    for text in ("Timeline", "received", "verified", "committed", "Why not running", "dead", SUMMARY,
                 f"Replay work item {first}", f"Cancel work item {first}", "sync:order-0",
                 f"Attempts of work item {first}", "executor-7f3a", "executor-91c2",
                 f"work item {first} attempt 3 dead"):  # fmt: skip
        assert text in delivery, text
    failures = pages["/failures"]
    assert f"Review {len(scene.dead)}" in failures and SUMMARY in failures and "timeout" in failures
    group = pages["/failures/group"]
    assert all(f'value="{w}"' in group for w in scene.dead) and "Estimate replay" in group
    lanes = pages["/lanes"]
    for text in ("post:inv-7", str(scene.blocked_head), CIRCUIT_TARGET, "open (forced)", "crm maintenance",
                 "INC-42 provider outage", "Resume crm", "Close circuit"):  # fmt: skip
        assert text in lanes, text
    cutover = pages["/cutover"]
    assert "legacy" in cutover and "quiescing" in cutover and "Complete the cutover" in cutover
    assert "Blocked (dry run)" in cutover or "every proof holds" in cutover
    processes = pages["/processes"]
    assert "4242" in processes and "stale" in processes and "Revision" in processes
    # a read-only session: the same pages, no action anywhere
    view = await console.login(VIEW)
    for path in ("/", f"/deliveries/{scene.receipt_of_dead}", "/failures", "/lanes", "/cutover", "/processes",
                 f"/failures/group?pack={scene.shop}"):  # fmt: skip
        status, text, _ = await view.get(path)
        assert status == 200, (path, status)
        assert _forms(text) == ["/logout"], (path, _forms(text))
        assert "Estimate replay" not in text
    assert "ConnectorOperator role" in (await view.get("/cutover"))[1]


async def _wait_job(client: Browserless, url: str) -> str:
    for _ in range(200):
        status, text, _ = await client.get(url)
        assert status == 200
        if 'id="job-state">running' not in text:
            return html.unescape(text)
        await asyncio.sleep(0.05)
    raise AssertionError("the job did not finish")


async def test_bulk_replay_of_a_group_estimate_confirm_job(
    console: Console, seed: Seed, db: psycopg.Connection, adb: psycopg.AsyncConnection
) -> None:
    scene = await stage(seed, db, dead=12, lanes=3)
    op = await console.login(OPERATOR)
    await op.get("/failures")
    fields = {
        "pack": str(scene.shop),
        "work_type": "sync",
        "failure_class": "downstream_rejected",
        "summary": SUMMARY,
    }
    before = await digest(adb)
    status, text, _ = await op.post(
        "/failures/estimate", {**fields, "scope": "all", "action": "replay", "csrf": op.csrf}
    )
    assert status == 200, text[:500]
    text = html.unescape(text)
    assert "Replay 12 dead letters?" in text and "Lanes</dt><dd>3" in text
    assert await digest(adb) == before, "the estimate is a dry run"
    job_id = re.search(r'name="job_id" value="([0-9a-f]+)"', text).group(1)  # type: ignore[union-attr]
    assert 'data-confirm="Replay 12 dead letters?' in text
    form = {**fields, "scope": "all", "action": "replay", "count": "12", "job_id": job_id, "csrf": op.csrf}
    status, _, headers = await op.post("/jobs", form)
    assert status == 303 and headers["Location"] == f"/jobs/{job_id}"
    status, _, headers = await op.post("/jobs", form)  # the same confirmation again: the same job
    assert status == 303 and headers["Location"] == f"/jobs/{job_id}"
    page = await _wait_job(op, f"/jobs/{job_id}")
    assert 'id="job-state">finished' in page and "12 replayed, 0 refused, of 12" in page
    states = {w: await seed.state(w) for w in scene.dead}
    for ids in scene.lanes.values():  # lane order: the first of each lane runs next, the rest wait
        assert [states[w] for w in ids] == ["pending"] + ["blocked"] * (len(ids) - 1)
    assert await seed.one("SELECT count(*) FROM connector_work_item WHERE replay_count = 1") == 12
    _, jobs, _ = await op.get("/jobs")
    assert jobs.count(f'href="/jobs/{job_id}"') == 1


async def test_bulk_cancel_of_a_selection(console: Console, seed: Seed, db: psycopg.Connection) -> None:
    scene = await stage(seed, db, dead=6, lanes=2)
    op = await console.login(OPERATOR)
    await op.get("/failures")
    picked = scene.dead[:2]
    fields = {"pack": str(scene.shop), "work_type": "sync", "failure_class": "", "summary": ""}
    status, text, _ = await op.post(
        "/failures/estimate",
        [
            *fields.items(),
            ("scope", "selected"),
            ("action", "cancel"),
            ("csrf", op.csrf),
            *(("ids", str(w)) for w in picked),
        ],
    )
    assert status == 200 and "Cancel 2 dead letters?" in html.unescape(text)
    job_id = re.search(r'name="job_id" value="([0-9a-f]+)"', text).group(1)  # type: ignore[union-attr]
    form = [*fields.items(), ("scope", "selected"), ("action", "cancel"), ("count", "2"), ("job_id", job_id),
            ("csrf", op.csrf), *(("ids", str(w)) for w in picked)]  # fmt: skip
    status, text, _ = await op.post("/jobs", form)
    assert status == 400 and "reason" in text  # a cancel says why
    status, _, _ = await op.post("/jobs", [*form, ("reason", "duplicates, refunded by hand")])
    assert status == 303
    page = await _wait_job(op, f"/jobs/{job_id}")
    assert "2 cancelled, 0 refused, of 2" in page
    assert [await seed.state(w) for w in scene.dead] == ["cancelled"] * 2 + ["dead"] * 4


async def test_pause_resume_and_circuit_from_the_lanes_page(
    console: Console, seed: Seed, db: psycopg.Connection
) -> None:
    scene = await stage(seed, db)
    op = await console.login(OPERATOR)
    await op.get("/lanes")
    status, text, _ = await op.post("/packs/pause", {"pack": str(scene.shop), "csrf": op.csrf, "reason": ""})
    assert status == 400 and "reason" in text
    status, _, headers = await op.post(
        "/packs/pause",
        {"pack": str(scene.shop), "reason": "deploy freeze", "csrf": op.csrf, "request_id": "p-1"},
    )
    assert status == 303 and headers["Location"] == "/lanes"
    _, page, _ = await op.get("/lanes")
    assert f"pack {scene.shop} paused" in page and "deploy freeze" in page and "Resume shop" in page
    assert (
        await seed.one("SELECT count(*) FROM connector_pause WHERE installed_pack_id = %s", (scene.shop,))
    ) == 1
    await op.post(
        "/packs/resume", {"pack": str(scene.shop), "queue_class": "*", "csrf": op.csrf, "request_id": "r-1"}
    )
    assert (
        await seed.one("SELECT count(*) FROM connector_pause WHERE installed_pack_id = %s", (scene.shop,))
    ) == 0
    await op.post(
        "/circuits/open",
        {"pack": str(scene.crm), "target": CIRCUIT_TARGET, "reason": "crm down", "csrf": op.csrf},
    )
    state = await seed.one("SELECT state FROM connector_circuit WHERE installed_pack_id = %s", (scene.crm,))
    assert state == "open"
    _, page, _ = await op.get("/lanes")
    assert "crm down" in page and "Close circuit" in page


async def test_bulk_replay_of_a_failed_receipt_group(
    console: Console, seed: Seed, db: psycopg.Connection
) -> None:
    await stage(seed, db)
    other = await seed.receipt("shop", "orders", status="failed", error_class="bad_json", error_summary="x")
    op = await console.login(OPERATOR)
    _, failures, _ = await op.get("/failures")
    link = re.search(r'href="(/failures/receipts\?[^"]+)">Review 3<', failures)
    assert link, "the failed-receipt group links to its receipts"
    status, page, _ = await op.get(html.unescape(link.group(1)))
    assert status == 200 and "Replay 3 failed receipts" in page
    view = await console.login(VIEW)  # read-only: the same list, no action
    status, view_page, _ = await view.get(html.unescape(link.group(1)))
    assert status == 200 and "3 failed receipts in this group" in view_page
    assert "Replay 3" not in view_page and _forms(view_page) == ["/logout"]
    fields = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', page))
    assert fields["job_id"] and fields["count"] == "3" and fields["error_class"] == "required_missing"
    fields = {k: html.unescape(v) for k, v in fields.items()}
    status, _, headers = await op.post("/failures/receipts/replay", fields)
    assert status == 303 and headers["Location"] == f"/jobs/{fields['job_id']}"
    done = await _wait_job(op, f"/jobs/{fields['job_id']}")
    assert "3 replayed, 0 refused, of 3" in done
    cur = await seed.conn.execute(
        "SELECT router_status, count(*) FROM connector_ingress_receipt"
        " WHERE router_status IN ('failed', 'pending') GROUP BY 1 ORDER BY 1"
    )
    states = await cur.fetchall()
    assert states == [("failed", 1), ("pending", 3)]  # the other group's receipt is untouched
    assert (
        await seed.one("SELECT router_status FROM connector_ingress_receipt WHERE receipt_id = %s", (other,))
        == "failed"
    )


async def test_failure_groups_scan_the_newest_rows(
    console: Console, seed: Seed, db: psycopg.Connection
) -> None:
    """The Failures page groups the newest 2,000 rows of each pack (ListFailureGroups scan_limit) and
    says when older ones exist, with a link that groups the newest 10,000; ``scan`` is validated."""
    scene = await stage(seed, db)
    op = await console.login(OPERATOR)
    status, text, _ = await op.get("/failures")
    assert status == 200 and "older ones exist" not in text  # control: every dead letter grouped
    status, text, _ = await op.get("/failures?scan=1")
    text = html.unescape(text)
    assert status == 200 and "only the newest 1 of each pack were grouped" in text
    assert "group the newest 10,000" in text and f"Review {len(scene.dead)}" not in text
    status, text, _ = await op.get("/failures?scan=10001")
    assert status == 400 and "scan" in text


async def test_lanes_page_follows_the_lane_walk(
    console: Console, seed: Seed, db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocked lanes are read head by head, at most LANES_SCAN lanes per page: with 1, the page ends
    early with a "More lanes" link, and following the links reaches the blocked lane."""
    from connector.executor.admin import servicer

    scene = await stage(seed, db)
    op = await console.login(OPERATOR)
    status, whole, _ = await op.get("/lanes")
    assert status == 200 and "post:inv-7" in whole and "More lanes" not in whole  # control
    monkeypatch.setattr(servicer, "LANES_SCAN", 1)
    path, seen, pages = "/lanes", "", 0
    while path and pages < 50:
        status, text, _ = await op.get(path)
        assert status == 200, text[:500]
        seen += text
        pages += 1
        found = re.search(r'<a href="(/lanes\?pack=0&amp;page=[^"]+)">More lanes</a>', text)
        path = html.unescape(found.group(1)) if found else ""
    assert pages > 1 and "post:inv-7" in seen and str(scene.blocked_head) in seen


async def test_delivery_page_shows_each_attempt(console: Console, seed: Seed) -> None:
    """A WorkItem that failed twice (retry by exec-a, then a lease that expired under exec-b) and
    runs now under exec-c: the Delivery page lists the three attempts in claim order with outcome,
    token, owner and sanitized error, and puts each on the timeline. Control: an item never claimed
    has no attempts table."""
    from connector.common.store.work_items import claim, finalize

    pack = await seed.pack("shop")
    item = await seed.item(pack, state="pending", failure_class=None, finished_ago_s=None)
    await seed.conn.execute("UPDATE connector_work_item SET attempts = 0, lease_token = 0")

    async def take(owner: str, lease_s: float = 30) -> int:
        ((_, token, *_),) = await claim.work_item_claim_batch(
            seed.conn, [pack], ["default"], [1], owner=owner, lease_s=lease_s
        )
        return int(token)

    batch = finalize.FailBatch()
    batch.add(item, await take("exec-a"), finalize.FailOp.RETRY, failure_class="http_503", summary="busy <b>")
    await finalize.work_item_fail_batch(seed.conn, batch)
    await seed.conn.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (item,))
    await take("exec-b", lease_s=0.01)
    await asyncio.sleep(0.05)
    assert [r.work_id for r in await finalize.work_item_reclaim_expired(seed.conn)] == [item]
    await seed.conn.execute("UPDATE connector_work_item SET run_after = now() WHERE work_id = %s", (item,))
    await take("exec-c")
    receipt = await seed.one(
        "SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
        " WHERE w.work_id = %s",
        (item,),
    )
    op = await console.login(VIEW)
    status, text, _ = await op.get(f"/deliveries/{receipt}")
    assert status == 200, text[:800]
    assert "busy &lt;b&gt;" in text and "busy <b>" not in text  # escaped
    page = html.unescape(text)
    rows = re.findall(r"<tr><td>(\d+)</td><td><span class=\"badge s-(\w+)\">", page)
    assert rows == [("1", "retry"), ("2", "lease_expired"), ("3", "running")], rows
    table = page.split('aria-label="Attempts of work item', 1)[1].split("</table>", 1)[0]
    assert table.index("exec-a") < table.index("exec-b") < table.index("exec-c")
    assert "http_503: busy <b>" in table and "lease_expired: the lease expired" in table
    for step in (f"work item {item} attempt 1 retry", f"work item {item} attempt 2 lease expired",
                 f"work item {item} attempt 3"):  # fmt: skip
        assert step in page, step
    assert "not kept" not in page
    other = await seed.item(pack, state="pending", failure_class=None, finished_ago_s=None)
    await seed.conn.execute(
        "UPDATE connector_work_item SET attempts = 0, lease_token = 0 WHERE work_id = %s", (other,)
    )
    receipt = await seed.one(
        "SELECT e.receipt_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
        " WHERE w.work_id = %s",
        (other,),
    )
    status, text, _ = await op.get(f"/deliveries/{receipt}")
    assert status == 200 and "Attempts of work item" not in text
