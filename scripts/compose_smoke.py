"""The compose smoke's checks (run by scripts/compose-smoke.sh after it has built the images).

Brings up deploy/docker-compose.yml (+ deploy/smoke/docker-compose.smoke.yml) with
``--scale executor=3`` through docker-compose against a Docker-compatible socket (podman's), then
proves from outside the containers:

1. a delivery signed with the ``standardwebhooks`` library is executed (the ingress answers 2xx on
   its published port, the WorkItem ends ``succeeded``, the receiver saw the handler call), and a
   delivery signed with another key is refused (401) and writes nothing;
2. Prometheus (the compose service) reports ``up == 1`` for every target: ingress, materializer and
   all three executor replicas, each replica its own target;
3. ``connector admin stats`` in another container reaches the admin API with a token (and is
   refused without one);
4. ``podman kill`` of the executor holding in-flight items loses nothing: every item it held is
   reclaimed by another replica and completes;

then ``down -v``. Prints what each check observed and the time of every phase. Exit 0 only when
every check passed. Never prints the signing secret or the admin tokens.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from standardwebhooks import Webhook

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE_FILES = [DEPLOY / "docker-compose.yml", DEPLOY / "smoke" / "docker-compose.smoke.yml"]
PACK = DEPLOY / "smoke" / "pack.yaml"
EXECUTORS = 3
HELD_ITEMS = 12
T = TypeVar("T")


class SmokeError(Exception):
    pass


def say(text: str) -> None:
    print(f"smoke: {text}", flush=True)


class Phases:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, str]] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        say(f"--- {name}")
        start = time.monotonic()
        status = "FAILED"
        try:
            yield
            status = "ok"
        finally:
            took = time.monotonic() - start
            self.rows.append((name, took, status))
            say(f"--- {name}: {status} in {took:.1f}s")

    def report(self) -> None:
        say("phase timings:")
        for name, took, status in self.rows:
            say(f"  {name:<42} {took:7.1f}s  {status}")
        say(f"  {'total (checks and teardown)':<42} {sum(r[1] for r in self.rows):7.1f}s")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 0.5) -> T:
    """Poll ``probe`` until it returns something other than None (a state, never a fixed sleep)."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while True:
        try:
            value = probe()
            if value is not None:
                return value
        except (OSError, SmokeError, ValueError, KeyError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise SmokeError(f"timed out after {timeout_s:.0f}s waiting for {what}{detail}")
        time.sleep(every_s)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:  # noqa: S310 - 127.0.0.1 only
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Stack:
    def __init__(
        self,
        project: str,
        env: dict[str, str],
        files: list[Path] | None = None,
        profiles: tuple[str, ...] = (),
        db_service: str = "postgres",
    ) -> None:
        self.project = project
        self.env = env
        self.files = files or COMPOSE_FILES
        self.profiles = profiles
        #: The compose service whose container ``psql`` runs in (the HA smoke points it at the leader).
        self.db_service = db_service

    def compose(
        self,
        *args: str,
        check: bool = True,
        stdin: bytes | None = None,
        quiet: bool = False,
        token: str = "",
    ) -> str:
        """Run docker-compose on the smoke project; ``token`` is the admin token the ``admin``
        service gets (through the environment, never on a command line)."""
        cmd = ["docker-compose", "--ansi", "never", "-p", self.project]
        for f in self.files:
            cmd += ["-f", str(f)]
        for profile in self.profiles:
            cmd += ["--profile", profile]
        cmd += list(args)
        env = {**self.env, "SMOKE_ADMIN_TOKEN": token}
        proc = subprocess.run(  # noqa: S603 - our own fixed command line
            cmd, env=env, input=stdin, capture_output=True, timeout=600, check=False, cwd=DEPLOY
        )
        out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        if check and proc.returncode != 0:
            raise SmokeError(
                f"docker-compose {' '.join(args[:2])} failed (exit {proc.returncode}):\n{out}{err}"
            )
        if not quiet and (out + err).strip():
            for line in (out + err).strip().splitlines()[-40:]:
                print(f"    {line}", flush=True)
        return out if proc.returncode == 0 else out + err

    def podman(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run(  # noqa: S603 - our own fixed command line
            ["podman", *args],  # noqa: S607 - podman from PATH, as installed by compose-smoke.sh
            env=self.env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        if check and proc.returncode != 0:
            raise SmokeError(f"podman {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
        return proc.stdout.decode(errors="replace")

    def containers(self, service: str | None = None, all_states: bool = False) -> list[dict[str, Any]]:
        args = ["ps", "--format", "json", "--filter", f"label=com.docker.compose.project={self.project}"]
        if service:
            args += ["--filter", f"label=com.docker.compose.service={service}"]
        if all_states:
            args.append("--all")
        return list(json.loads(self.podman(*args) or "[]"))

    def inspect(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.podman("inspect", name))[0])

    def ip_of(self, name: str) -> str:
        networks = self.inspect(name)["NetworkSettings"]["Networks"]
        return str(next(iter(networks.values()))["IPAddress"])

    def psql(self, sql: str) -> list[list[str]]:
        """Rows of ``sql`` run by psql inside the postgres container (its port is not published)."""
        postgres = self.containers(self.db_service)
        if not postgres:
            raise SmokeError(f"no running {self.db_service} container")
        out = self.podman(
            "exec",
            postgres[0]["Names"][0],
            "psql",
            "-h",
            "/run/postgresql",
            "-U",
            "connector",
            "-d",
            "connector",
            "-X",
            "-v",
            "ON_ERROR_STOP=1",
            "-AtF",
            "\t",
            "-c",
            sql,
        )
        return [line.split("\t") for line in out.splitlines() if line.strip()]


class HealthTicker:
    """Runs each container's health check every few seconds where podman cannot (no systemd: podman
    schedules health checks with systemd timers, so without systemd they never run and a
    ``service_healthy`` dependency would wait forever). Docker and podman on a systemd host need
    none of this."""

    def __init__(self, stack: Stack, interval_s: float = 2.0) -> None:
        self.stack = stack
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-ticker", daemon=True)

    @staticmethod
    def needed() -> bool:
        return not Path("/run/systemd/system").is_dir()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for c in self.stack.containers():
                    if c.get("State") == "running":
                        self.stack.podman("healthcheck", "run", c["Names"][0], check=False)
            except (SmokeError, OSError, ValueError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.interval_s)


# --- the checks ---------------------------------------------------------------------------------------


def wait_healthy(stack: Stack) -> str:
    want = {"postgres": 1, "receiver": 1, "ingress": 1, "materializer": 1, "executor": EXECUTORS}

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

    return wait_for("every service healthy", probe, 180, every_s=1)


def check_hardening(stack: Stack) -> str:
    """Every connector container runs as uid 10001 with a read-only root filesystem, and the
    image's own HEALTHCHECK (``connector-healthcheck auto``) finds each one healthy."""
    seen, probes = [], []
    for service in ("ingress", "materializer", "executor"):
        for c in stack.containers(service):
            name = c["Names"][0]
            info = stack.inspect(name)
            user, read_only = info["Config"].get("User"), info["HostConfig"].get("ReadonlyRootfs")
            if user != "10001:10001" or read_only is not True:
                raise SmokeError(f"{name}: user {user!r}, read-only root {read_only!r}")
            probe = stack.podman("exec", name, "connector-healthcheck", "auto").strip()
            if not probe.startswith("healthy: ") or "no service probe" in probe:
                raise SmokeError(f"{name}: the image's health check said {probe!r}")
            seen.append(name)
            probes.append(f"{service}: {probe.removeprefix('healthy: ')}")
    return (
        f"{len(seen)} connector containers run as 10001:10001 with a read-only root filesystem;"
        f" image HEALTHCHECK (auto) healthy in each ({', '.join(sorted(set(probes)))})"
    )


def revision_mismatches(rows: list[list[str]], expected: str) -> list[str]:
    """``service: revision`` of every registered process (``connector_process``) not running
    ``expected`` (issue #28 item 7: the running revision is the image's build revision)."""
    return [f"{service}: {revision or '(none)'}" for service, revision in rows if revision != expected]


def check_revision(stack: Stack, expected: str) -> str:
    """Every registered connector process reports the revision the image was built from (the build
    argument REVISION -> CONNECTOR_BUILD_REVISION -> connector_process.revision and
    connector_build_info{revision})."""
    if not expected or expected == "unknown":
        raise SmokeError(
            "SMOKE_BUILD_REVISION is not set: scripts/compose-smoke.sh passes the image's revision"
        )

    def registered() -> list[list[str]] | None:
        rows = stack.psql("SELECT service, revision FROM connector_process ORDER BY service, process_id")
        services = {r[0] for r in rows}
        return rows if {"ingress", "materializer", "executor"} <= services else None

    rows = wait_for("every service registered", registered, 60)
    wrong = revision_mismatches(rows, expected)
    if wrong:
        raise SmokeError(f"processes not running the image's revision {expected[:12]}: {', '.join(wrong)}")
    return f"{len(rows)} processes run revision {expected[:12]} (the image's build revision)"


def apply_pack(stack: Stack, operator_token: str) -> None:
    out = stack.compose(
        "run",
        "--rm",
        "-T",
        "admin",
        "admin",
        "packs",
        "apply",
        "-",
        "--activate",
        stdin=PACK.read_bytes(),
        token=operator_token,
    )
    if "is active" not in out and "active generation 1" not in out:
        raise SmokeError(f"pack apply did not activate the smoke pack: {out.strip()}")


def post_delivery(base: str, key: str, payload: dict[str, Any]) -> tuple[str, int]:
    msg_id = f"msg_{uuid.uuid4().hex}"
    body = json.dumps(payload)
    now = datetime.now(tz=UTC)
    signature = Webhook(key).sign(msg_id, now, body)
    status, _ = http(
        "POST",
        f"{base}/v1/webhooks/smoke/events",
        body.encode(),
        {
            "content-type": "application/json",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(now.timestamp())),
            "webhook-signature": signature,
        },
    )
    return msg_id, int(status)


def work_items(stack: Stack, msg_ids: list[str]) -> dict[str, tuple[int, str, int]]:
    """provider delivery id -> (work id, state, attempts), from the database (via psql in the
    postgres container)."""
    ids = ",".join(f"'{m}'" for m in msg_ids)  # our own uuid-based ids, no quoting issue
    rows = stack.psql(
        "SELECT r.provider_delivery_id, w.work_id, w.state, w.attempts FROM connector_ingress_receipt r"
        " JOIN connector_event e ON e.receipt_id = r.receipt_id"
        " JOIN connector_work_item w ON w.event_id = e.event_id"
        f" WHERE r.namespace = 'smoke' AND r.provider_delivery_id IN ({ids})"
    )
    return {r[0]: (int(r[1]), r[2], int(r[3])) for r in rows}


def receiver_calls(receiver: str) -> list[dict[str, Any]]:
    status, body = http("GET", f"{receiver}/calls")
    if status != 200:
        raise SmokeError(f"receiver answered {status}")
    return list(json.loads(body)["calls"])


def check_signed_delivery(stack: Stack, ingress: str, receiver: str, key: str) -> str:
    # The route table refreshes on NOTIFY after the pack apply: wait until the route answers.
    def accepted() -> tuple[str, int] | None:
        msg_id, status = post_delivery(ingress, key, {"type": "smoke.created", "data": {"id": "first"}})
        return (msg_id, status) if 200 <= status < 300 else None

    msg_id, status = wait_for("the smoke route to accept a signed delivery", accepted, 60)
    work_id, state, attempts = wait_for(
        "the signed delivery to be executed",
        lambda: (lambda r: r if r and r[1] == "succeeded" else None)(work_items(stack, [msg_id]).get(msg_id)),
        90,
    )
    calls = [c for c in receiver_calls(receiver) if c["work_id"] == work_id and c["status"] == 200]
    if not calls:
        raise SmokeError(f"work item {work_id} succeeded but the receiver saw no successful call")
    # Control: another key's signature is refused before any write.
    wrong = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    bad_id, bad_status = post_delivery(ingress, wrong, {"type": "smoke.created", "data": {"id": "forged"}})
    if bad_status != 401:
        raise SmokeError(f"a delivery signed with another key answered {bad_status}, expected 401")
    if stack.psql(f"SELECT 1 FROM connector_ingress_receipt WHERE provider_delivery_id = '{bad_id}'"):
        raise SmokeError("the refused delivery wrote a receipt")
    return (
        f"HTTP {status} from ingress; work item {work_id} {state} after {attempts} attempt(s); receiver saw"
        f" {len(calls)} successful call(s) (idempotency key {calls[0]['idempotency_key']}); control: another"
        f" key's signature -> HTTP {bad_status}, no receipt"
    )


def check_prometheus(stack: Stack, prometheus: str) -> str:
    executor_ips = sorted(stack.ip_of(c["Names"][0]) for c in stack.containers("executor"))
    if len(executor_ips) != EXECUTORS:
        raise SmokeError(f"expected {EXECUTORS} executor containers, found {len(executor_ips)}")

    def probe() -> list[tuple[str, str, str]] | None:
        query = urllib.parse.urlencode({"query": "up"})
        status, body = http("GET", f"{prometheus}/api/v1/query?{query}")
        if status != 200:
            return None
        result = json.loads(body)["data"]["result"]
        rows = sorted((r["metric"]["job"], r["metric"]["instance"], r["value"][1]) for r in result)
        jobs = [r[0] for r in rows]
        if (
            jobs.count("ingress") != 1
            or jobs.count("materializer") != 1
            or jobs.count("executor") != EXECUTORS
        ):
            return None
        if any(value != "1" for _, _, value in rows):
            return None
        scraped = sorted(instance.rsplit(":", 1)[0] for job, instance, _ in rows if job == "executor")
        return rows if scraped == executor_ips else None

    rows = wait_for("Prometheus to report up == 1 for every target", probe, 90, every_s=2)
    status, body = http("GET", f"{prometheus}/api/v1/rules")
    groups = json.loads(body)["data"]["groups"] if status == 200 else []
    alerts = sum(1 for g in groups for r in g["rules"] if r["type"] == "alerting")
    if not alerts:
        raise SmokeError(f"Prometheus loaded no alerting rules (GET /api/v1/rules: {status})")
    up = "; ".join(f"up{{job={job},instance={inst}}} = {value}" for job, inst, value in rows)
    return f"{up}; {len(groups)} rule groups, {alerts} alerts loaded"


def check_admin_stats(stack: Stack, view_token: str) -> str:
    out = stack.compose(
        "run", "--rm", "-T", "admin", "admin", "stats", "--json", quiet=True, token=view_token
    )
    data = json.loads(out[out.index("{") :])
    claimants = int(data.get("active_claimants", 0))
    if claimants != EXECUTORS:
        raise SmokeError(f"admin stats reports {claimants} active claimants, expected {EXECUTORS}")
    queues = data.get("queues", [])
    # Control: without a token the admin API refuses.
    denied = stack.compose("run", "--rm", "-T", "admin", "admin", "stats", check=False, quiet=True)
    if "UNAUTHENTICATED" not in denied:
        raise SmokeError(f"admin stats without a token was not refused: {denied.strip()[-300:]}")
    smoke = [q for q in queues if q.get("pack_name") == "smoke" and not q.get("queue_class")]
    depth = smoke[0].get("depth_by_state", {}) if smoke else {}
    return (
        f"admin stats from a separate container (token, role ViewConnectorEvents): {claimants} active"
        f" claimants, smoke pack depth {json.dumps(depth, sort_keys=True)}; control: no token ->"
        " UNAUTHENTICATED"
    )


def check_kill(stack: Stack, ingress: str, receiver: str, key: str) -> str:
    msg_ids = []
    for i in range(HELD_ITEMS):
        msg_id, status = post_delivery(
            ingress, key, {"type": "smoke.slow", "hold": True, "data": {"id": f"held-{i}"}}
        )
        if not 200 <= status < 300:
            raise SmokeError(f"held delivery {i} answered {status}")
        msg_ids.append(msg_id)
    items = wait_for(
        "every held delivery to have a work item",
        lambda: (lambda w: w if len(w) == HELD_ITEMS else None)(work_items(stack, msg_ids)),
        60,
    )
    work_ids = {w[0] for w in items.values()}

    def all_held() -> list[dict[str, Any]] | None:
        held = [c for c in receiver_calls(receiver) if c["held"] and c["work_id"] in work_ids]
        return held if {c["work_id"] for c in held} == work_ids else None

    held = wait_for(f"all {HELD_ITEMS} items to be in flight (held by the receiver)", all_held, 60)
    by_ip: dict[str, set[int]] = {}
    for c in held:
        by_ip.setdefault(c["peer"], set()).add(c["work_id"])
    names = {stack.ip_of(c["Names"][0]): c["Names"][0] for c in stack.containers("executor")}
    victim_ip = max(by_ip, key=lambda ip: len(by_ip[ip]))
    victim, lost = names[victim_ip], by_ip[victim_ip]
    spread = ", ".join(f"{names.get(ip, ip)}: {len(ids)}" for ip, ids in sorted(by_ip.items()))
    # The database agrees: the victim's items are processing under a lease of the victim's process
    # (connector_process.hostname is the container's hostname, its short id).
    victim_host = str(stack.inspect(victim)["Config"]["Hostname"])
    ids = ",".join(str(w) for w in sorted(lost))
    leased = stack.psql(
        "SELECT w.work_id, w.state, p.hostname FROM connector_work_item w"
        f" JOIN connector_process p ON p.process_id = w.lease_owner WHERE w.work_id IN ({ids})"
    )
    expected = [(w, "processing", victim_host) for w in sorted(lost)]
    if sorted((int(r[0]), r[1], r[2]) for r in leased) != expected:
        raise SmokeError(f"the victim's items are not all processing under its lease: {leased}")
    say(f"in flight at the kill: {spread}; killing {victim} (SIGKILL)")
    stack.podman("kill", victim)
    http("POST", f"{receiver}/release", b"")
    started = time.monotonic()
    final = wait_for(
        "every held item to succeed",
        lambda: (lambda w: w if all(v[1] == "succeeded" for v in w.values()) else None)(
            work_items(stack, msg_ids)
        ),
        120,
        every_s=1,
    )
    took = time.monotonic() - started
    calls = receiver_calls(receiver)
    reclaimed = {
        wid
        for wid in lost
        if any(c["work_id"] == wid and c["attempt"] >= 2 and c["status"] == 200 for c in calls)
    }
    if reclaimed != lost:
        raise SmokeError(f"items held by the killed executor not re-executed: {sorted(lost - reclaimed)}")
    survivors = {c["peer"] for c in calls if c["work_id"] in lost and c["attempt"] >= 2}
    if victim_ip in survivors and stack.ip_of(victim) != victim_ip:
        raise SmokeError("a re-execution came from the killed container's old address")
    attempts = sorted(v[2] for v in final.values())
    restarted = stack.inspect(victim)["State"].get("Running", False)
    return (
        f"{len(lost)} of {HELD_ITEMS} in-flight items were held by {victim} when it was killed; all"
        f" {HELD_ITEMS} succeeded {took:.1f}s after the kill (lease 15 s); the {len(lost)} lost ones"
        f" were re-executed (attempt 2) by {', '.join(sorted(names.get(ip, ip) for ip in survivors))};"
        f" attempts per item {attempts}; killed container restarted by its policy: {restarted}"
    )


# --- main ---------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", default="connector-smoke")
    parser.add_argument("--keep", action="store_true", help="leave the stack up (no down -v)")
    args = parser.parse_args(argv)
    if shutil.which("docker-compose") is None or shutil.which("podman") is None:
        say("docker-compose and podman are needed (scripts/compose-smoke.sh installs them)")
        return 2

    key = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    operator, viewer = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    ports = {name: free_port() for name in ("ingress", "prometheus", "receiver")}
    env = dict(os.environ)
    env.update(
        SMOKE_WEBHOOK_SECRET=key,
        CONNECTOR_ADMIN_TOKENS=f"{operator}=ConnectorOperator;{viewer}=ViewConnectorEvents",
        CONNECTOR_INGRESS_PUBLISH=f"127.0.0.1:{ports['ingress']}",
        CONNECTOR_PROMETHEUS_PUBLISH=f"127.0.0.1:{ports['prometheus']}",
        SMOKE_RECEIVER_PUBLISH=f"127.0.0.1:{ports['receiver']}",
        COMPOSE_HTTP_TIMEOUT="300",
    )
    stack = Stack(args.project, env)
    ingress = f"http://127.0.0.1:{ports['ingress']}"
    prometheus = f"http://127.0.0.1:{ports['prometheus']}"
    receiver = f"http://127.0.0.1:{ports['receiver']}"
    phases = Phases()
    observed: list[tuple[str, str]] = []
    ticker = HealthTicker(stack) if HealthTicker.needed() else None
    ok = False
    try:
        stack.compose("down", "-v", "--remove-orphans", check=False, quiet=True)
        if ticker:
            say("no systemd: running the containers' health checks from this script (podman healthcheck run)")
            ticker.start()
        with phases.phase("up (--scale executor=3) until healthy"):
            stack.compose("up", "-d", "--no-build", "--scale", f"executor={EXECUTORS}")
            observed.append(("stack healthy", wait_healthy(stack)))
            observed.append(("hardening", check_hardening(stack)))
            observed.append(("revision", check_revision(stack, os.environ.get("SMOKE_BUILD_REVISION", ""))))
        with phases.phase("pack apply (admin API, operator token)"):
            apply_pack(stack, operator)
        with phases.phase("signed delivery executed"):
            observed.append(("signed delivery", check_signed_delivery(stack, ingress, receiver, key)))
        with phases.phase("prometheus up == 1 for every target"):
            observed.append(("prometheus", check_prometheus(stack, prometheus)))
        with phases.phase("connector admin stats from another container"):
            observed.append(("admin stats", check_admin_stats(stack, viewer)))
        with phases.phase("kill one executor, nothing lost"):
            observed.append(("executor kill", check_kill(stack, ingress, receiver, key)))
        ok = True
    except SmokeError as exc:
        say(f"FAILED: {exc}")
        with contextlib.suppress(SmokeError, subprocess.SubprocessError):
            for c in stack.containers(all_states=True):
                say(f"  {c['Names'][0]}: {c.get('Status')}")
            for service in ("migrate", "ingress", "materializer", "executor", "prometheus"):
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
