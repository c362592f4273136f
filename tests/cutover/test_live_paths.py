"""Both claim paths live together (issue #28 item 1; docs/cutover.md "Guarantees", the seed's
One-Active-Claim-Path rule).

Real processes on one pack and generation: ``connector ingress`` (a signed route, standard-webhooks),
``connector materializer``, two WorkItem executors x 16 workers that run the whole time, and a legacy
executor (``connector executor --claim-path event --pack shop``) kept running by a supervisor that
restarts it whenever it exits (as a deployment would: it is refused, exit 2, while the generation is
not legacy-owned; it exits 0 by itself after a quiesce). A load thread posts signed deliveries
through the ingress the whole time. The generation goes cutover -> rollback -> legacy active ->
quiesce -> re-cutover twice; in the first round one WorkItem executor is killed (-9) while it holds
items, and the legacy executor is killed (-9) while it holds events. Every execution writes an effect
row (the fencing sink, ``tests.cutover.handlers``): path, pid, token, attempt, and whether its
token still held the work at that moment (``wi_held`` / ``legacy_held``).

Asserted from the sink against the database and the receipts (``_violations``):

* no logical work (pack, generation, event, work type) has an effect from both paths;
* every accepted delivery (HTTP 200) is one receipt whose events have every work type executed
  exactly once under a token that held it; a second held execution only for work a killed process
  held (its effect may have landed before the kill), under a distinct token;
* every rollback receipt's fence set is what the legacy path then executed and nothing of it ran on
  the WorkItem path; no WorkItem effect between a rollback receipt and the next cutover receipt (its
  proof: 0 processing, 0 claim-capable processes); no legacy effect after a cutover receipt (its
  proof: 0 legacy processing), whose historical mirror count equals the work the legacy path ran.

Control (``test_live_paths_control``): the same processes with a legacy build whose work plan takes
WorkItem-finished work for fenced work (``CONNECTOR_TEST_LEGACY_IGNORES_WORK_ITEM_STATE``,
tests/executor/controls): the checks report work executed by both paths.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import hmac
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from benchmarks import e2e_bench
from connector.common.packs import install
from connector.common.packs.document import parse_manifest
from connector.executor import cutover
from tests.executor.helpers import ExecutorProcess, free_port

from .conftest import CONNECTOR, HANDLER, ROOT, LegacyProcess, Rig, wait_until

pytestmark = pytest.mark.slow

SECRET_ENV = "CUTOVER_LIVE_WEBHOOK_SECRET"
CONTROLS = ROOT / "tests" / "executor" / "controls"
STALE_S = 12.0  # > the CLI processes' 5 s heartbeat, with room for a late beat on a loaded machine
RATE = 25.0  # deliveries per second through the ingress
WORK_TYPES = ("sync", "audit")


def _manifest() -> dict[str, Any]:
    handler = {"kind": "python", "target": HANDLER, "timeout_s": 30}
    retry = {"max_attempts": 5, "backoff_base_s": 0.05, "backoff_cap_s": 0.2}
    return {
        "name": "shop",
        "namespace": "shop",
        "work_types": {
            "sync": {"handler": handler, "retry": retry},
            # Due a second after its delivery: at any instant recent events have `sync` done and
            # `audit` still pending, so a rollback fences part of an event (the control needs it).
            "audit": {"handler": handler, "retry": retry, "delay": {"fixed_s": 1.0}},
        },
        "routes": [
            {
                "key": "orders",
                "verification": {"preset": "standard-webhooks", "secrets": [{"env": SECRET_ENV}]},
                "idempotency_header": "webhook-id",
                "extract": {
                    "source_object_kind": {"const": "order"},
                    "source_object_id": {"pointer": "/data/id"},
                },
                "required": ["source_object_id"],
                "fan_out": [{"work_type": wt} for wt in WORK_TYPES],
            }
        ],
    }


class Load(threading.Thread):
    """Signed deliveries at ``RATE`` per second until stopped; what the ingress answered."""

    def __init__(self, port: int, secret: str) -> None:
        super().__init__(daemon=True, name="live-load")
        self.port = port
        self.key = base64.b64decode(secret.removeprefix("whsec_"))
        self.done = threading.Event()
        self.accepted: list[str] = []
        self.refused: collections.Counter[str] = collections.Counter()

    def post(self, n: int) -> str:
        msg_id = f"live-{n}"
        body = json.dumps({"type": "order.updated", "data": {"id": f"o{n % 61}", "mode": "ok"}}).encode()
        ts = int(time.time())
        sig = base64.b64encode(hmac.digest(self.key, f"{msg_id}.{ts}.".encode() + body, "sha256")).decode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/webhooks/shop/orders",
            data=body,
            method="POST",
            headers={
                "content-type": "application/json",
                "webhook-id": msg_id,
                "webhook-timestamp": str(ts),
                "webhook-signature": f"v1,{sig}",
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return str(r.status)
        except urllib.error.HTTPError as exc:
            return str(exc.code)
        except OSError as exc:
            return type(exc).__name__

    def run(self) -> None:
        n = 0
        start = time.monotonic()
        while not self.done.is_set():
            n += 1
            status = self.post(n)
            if status == "200":
                self.accepted.append(f"live-{n}")
            else:
                self.refused[status] += 1
            delay = start + n / RATE - time.monotonic()
            if delay > 0:
                self.done.wait(delay)


class LegacySupervisor:
    """Keeps one legacy executor process running: restarts it whenever it exits (exit codes kept)."""

    def __init__(self, url: str, env: dict[str, str]) -> None:
        self.url = url
        self.env = env
        self.current: LegacyProcess | None = None
        self.exits: list[int] = []
        self.started = 0
        self._task: asyncio.Task[None] | None = None
        self._stop = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while not self._stop:
            proc = LegacyProcess(self.url, self.env)
            self.current = proc
            self.started += 1
            while proc.proc.poll() is None and not self._stop:
                await asyncio.sleep(0.1)
            if self._stop:
                return
            self.exits.append(int(proc.proc.returncode))
            proc.stop()
            await asyncio.sleep(2.0)  # a deployment's restart back-off (and CPU for the rest)

    async def stop(self) -> None:
        self._stop = True
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if self.current is not None:
            self.current.stop()


class Cluster:
    def __init__(self, rig: Rig, tmp: Path, legacy_env: dict[str, str]) -> None:
        self.rig = rig
        self.tmp = tmp
        self.secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
        os.environ[SECRET_ENV] = self.secret  # the pack apply checks that the reference resolves
        self.http_port = free_port()
        self.services: dict[str, subprocess.Popen[bytes]] = {}
        self.executors: list[ExecutorProcess] = []
        self.killed_pids: set[int] = set()
        self.legacy = LegacySupervisor(
            rig.url,
            {"CUTOVER_TEST_PATH": "legacy", "CUTOVER_TEST_JITTER_S": "0.05",
             "CONNECTOR_EXECUTOR_WORKERS": "4", SECRET_ENV: self.secret, **legacy_env},
        )  # fmt: skip
        self.load: Load | None = None

    async def start(self) -> None:
        applied = await install.pack_apply(
            self.rig.conn, parse_manifest(_manifest()), activate=True, actor="live-test"
        )
        self.rig.pack, self.rig.generation = applied.installed_pack_id, applied.generation
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(
            {
                "CONNECTOR_DATABASE_URL": self.rig.url,
                "CONNECTOR_LOG_LEVEL": "WARNING",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                "CONNECTOR_MATERIALIZER_GRPC_PORT": str(free_port()),
                "CONNECTOR_MATERIALIZER_METRICS_PORT": str(free_port()),
            }
        )
        ingress = ["ingress", "--http-port", str(self.http_port), "--grpc-port", str(free_port()),
                   "--metrics-port", str(free_port())]  # fmt: skip
        for name, args in (("ingress", ingress), ("materializer", ["materializer"])):
            log = (self.tmp / f"live-{name}.log").open("wb")
            self.services[name] = subprocess.Popen(
                [str(CONNECTOR), *args], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        for _ in range(2):
            self.executor()
        await asyncio.to_thread(e2e_bench._wait_ready, self.http_port, self.services, 90)
        self.legacy.start()
        self.load = Load(self.http_port, self.secret)
        self.load.start()

    def executor(self) -> ExecutorProcess:
        p = ExecutorProcess(
            self.rig.url,
            extra_env={"CUTOVER_TEST_PATH": "work_item", "CUTOVER_TEST_JITTER_S": "0.05"},
        )
        self.executors.append(p)
        return p

    async def stop(self) -> None:
        if self.load is not None:
            self.load.done.set()
            await asyncio.to_thread(self.load.join, 30)
        await self.legacy.stop()
        for p in self.executors:
            p.stop()
        for p in self.services.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()

    # ------------------------------------------------------------------ waits on state

    async def held_effects(self, path: str) -> int:
        col = "wi_held" if path == "work_item" else "legacy_held"
        return int(await self.rig.scalar(f"SELECT count(*) FROM cutover_test_effect WHERE {col}"))

    async def more_effects(self, path: str, n: int, timeout: float = 90) -> None:
        base = await self.held_effects(path)

        async def grown() -> bool:
            return await self.held_effects(path) >= base + n

        await wait_until(grown, timeout=timeout, what=f"{n} more executions on the {path} path")

    async def kill_9(self, pid: int) -> None:
        """SIGKILL ``pid``; return once every database session it had is gone."""
        import psutil

        db_port = int(self.rig.conn.info.port)
        ports = [
            c.laddr.port
            for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == db_port
        ]
        os.kill(pid, signal.SIGKILL)
        self.killed_pids.add(pid)
        await wait_until(
            lambda: self.rig.scalar(
                "SELECT count(*) = 0 FROM pg_stat_activity WHERE client_port = ANY(%s)", (ports,)
            ),
            what="the killed process's sessions gone",
        )

    async def rollback(self) -> cutover.Transition:
        r = self.rig
        await cutover.rollback_begin(r.conn, r.pack, r.generation, actor="live-test")
        deadline = time.monotonic() + STALE_S + 60
        while True:
            try:
                return await cutover.rollback_complete(
                    r.conn, r.pack, r.generation, actor="live-test", process_stale_s=STALE_S
                )
            except cutover.CutoverBlocked as exc:
                codes = {b.code for b in exc.blockers}
                # Waiting is expected for these only: items finishing, a killed executor's row.
                assert codes <= {"work_item_processing", "work_item_claimer_running"}, exc.blockers
                assert time.monotonic() < deadline, exc.blockers
                await asyncio.sleep(0.5)

    async def recutover(self) -> cutover.Transition:
        r = self.rig
        # Gate 5 needs every fenced row's legacy outcome; a killed legacy executor's events must be
        # reclaimed and finished by its successor while the legacy path is still admitted.
        await wait_until(
            lambda: r.scalar(
                "SELECT count(*) = 0 FROM connector_work_item WHERE installed_pack_id = %s"
                " AND state = 'awaiting_legacy_outcome'",
                (r.pack,),
            ),
            timeout=120,
            what="every fenced WorkItem has its legacy outcome",
        )
        await wait_until(
            lambda: r.scalar(
                "SELECT count(*) = 0 FROM connector_event WHERE installed_pack_id = %s"
                " AND legacy_state IN ('processing', 'retry') AND legacy_attempts > 0",
                (r.pack,),
            ),
            timeout=120,
            what="no legacy attempt left half-done",
        )
        await cutover.legacy_quiesce(r.conn, r.pack, r.generation, actor="live-test")
        deadline = time.monotonic() + STALE_S + 90
        while True:
            try:
                return await cutover.cutover_complete(
                    r.conn, r.pack, r.generation, actor="live-test", process_stale_s=STALE_S
                )
            except cutover.CutoverBlocked as exc:
                codes = {b.code for b in exc.blockers}
                # An event the legacy executor claimed after the wait above (it is admitted until the
                # quiesce) and is still finishing (under its lease, or its outcome being written) is
                # locked by it: the backfill skips it, so it is also reported without WorkItem rows.
                # A wait while the legacy executor is still at work; never alone (and the loop ends
                # only in a cutover that passed, which backfilled it).
                if codes & {"legacy_lease_active", "legacy_process_running", "legacy_receipt_unprojected"}:
                    codes.discard("materialization_incomplete")
                if not codes <= {
                    "legacy_lease_active",
                    "legacy_process_running",
                    "legacy_receipt_unprojected",
                }:
                    raise AssertionError(f"{exc.blockers}\n{await _diagnose(r)}") from exc
                assert time.monotonic() < deadline, exc.blockers
                await asyncio.sleep(0.5)


async def _diagnose(r: Rig) -> str:
    """What an unexpected cutover blocker points at: unprojected receipts with their rows and effects."""
    lines = []
    for rec in await r.rows(
        "SELECT legacy_outcome_receipt_id, event_id, work_type, version, outcome, actor, created_at"
        " FROM connector_legacy_outcome_receipt WHERE NOT projected ORDER BY 1 LIMIT 6"
    ):
        lines.append(f"receipt {rec}")
        for label, query, params in (
            (
                "work item",
                "SELECT work_id, state, attempts, rollback_execution_fence_id, lease_owner, created_at,"
                " updated_at FROM connector_work_item WHERE event_id = %s AND work_type = %s",
                (rec[1], rec[2]),
            ),
            (
                "event",
                "SELECT execution_owner, legacy_state, legacy_attempts, created_at FROM connector_event"
                " WHERE event_id = %s",
                (rec[1],),
            ),
            (
                "effects",
                "SELECT path, pid, token, attempt, wi_held, legacy_held, at FROM cutover_test_effect"
                " WHERE event_id = %s AND work_type = %s ORDER BY at",
                (rec[1], rec[2]),
            ),
        ):
            lines.append(f"  {label} {await r.rows(query, params)}")
    lines.append(
        "receipts "
        + str(
            await r.rows(
                "SELECT cutover_receipt_id, kind, created_at FROM connector_cutover_receipt ORDER BY 1"
            )
        )
    )
    return "\n".join(lines)


async def _wait_legacy_holding(c: Cluster) -> LegacyProcess:
    """The current legacy process once it holds an event (legacy lease) of the generation."""

    async def holding() -> LegacyProcess | None:
        proc = c.legacy.current
        if proc is None or proc.proc.poll() is not None:
            return None
        row = await c.rig.scalar(
            "SELECT count(*) FROM connector_event e JOIN connector_process p"
            " ON e.legacy_lease_owner = p.process_id"
            " WHERE e.installed_pack_id = %s AND e.legacy_state = 'processing' AND p.pid = %s",
            (c.rig.pack, proc.pid),
        )
        return proc if row else None

    return await wait_until(holding, timeout=90, what="the legacy process holds an event")


HELD_BY = "SELECT {what} FROM connector_work_item WHERE lease_owner = %s AND state = 'processing'"
LEGACY_HELD_BY = (
    "SELECT event_id FROM connector_event WHERE legacy_lease_owner = %s AND legacy_state = 'processing'"
)


async def _process_id(r: Rig, pid: int) -> str:
    return str(await r.scalar("SELECT process_id FROM connector_process WHERE pid = %s", (pid,)))


async def _kill_work_item_executor(c: Cluster) -> set[tuple[int, str]]:
    """kill -9 a WorkItem executor holding items, start a replacement, wait until its orphans are
    reclaimed (after their leases) and finished; its orphans (event, work type)."""
    r = c.rig
    victim = c.executors[1]
    vid = await _process_id(r, victim.pid)
    await wait_until(
        lambda: r.scalar(f"SELECT count(*) >= 4 FROM ({HELD_BY.format(what='1')}) x", (vid,)),
        timeout=60,
        what="the victim holds items",
    )
    await c.kill_9(victim.pid)
    held = await r.rows(HELD_BY.format(what="event_id, work_type"), (vid,))
    c.executor()
    await wait_until(
        lambda: r.scalar(f"SELECT count(*) = 0 FROM ({HELD_BY.format(what='1')}) x", (vid,)),
        timeout=60,
        what="the victim's orphans reclaimed",
    )
    await wait_until(
        lambda: r.scalar(
            "SELECT count(*) = 0 FROM connector_work_item WHERE installed_pack_id = %s"
            " AND state IN ('pending', 'retry') AND attempts > 0",
            (r.pack,),
        ),
        timeout=60,
        what="the reclaimed orphans finished (a started attempt blocks a rollback)",
    )
    return {(int(e), str(w)) for e, w in held}


async def _kill_legacy_executor(c: Cluster) -> set[tuple[int, str]]:
    """kill -9 the legacy executor while it holds events (the supervisor restarts it); its orphans."""
    r = c.rig
    proc = await _wait_legacy_holding(c)
    lid = await _process_id(r, proc.pid)
    await c.kill_9(proc.pid)
    return {(int(e), wt) for (e,) in await r.rows(LEGACY_HELD_BY, (lid,)) for wt in WORK_TYPES}


async def _scenario(c: Cluster) -> set[tuple[int, str]]:
    """Two rounds of cutover -> rollback -> legacy -> quiesce -> re-cutover, kills in the first;
    the killed processes' orphans."""
    orphans: set[tuple[int, str]] = set()
    for round_ in (1, 2):
        await c.more_effects("work_item", 120)
        if round_ == 1:
            orphans |= await _kill_work_item_executor(c)
            await c.more_effects("work_item", 50)
        await c.rollback()
        await c.more_effects("legacy", 60 if round_ == 1 else 40)
        if round_ == 1:
            orphans |= await _kill_legacy_executor(c)
            await c.more_effects("legacy", 30)
        await c.recutover()
    await c.more_effects("work_item", 100)
    return orphans


