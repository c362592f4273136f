"""The HA compose smoke's checks (``./dev smoke --ha``; run by scripts/compose-smoke.sh --ha after it
has built the images).

Brings up deploy/docker-compose.yml + deploy/smoke/docker-compose.smoke.yml +
deploy/docker-compose.ha.yml with ``--profile ha`` (etcd, Patroni nodes pg1 and pg2 with synchronous
replication, the services given the multi-host URL ``…@pg1:5432,pg2:5432/…?target_session_attrs=
read-write``), then, from outside the containers:

1. the Patroni cluster has a leader and a synchronous standby (``sync_standby`` in Patroni's
   ``/cluster``, ``sync`` in the leader's ``pg_stat_replication``);
2. signed deliveries (``standardwebhooks``) flow: acknowledged by the ingress and executed (the
   receiver records each handler call);
3. under that load, ``podman kill`` (SIGKILL) of the Patroni leader; the load goes on;
4. the standby is promoted; the ingress acknowledges again and the executors execute again, **without
   any connector container restarted** (same start time, still running);
5. every acknowledged delivery has its receipt on the new leader and its WorkItem ``succeeded``, and
   the receiver saw a successful call for it: lost = 0, not executed = 0;
6. the killed node, started again, rejoins as the new leader's synchronous standby;

then ``down -v``. Prints the figures: deliveries acknowledged before/after the kill, answers during
the failover by status, seconds from the kill to the promotion, to the first acknowledgement and to
the first execution, lost and not executed. Exit 0 only when every check passed. Never prints the
signing secret or the admin token.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compose_smoke as smoke
from compose_smoke import SmokeError, Stack, free_port, http, say, wait_for
from standardwebhooks import Webhook

HA_FILES = [*smoke.COMPOSE_FILES, smoke.DEPLOY / "docker-compose.ha.yml"]
#: Patroni member name -> compose service (pg1 keeps the main file's name `postgres`).
NODES = {"pg1": "postgres", "pg2": "pg2"}
CONNECTOR = ("ingress", "materializer", "executor")
EXECUTORS = 2
SENDERS = 4
#: Load kept going after the ingress acknowledges again, so the new leader takes real traffic.
AFTER_BACK_S = 15.0
SERVE_AGAIN_BOUND_S = 120.0


@dataclass
class Sent:
    msg_id: str
    sent: float
    done: float
    status: int  # HTTP status; 0 = no answer (connection error or client timeout)


@dataclass
class Load:
    """SENDERS threads posting signed deliveries to the ingress until stopped."""

    ingress: str
    key: str
    results: list[Sent] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for i in range(SENDERS):
            t = threading.Thread(target=self._run, name=f"load-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def halt(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)

    def snapshot(self) -> list[Sent]:
        with self.lock:
            return list(self.results)

    def _run(self) -> None:
        webhook = Webhook(self.key)
        url = f"{self.ingress}/v1/webhooks/smoke/events"
        while not self.stop.is_set():
            msg_id = f"msg_{uuid.uuid4().hex}"
            body = json.dumps({"type": "smoke.created", "data": {"id": msg_id}})
            now = datetime.now(tz=UTC)
            headers = {
                "content-type": "application/json",
                "webhook-id": msg_id,
                "webhook-timestamp": str(int(now.timestamp())),
                "webhook-signature": webhook.sign(msg_id, now, body),
            }
            sent = time.time()
            try:
                status, _ = http("POST", url, body.encode(), headers)
            except OSError:
                status = 0
                self.stop.wait(0.2)  # the ingress itself unreachable: do not spin
            with self.lock:
                self.results.append(Sent(msg_id, sent, time.time(), int(status)))


def acked(rows: list[Sent]) -> list[Sent]:
    return [r for r in rows if 200 <= r.status < 300]


class Cluster:
    """Patroni's REST API of each node, reached from the host on the container's address."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack

    def container(self, member: str) -> str:
        found = self.stack.containers(NODES[member])
        if not found:
            raise SmokeError(f"no running container for Patroni member {member}")
        return str(found[0]["Names"][0])

    def members(self, via: str) -> list[dict[str, Any]]:
        status, body = http("GET", f"http://{self.stack.ip_of(self.container(via))}:8008/cluster")
        if status != 200:
            raise SmokeError(f"Patroni /cluster on {via} answered {status}")
        return list(json.loads(body)["members"])

    def roles(self, via: str) -> dict[str, str]:
        return {m["name"]: m["role"] for m in self.members(via) if m.get("state") in ("running", "streaming")}