async def _drain(c: Cluster) -> None:
    """Stop the load, then wait until every accepted delivery is materialized and finished."""
    assert c.load is not None
    c.load.done.set()
    await asyncio.to_thread(c.load.join, 30)
    r = c.rig
    await wait_until(
        lambda: r.scalar(
            "SELECT count(*) = 0 FROM connector_ingress_receipt WHERE namespace = 'shop'"
            " AND router_status <> 'materialized'"
        ),
        timeout=120,
        what="every receipt materialized",
    )
    await wait_until(
        lambda: r.scalar(
            "SELECT count(*) = 0 FROM connector_work_item WHERE installed_pack_id = %s"
            " AND state NOT IN ('succeeded', 'reconciled_legacy_terminal')",
            (r.pack,),
        ),
        timeout=120,
        what="every WorkItem finished",
    )


async def _violations(r: Rig, accepted: int, orphans: set[tuple[int, str]], killed: set[int]) -> list[str]:
    out: list[str] = []
    both = await r.rows(
        "SELECT event_id, work_type, array_agg(DISTINCT path) FROM cutover_test_effect"
        " GROUP BY 1, 2 HAVING count(DISTINCT path) > 1 ORDER BY 1, 2 LIMIT 20"
    )
    if both:
        out.append(f"logical work executed by both paths (event, work type, paths): {both}")
    unlabelled = await r.scalar("SELECT count(*) FROM cutover_test_effect WHERE path IS NULL")
    if unlabelled:
        out.append(f"{unlabelled} effects without a path")
    receipts = int(await r.scalar("SELECT count(*) FROM connector_ingress_receipt WHERE namespace = 'shop'"))
    if receipts != accepted:
        out.append(f"{accepted} deliveries accepted (HTTP 200) but {receipts} receipts stored")
    missing = await r.rows(
        """SELECT e.event_id, wt FROM connector_event e CROSS JOIN unnest(%(wts)s::text[]) wt
           WHERE e.installed_pack_id = %(pack)s AND NOT EXISTS (
             SELECT 1 FROM cutover_test_effect f WHERE f.event_id = e.event_id AND f.work_type = wt
               AND (f.wi_held OR f.legacy_held)) ORDER BY 1 LIMIT 20""",
        {"wts": list(WORK_TYPES), "pack": r.pack},
    )
    if missing:
        out.append(f"accepted work never executed under a holding token: {missing}")
    events = int(
        await r.scalar("SELECT count(*) FROM connector_event WHERE installed_pack_id = %s", (r.pack,))
    )
    receipts_with_events = int(
        await r.scalar(
            "SELECT count(DISTINCT receipt_id) FROM connector_event WHERE installed_pack_id = %s", (r.pack,)
        )
    )
    if receipts_with_events != receipts or events != receipts:
        out.append(f"{receipts} receipts, {receipts_with_events} with events, {events} events (one each)")
    repeated = await r.rows(
        """SELECT event_id, work_type, count(*), count(DISTINCT token), array_agg(pid ORDER BY at)
           FROM cutover_test_effect WHERE wi_held OR legacy_held GROUP BY 1, 2 HAVING count(*) > 1"""
    )
    for event_id, wt, n, tokens, pids in repeated:
        key = (int(event_id), str(wt))
        if key not in orphans or n != tokens or n > 2 or pids[0] not in killed:
            out.append(
                f"executed {n} times under {tokens} tokens by {pids}: {key} (orphan: {key in orphans})"
            )
    # The gates' receipts against the sink.
    rec = await r.rows(
        "SELECT cutover_receipt_id, kind, proof FROM connector_cutover_receipt"
        " WHERE installed_pack_id = %s AND generation = %s ORDER BY cutover_receipt_id",
        (r.pack, r.generation),
    )
    kinds = [k for _, k, _ in rec]
    if kinds != ["install", "rollback", "cutover", "rollback", "cutover"]:
        out.append(f"receipts {kinds}")
    bounds = [(k, p) for _, k, p in rec] + [("end", None)]
    for i, (_, kind, proof) in enumerate(rec):
        if kind == "install":
            continue
        checked = proof["checked_at"]
        until = bounds[i + 1][1]["checked_at"] if bounds[i + 1][1] else "infinity"
        other = "work_item" if kind == "rollback" else "legacy"
        late = await r.rows(
            "SELECT event_id, work_type, at FROM cutover_test_effect WHERE path = %s"
            " AND at > %s::timestamptz AND at < %s::timestamptz LIMIT 5",
            (other, checked, until),
        )
        if late:
            out.append(f"{kind} receipt {checked}: {other} effects while it was not admitted: {late}")
        if kind == "rollback":
            z, f = proof["zero_work_item_claimers"], proof["fence"]
            if z["processing"] or z["claim_capable_processes_for_generation"]:
                out.append(f"rollback proof not zero: {z}")
            fenced = await r.rows(
                "SELECT event_id, work_type FROM connector_work_item WHERE rollback_execution_fence_id = %s",
                (f["fence_id"],),
            )
            if len(fenced) != f["fenced_work_items"]:
                out.append(f"fence {f['fence_id']}: proof {f['fenced_work_items']} rows, table {len(fenced)}")
            ran = await r.rows(
                """SELECT w.event_id, w.work_type,
                          bool_or(x.path = 'legacy' AND x.legacy_held), bool_or(x.path = 'work_item')
                   FROM connector_work_item w LEFT JOIN cutover_test_effect x
                     ON x.event_id = w.event_id AND x.work_type = w.work_type
                   WHERE w.rollback_execution_fence_id = %s GROUP BY 1, 2""",
                (f["fence_id"],),
            )
            wrong = [(e, w) for e, w, legacy, wi in ran if not legacy or wi]
            if wrong:
                out.append(f"fence {f['fence_id']}: not run by the legacy path alone: {wrong[:10]}")
        else:
            z, mirror = proof["zero_old_claimers"], proof["historical_mirror"]
            if z["legacy_processing_events"] or z["legacy_processes_fresh"]:
                out.append(f"cutover proof not zero: {z}")
            legacy_ran = int(
                await r.scalar(
                    "SELECT count(*) FROM (SELECT DISTINCT event_id, work_type FROM cutover_test_effect"
                    " WHERE path = 'legacy' AND legacy_held AND at < %s::timestamptz) x",
                    (checked,),
                )
            )
            if mirror["reconciled_legacy_terminal_work_items"] != legacy_ran:
                out.append(
                    f"cutover {checked}: {mirror['reconciled_legacy_terminal_work_items']} reconciled"
                    f" rows, the legacy path ran {legacy_ran}"
                )
    return out