def check_synchronous(stack: Stack, cluster: Cluster) -> tuple[str, str, str]:
    """(leader, standby, what was observed): a leader and a synchronous standby streaming from it."""

    def probe() -> tuple[str, str] | None:
        roles = cluster.roles("pg1")
        leader = [n for n, r in roles.items() if r == "leader"]
        sync = [n for n, r in roles.items() if r == "sync_standby"]
        return (leader[0], sync[0]) if leader and sync else None

    leader, standby = wait_for("a Patroni leader and a synchronous standby", probe, 120, every_s=1)
    stack.db_service = NODES[leader]
    names = stack.psql("SHOW synchronous_standby_names")[0][0]
    rows = stack.psql("SELECT application_name, state, sync_state FROM pg_stat_replication")
    if [standby, "streaming", "sync"] not in rows:
        raise SmokeError(f"{leader}'s pg_stat_replication does not show {standby} as sync: {rows}")
    commit = stack.psql("SHOW synchronous_commit")[0][0]
    return (
        leader,
        standby,
        f"leader {leader}, synchronous standby {standby} (Patroni /cluster: sync_standby;"
        f" synchronous_standby_names = {names}; pg_stat_replication: {standby} streaming sync;"
        f" synchronous_commit = {commit})",
    )


def standby_ready(stack: Stack, ingress: str) -> tuple[str, int]:
    """(the ingress' connector_db_synchronous_standby_ready, its /readyz status): whether the ingress,
    asked for synchronous commits, sees a synchronous standby."""
    (container,) = stack.containers("ingress")
    status, body = http("GET", f"http://{stack.ip_of(container['Names'][0])}:9101/metrics")
    if status != 200:
        raise SmokeError(f"ingress metrics answered {status}")
    values = [
        line.rsplit(" ", 1)[1]
        for line in body.decode().splitlines()
        if line.startswith("connector_db_synchronous_standby_ready{") and 'service="ingress"' in line
    ]
    ready, _ = http("GET", f"{ingress}/readyz")
    return (values[0] if values else "absent", int(ready))


def wait_standby_ready(stack: Stack, ingress: str, want: tuple[str, int], what: str) -> str:
    seen = wait_for(
        f"the ingress to report {what} (synchronous_standby_ready, /readyz = {want})",
        lambda: (lambda got: got if (float(got[0]), got[1]) == (float(want[0]), want[1]) else None)(
            standby_ready(stack, ingress)
        ),
        90,
        every_s=1,
    )
    return f"connector_db_synchronous_standby_ready{{service=ingress}} = {seen[0]}, /readyz {seen[1]}"


def connector_starts(stack: Stack) -> dict[str, str]:
    """container -> start time, for every connector container (a restart changes it)."""
    out = {}
    for service in CONNECTOR:
        for c in stack.containers(service):
            name = c["Names"][0]
            state = stack.inspect(name)["State"]
            out[name] = f"{state.get('StartedAt')} running={state.get('Running')}"
    return out


def executed(receiver: str) -> dict[int, float]:
    """work id -> time of its first successful handler call."""
    out: dict[int, float] = {}
    for c in smoke.receiver_calls(receiver):
        if c["status"] == 200:
            wid = int(c["work_id"])
            out[wid] = min(out.get(wid, c["started"]), c["started"])
    return out


def repeats(receiver: str) -> tuple[int, int]:
    """(deliveries whose handler succeeded more than once, work ids called with two different
    idempotency keys). The first is at-least-once delivery (a re-run under the same key, which the
    handler's idempotency absorbs); the second would be an identity collision and must be 0."""
    by_key: Counter[str] = Counter()
    keys_of: dict[int, set[str]] = {}
    for c in smoke.receiver_calls(receiver):
        if c["status"] == 200:
            by_key[str(c["idempotency_key"])] += 1
            keys_of.setdefault(int(c["work_id"]), set()).add(str(c["idempotency_key"]))
    return sum(1 for n in by_key.values() if n > 1), sum(1 for k in keys_of.values() if len(k) > 1)


def smoke_items(stack: Stack) -> dict[str, tuple[int, str]]:
    """provider delivery id -> (work id, state) of every smoke delivery, from the leader."""
    rows = stack.psql(
        "SELECT r.provider_delivery_id, w.work_id, w.state FROM connector_ingress_receipt r"
        " JOIN connector_event e ON e.receipt_id = r.receipt_id"
        " JOIN connector_work_item w ON w.event_id = e.event_id WHERE r.namespace = 'smoke'"
    )
    return {r[0]: (int(r[1]), r[2]) for r in rows}


def smoke_receipts(stack: Stack) -> set[str]:
    return {
        r[0]
        for r in stack.psql(
            "SELECT provider_delivery_id FROM connector_ingress_receipt WHERE namespace = 'smoke'"
        )
    }


def check_failover(
    stack: Stack, cluster: Cluster, ingress: str, receiver: str, key: str
) -> list[tuple[str, str]]:
    observed: list[tuple[str, str]] = []
    leader, standby, sync = check_synchronous(stack, cluster)
    observed.append(("synchronous replication", sync))
    ready_before = wait_standby_ready(stack, ingress, ("1", 200), "a synchronous standby")
    starts = connector_starts(stack)

    load = Load(ingress, key)
    load.start()
    try:
        # Warm up: deliveries acknowledged and executed before the kill.
        wait_for(
            "200 acknowledged deliveries", lambda: True if len(acked(load.snapshot())) >= 200 else None, 120
        )
        wait_for(
            "deliveries executed before the kill",
            lambda: True if len(executed(receiver)) >= 50 else None,
            120,
        )
        victim = cluster.container(leader)
        say(f"killing the Patroni leader {leader} ({victim}, SIGKILL) under load")
        stack.podman("kill", victim)
        # The kill counts from when the leader is gone (a request sent while the podman command ran
        # could still commit on it).
        wait_for(
            f"{victim} to stop",
            lambda: True if not stack.inspect(victim)["State"].get("Running") else None,
            30,
            every_s=0.1,
        )
        t_kill = time.time()

        def promoted() -> float | None:
            return time.time() if cluster.roles(standby).get(standby) == "leader" else None

        t_promoted = wait_for(f"{standby} to be promoted", promoted, SERVE_AGAIN_BOUND_S, every_s=0.25)
        stack.db_service = NODES[standby]
        say(f"{standby} is the leader {t_promoted - t_kill:.1f}s after the kill")

        def ack_after_kill() -> float | None:
            done = [r.done for r in acked(load.snapshot()) if r.sent > t_kill]
            return min(done) if done else None

        t_ack = wait_for(
            "the ingress to acknowledge again", ack_after_kill, SERVE_AGAIN_BOUND_S, every_s=0.25
        )
        time.sleep(AFTER_BACK_S)  # load on the new leader (a duration of load, not a wait on state)
    finally:
        load.halt()
    rows = load.snapshot()
    ok = acked(rows)
    before = [r for r in ok if r.done <= t_kill]
    during = [r for r in rows if r.sent <= t_ack and r.done > t_kill]
    after = [r for r in ok if r.sent > t_kill]
    answers = Counter(str(r.status or "no answer") for r in during)
    slowest = max((r.done - r.sent for r in during), default=0.0)
    bad = {s: n for s, n in answers.items() if s not in ("no answer", "503") and not s.startswith("2")}
    observed.append(
        (
            "load",
            f"{len(rows)} signed deliveries sent by {SENDERS} senders, {len(ok)} acknowledged"
            f" ({len(before)} before the kill, {len(after)} sent after it); answers while failing over:"
            f" {dict(sorted(answers.items()))}, slowest answer {slowest:.1f}s",
        )
    )
    if bad:
        raise SmokeError(f"answers other than 2xx / 503 while failing over: {bad}")

    # Every acknowledged delivery: its receipt is on the new leader, its WorkItem succeeds, the
    # receiver saw the call. Wait on that state (bounded), then count what is missing.
    ids = {r.msg_id for r in ok}

    def all_done() -> dict[str, tuple[int, str]] | None:
        items = smoke_items(stack)
        return items if all(items.get(i, (0, ""))[1] == "succeeded" for i in ids) else None

    with contextlib.suppress(SmokeError):
        wait_for("every acknowledged delivery to be executed", all_done, 240, every_s=2)
    receipts = smoke_receipts(stack)
    items = smoke_items(stack)
    calls = executed(receiver)
    twice, collisions = repeats(receiver)
    lost = sorted(ids - receipts)
    unexecuted = sorted(
        i for i in ids - set(lost) if items.get(i, (0, ""))[1] != "succeeded" or items[i][0] not in calls
    )
    # Executing again: the first handler call of a delivery acknowledged after the kill (its WorkItem
    # was made on the new leader; calls of items claimed before the kill need no database to start).
    new_work = {items[r.msg_id][0] for r in after if r.msg_id in items}
    t_exec = min((t for wid, t in calls.items() if wid in new_work), default=None)
    # Routing again: the materializer's first routing of a receipt accepted after the kill.
    routed = stack.psql(
        "SELECT coalesce(extract(epoch FROM min(routed_at)), 0) FROM connector_ingress_receipt"
        f" WHERE namespace = 'smoke' AND accepted_at > to_timestamp({t_kill})"
    )
    t_routed = float(routed[0][0]) if routed and float(routed[0][0]) > 0 else None
    observed.append(
        (
            "failover",
            f"promotion {t_promoted - t_kill:.1f}s after the kill; ingress acknowledging again after"
            f" {t_ack - t_kill:.1f}s; materializer routing again after"
            f" {(t_routed - t_kill) if t_routed else float('nan'):.1f}s; executors executing again"
            f" after {(t_exec - t_kill) if t_exec else float('nan'):.1f}s",
        )
    )
    observed.append(
        (
            "acknowledged and executed",
            f"{len(ids)} acknowledged, lost {len(lost)} (no receipt on the new leader), not executed"
            f" {len(unexecuted)}; {len(receipts)} smoke receipts stored (unacknowledged ones may commit too);"
            f" handler run more than once (same idempotency key) for {twice}; identity collisions"
            f" {collisions}",
        )
    )
    if collisions:
        raise SmokeError(f"{collisions} work ids were called with two different idempotency keys")
    if lost or unexecuted:
        raise SmokeError(
            f"lost {len(lost)}, not executed {len(unexecuted)} of {len(ids)} acknowledged deliveries"
        )
    if t_exec is None or t_routed is None:
        raise SmokeError("no routing or no handler call of a delivery acknowledged after the kill")
    after_starts = connector_starts(stack)
    if after_starts != starts:
        changed = {k: (starts.get(k), v) for k, v in after_starts.items() if starts.get(k) != v}
        raise SmokeError(f"connector containers restarted or replaced during the failover: {changed}")
    observed.append(
        ("no restart", f"{len(starts)} connector containers kept their start time and kept running")
    )
    # Alone, the new leader has no synchronous standby: the ingress (synchronous commit asked for)
    # says so, and says it again once the old leader is back as the standby.
    alone = wait_standby_ready(stack, ingress, ("0", 503), "no synchronous standby")
    # The old leader comes back as the new leader's synchronous standby (pg_rewind, then streaming).
    t_start = time.time()
    stack.podman("start", victim)

    def rejoined() -> float | None:
        return time.time() if cluster.roles(standby).get(leader) == "sync_standby" else None

    t_rejoined = wait_for(f"{leader} to rejoin as the synchronous standby", rejoined, 180, every_s=1)
    back = wait_standby_ready(stack, ingress, ("1", 200), "the synchronous standby back")
    observed.append(
        (
            "old leader back",
            f"{leader} restarted: the synchronous standby of {standby} {t_rejoined - t_start:.1f}s later",
        )
    )
    observed.append(
        (
            "ingress readiness (CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT=on)",
            f"before the kill: {ready_before}; {standby} alone: {alone}; {leader} back: {back}",
        )
    )
    say(
        f"FIGURES: kill -> promotion {t_promoted - t_kill:.1f}s, -> ingress acks {t_ack - t_kill:.1f}s,"
        f" -> routing {t_routed - t_kill:.1f}s, -> executions {t_exec - t_kill:.1f}s;"
        f" acknowledged {len(ids)}, lost {len(lost)}, run twice {twice}, identity collisions {collisions},"
        f" not executed {len(unexecuted)}"
    )
    return observed