async def test_both_paths_live_twice_with_kill_9(rig: Rig, tmp_path: Path) -> None:
    c = Cluster(rig, tmp_path, {})
    try:
        await c.start()
        orphans = await _scenario(c)
        await _drain(c)
        assert c.load is not None
        problems = await _violations(rig, len(c.load.accepted), orphans, c.killed_pids)
        assert not problems, "\n".join(problems)
        # The scenario did what it claims: both kills left orphans, both rollbacks fenced work.
        assert orphans, "the killed processes held work"
        fenced = [
            int(p["fence"]["fenced_work_items"])
            for (p,) in await rig.rows(
                "SELECT proof FROM connector_cutover_receipt WHERE kind = 'rollback' ORDER BY 1"
            )
        ]
        assert len(fenced) == 2 and min(fenced) > 0, fenced
        paths = dict(
            await rig.rows(
                "SELECT path, count(*) FROM cutover_test_effect WHERE wi_held OR legacy_held GROUP BY 1"
            )
        )
        repeated = await rig.scalar(
            "SELECT count(*) FROM (SELECT 1 FROM cutover_test_effect WHERE wi_held OR legacy_held"
            " GROUP BY event_id, work_type HAVING count(*) > 1) x"
        )
        print(
            f"live paths: {len(c.load.accepted)} deliveries accepted, held executions by path {paths},"
            f" fenced per rollback {fenced}, orphans {len(orphans)}, re-executed orphans {repeated},"
            f" legacy process exits {c.legacy.exits}"
        )
        # The legacy binary was refused while the generation was not legacy-owned and exited by
        # itself after each quiesce; the load never saw a refusal.
        assert c.legacy.exits.count(0) == 2 and 2 in c.legacy.exits, c.legacy.exits
        assert -signal.SIGKILL in c.legacy.exits
        assert not c.load.refused, c.load.refused
        wi = await rig.scalar("SELECT count(DISTINCT pid) FROM cutover_test_effect WHERE path = 'work_item'")
        assert wi >= 3, "both WorkItem executors (and the replacement) ran work"
    finally:
        await c.stop()


async def test_live_paths_control(rig: Rig, tmp_path: Path) -> None:
    """Control: a legacy build that runs WorkItem-finished work types of a fenced event."""
    c = Cluster(
        rig,
        tmp_path,
        {
            "CONNECTOR_TEST_LEGACY_IGNORES_WORK_ITEM_STATE": "1",
            "PYTHONPATH": os.pathsep.join([str(CONTROLS), str(ROOT)]),
        },
    )
    try:
        await c.start()
        await c.more_effects("work_item", 100)
        await c.rollback()
        await c.more_effects("legacy", 40)
        await wait_until(
            lambda: rig.scalar(
                "SELECT count(*) > 0 FROM (SELECT 1 FROM cutover_test_effect GROUP BY event_id, work_type"
                " HAVING count(DISTINCT path) > 1) x"
            ),
            timeout=60,
            what="the broken legacy build executing WorkItem-finished work",
        )
        assert c.load is not None
        problems = await _violations(rig, len(c.load.accepted), set(), set())
        assert any("executed by both paths" in p for p in problems), problems
    finally:
        await c.stop()