def wait_healthy(stack: Stack) -> str:
    want = {
        "etcd": 1,
        "postgres": 1,
        "pg2": 1,
        "receiver": 1,
        "ingress": 1,
        "materializer": 1,
        "executor": EXECUTORS,
    }

    def probe() -> str | None:
        healthy: dict[str, int] = {}
        for c in stack.containers():
            service = c["Labels"].get("com.docker.compose.service", "")
            if "(healthy)" in str(c.get("Status", "")):
                healthy[service] = healthy.get(service, 0) + 1
            elif c.get("State") == "exited" and service != "migrate":
                raise SmokeError(f"{c['Names'][0]} exited: {c.get('Status')}")
        if all(healthy.get(s, 0) >= n for s, n in want.items()):
            return ", ".join(f"{s} x{healthy[s]}" for s in want)
        return None

    return wait_for("every service healthy", probe, 300, every_s=1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", default="connector-smoke-ha")
    parser.add_argument("--keep", action="store_true", help="leave the stack up (no down -v)")
    args = parser.parse_args(argv)
    if shutil.which("docker-compose") is None or shutil.which("podman") is None:
        say("docker-compose and podman are needed (scripts/compose-smoke.sh installs them)")
        return 2

    key = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    operator = secrets.token_urlsafe(24)
    ports = {name: free_port() for name in ("ingress", "receiver")}
    env = dict(os.environ)
    env.update(
        SMOKE_WEBHOOK_SECRET=key,
        CONNECTOR_ADMIN_TOKENS=f"{operator}=ConnectorOperator",
        CONNECTOR_INGRESS_PUBLISH=f"127.0.0.1:{ports['ingress']}",
        SMOKE_RECEIVER_PUBLISH=f"127.0.0.1:{ports['receiver']}",
        COMPOSE_HTTP_TIMEOUT="300",
    )
    stack = Stack(args.project, env, files=HA_FILES, profiles=("ha",))
    cluster = Cluster(stack)
    ingress = f"http://127.0.0.1:{ports['ingress']}"
    receiver = f"http://127.0.0.1:{ports['receiver']}"
    phases = smoke.Phases()
    observed: list[tuple[str, str]] = []
    ticker = smoke.HealthTicker(stack) if smoke.HealthTicker.needed() else None
    ok = False
    try:
        stack.compose("down", "-v", "--remove-orphans", check=False, quiet=True)
        if ticker:
            say("no systemd: running the containers' health checks from this script (podman healthcheck run)")
            ticker.start()
        with phases.phase("up (--profile ha) until healthy"):
            stack.compose(
                "up",
                "-d",
                "--no-build",
                "--scale",
                f"executor={EXECUTORS}",
                "ingress",
                "materializer",
                "executor",
                "receiver",
            )
            observed.append(("stack healthy", wait_healthy(stack)))
        with phases.phase("pack apply (admin API, operator token)"):
            smoke.apply_pack(stack, operator)
        with phases.phase("signed delivery executed"):
            check_synchronous(stack, cluster)  # psql goes to the leader
            observed.append(("signed delivery", smoke.check_signed_delivery(stack, ingress, receiver, key)))
        with phases.phase("kill the Patroni leader under load"):
            observed.extend(check_failover(stack, cluster, ingress, receiver, key))
        ok = True
    except SmokeError as exc:
        say(f"FAILED: {exc}")
        with contextlib.suppress(SmokeError, subprocess.SubprocessError):
            for c in stack.containers(all_states=True):
                say(f"  {c['Names'][0]}: {c.get('Status')}")
            for service in ("postgres", "pg2", "migrate", "ingress", "materializer", "executor"):
                say(f"  last log lines of {service}:")
                stack.compose("logs", "--no-color", "--tail", "15", service, check=False)
    finally:
        if ticker:
            ticker.stop()
        if not args.keep:
            with phases.phase("down -v"):
                stack.compose("down", "-v", "--remove-orphans", check=False, quiet=True)
                left = stack.containers(all_states=True)
                if left:
                    ok = False
                    say(f"containers left after down -v: {[c['Names'][0] for c in left]}")
    say("observed:")
    for name, text in observed:
        say(f"  [{name}] {text}")
    phases.report()
    say("PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
