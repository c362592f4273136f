"""The failover harness (issue #26 item 6): a private primary + streaming standby on loopback
(``tests.support.pgpair.PgPair``: initdb, ``pg_basebackup -R``, ``pg_ctl promote``), a TCP proxy per
(service, server) (``tests.failover.proxy``: pass / reset / black-hole), the real services as real
processes (``connector ingress``, ``materializer``, two ``executor``s) given the libpq multi-host URL
through their proxies, signed load through the ingress's HTTP port (Standard Webhooks, signed with
the ``standardwebhooks`` library), and a ledger: every request and its answer (what was acked), every
effect in the fencing sink (``tests.failover.sink``: marker, key, work id, token, attempt), every
row that became ``succeeded`` under which token (a trigger), and what the final primary holds.

Waits are on state (rows, acks, effects), never on speed; a failed wait says what is unfinished.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import standardwebhooks

from tests.failover import proxy as proxy_mod
from tests.support.pgpair import PgPair

ROOT = Path(__file__).resolve().parents[2]
CONNECTOR = str(Path(sys.executable).with_name("connector"))
NAMESPACE = "failover"
ROUTE = "events"
SECRET_ENV = "CONNECTOR_FAILOVER_WEBHOOK_SECRET"
SERVICES = ("ingress", "materializer", "executor-a", "executor-b")

# A row that becomes succeeded: under which token, for which delivery (its event's marker).
SUCCEEDED_LOG = """
CREATE TABLE test_succeeded_under (
  work_id bigint, token bigint, marker text, at timestamptz DEFAULT clock_timestamp());
CREATE FUNCTION test_succeeded_under() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO test_succeeded_under (work_id, token, marker)
  SELECT NEW.work_id, OLD.lease_token, e.source_object_id FROM connector_event e
  WHERE e.event_id = NEW.event_id;
  RETURN NEW;
END $$;
CREATE TRIGGER test_succeeded_under AFTER UPDATE OF state ON connector_work_item FOR EACH ROW
  WHEN (OLD.state = 'processing' AND NEW.state = 'succeeded') EXECUTE FUNCTION test_succeeded_under();
CREATE TABLE test_lease (work_id bigint, token bigint, until timestamptz);
CREATE FUNCTION test_lease() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO test_lease VALUES (NEW.work_id, NEW.lease_token, NEW.lease_until); RETURN NEW;
END $$;
CREATE TRIGGER test_lease AFTER UPDATE OF lease_until ON connector_work_item FOR EACH ROW
  WHEN (NEW.state = 'processing') EXECUTE FUNCTION test_lease();
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    check: Callable[[], Any], timeout: float, what: Callable[[], str] | str, every: float = 0.1
) -> Any:
    """Poll ``check`` until truthy; on timeout fail with ``what`` (a callable: the state then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout:.0f} s: {what() if callable(what) else what}")
        time.sleep(every)


def load_figure() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f} on {os.cpu_count()} cores"


# -- proxies -----------------------------------------------------------------------------------------


class Proxies:
    """One ``tests.failover.proxy`` process holding every listener."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.failover.proxy"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        self.ports: list[int] = []
        self.modes: dict[int, str] = {}
        self._lock = threading.Lock()

    def _ask(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"proxy: {line!r} -> {answer or 'no answer (proxy exited?)'}")
        return answer

    def listen(self, target_port: int) -> int:
        port = int(self._ask(f"listen {target_port}").split()[1])
        self.ports.append(port)
        self.modes[port] = "pass"
        return port

    def mode(self, ports: list[int], mode: str) -> None:
        for port in ports:
            self._ask(f"mode {port} {mode}")
            self.modes[port] = mode

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._ask("quit")
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        for port in self.ports:  # never leave a DROP rule behind (the proxy may have been killed)
            if self.modes.get(port) == "blackhole":
                with contextlib.suppress(Exception):
                    proxy_mod.drop_off(port)


# -- load ----------------------------------------------------------------------------------------------


@dataclass
class Request:
    msg_id: str
    start: float
    end: float = 0.0
    status: int = 0  # 0: no HTTP answer (connection failed or the client's timeout)
    error: str = ""


class Load:
    """Signed deliveries at ``rate`` per second over ``clients`` keep-alive connections, in a thread
    (its own event loop). Every request is kept: what was acked is the ledger's ``acked``."""

    def __init__(
        self, port: int, secret: str, *, rate: float = 60.0, clients: int = 6, timeout_s: float = 30.0
    ):
        self.port = port
        self.signer = standardwebhooks.Webhook(secret)
        self.rate = rate
        self.clients = clients
        self.timeout_s = timeout_s
        self.requests: list[Request] = []
        self.run = os.urandom(3).hex()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._seq = 0

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout_s + 10)

    def _signed(self, msg_id: str) -> bytes:
        body = json.dumps({"type": "failover.test", "id": msg_id, "sent": time.time()}).encode()
        now = int(time.time())  # one instant for the signature and its header
        sig = self.signer.sign(msg_id, dt.datetime.fromtimestamp(now, tz=dt.UTC), body.decode())
        head = (
            f"POST /v1/webhooks/{NAMESPACE}/{ROUTE} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"webhook-id: {msg_id}\r\nwebhook-timestamp: {now}\r\n"
            f"webhook-signature: {sig}\r\n\r\n"
        )
        return head.encode() + body

    async def _client(self, n: int, started: float) -> None:
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        while not self._stop.is_set():
            self._seq += 1
            seq = self._seq  # this request's own number: others advance ``_seq`` while it sleeps
            due = started + seq / self.rate
            if (wait := due - time.time()) > 0:
                await asyncio.sleep(wait)
            req = Request(f"fo_{self.run}_{seq}", time.time())
            self.requests.append(req)
            try:
                if writer is None:
                    reader, writer = await asyncio.wait_for(
                        asyncio.open_connection("127.0.0.1", self.port), self.timeout_s
                    )
                assert reader is not None
                writer.write(self._signed(req.msg_id))
                req.status = await asyncio.wait_for(_read_status(reader), self.timeout_s)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as exc:
                req.error = type(exc).__name__
                if writer is not None:
                    writer.transport.abort()
                reader = writer = None
                await asyncio.sleep(0.05)
            req.end = time.time()
        if writer is not None:
            writer.transport.abort()

    async def _main(self) -> None:
        started = time.time()
        await asyncio.gather(*(self._client(i, started) for i in range(self.clients)))

    # figures
    def done(self) -> list[Request]:
        return [r for r in self.requests if r.end]

    def acked(self) -> set[str]:
        return {r.msg_id for r in self.requests if r.status == 200}

    def statuses(self) -> dict[str, int]:
        return dict(Counter(str(r.status or r.error) for r in self.done()))

    def sent_after(self, t: float) -> set[str]:
        return {r.msg_id for r in self.requests if r.start >= t}

    def first_ack_after(self, t: float) -> float | None:
        ends = [r.end for r in self.requests if r.status == 200 and r.start >= t]
        return min(ends) if ends else None

    def longest(self, since: float = 0.0) -> float:
        return max((r.end - r.start for r in self.done() if r.start >= since), default=0.0)


async def _read_status(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return int(head[9:12])


# -- the cluster: servers, proxies, services ---------------------------------------------------------


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    proxies: list[int]  # [to the first primary, to the first standby]
    metrics_port: int

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def metric(self, name: str) -> float | None:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=3) as r:
                text = r.read().decode()
        except OSError:
            return None
        total, seen = 0.0, False
        for line in text.splitlines():
            if line.startswith(name) and (line[len(name)] in " {"):
                total += float(line.rpartition(" ")[2])
                seen = True
        return total if seen else None


@dataclass
class Cluster:
    """Everything of one scenario; ``start()`` returns once a first delivery went end to end."""

    synchronous: bool = True
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every service
    replication_proxy: bool = False
    lease_s: float = 5.0
    patroni: bool = False  # the servers managed by Patroni + etcd (tests/failover/patroni.py)
    only: tuple[str, ...] = SERVICES  # a control may start the ingress alone

    def __post_init__(self) -> None:
        self.pair: Any
        if self.patroni:
            from tests.failover.patroni import PatroniPair

            self.pair = PatroniPair()
        else:
            self.pair = PgPair(synchronous=self.synchronous, replication_proxy=self.replication_proxy)
        self.proxies: Proxies | None = None
        self.services: dict[str, Service] = {}
        self.secret = "whsec_" + __import__("base64").b64encode(os.urandom(24)).decode()
        self.http_port = 0
        self.load: Load | None = None
        self.sink: Path | None = None
        self.faults: list[tuple[str, float]] = []
        self.notes: dict[str, Any] = {}  # a scenario's own figures (Patroni's promotion time)

    # lifecycle
    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def phase(self, name: str) -> None:
        """Seconds since the start, per phase (printed with the figures: where a slow run spent it)."""
        self.notes.setdefault("phases_s", {})[name] = round(time.monotonic() - self._t0, 1)

    def start(self) -> Cluster:
        from connector.common.store.migrate import upgrade

        self._t0 = time.monotonic()
        self.pair.start()
        self.phase("servers")
        scratch = self.pair.scratch()
        self.sink = scratch / "sink.jsonl"
        primary = self.pair.direct(self.pair.ports[0])
        upgrade(primary)
        os.environ[SECRET_ENV] = self.secret  # the pack apply checks that the reference resolves
        asyncio.run(_install(primary))
        with psycopg.connect(primary, autocommit=True) as db:
            db.execute(SUCCEEDED_LOG)
        self.proxies = Proxies()
        self.http_port = free_port()
        self.phase("schema")
        for name in self.only:
            self._spawn(name, scratch)
        self.wait_serving()
        self.phase("serving")
        return self

    def _spawn(self, name: str, scratch: Path) -> None:
        assert self.proxies is not None
        ports = [self.proxies.listen(p) for p in self.pair.ports]
        hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
        metrics = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
        env.update(
            {
                "CONNECTOR_DATABASE_URL": f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write",
                "CONNECTOR_LOG_LEVEL": "INFO",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                SECRET_ENV: self.secret,
                "FAILOVER_SINK": str(self.sink),
                "CONNECTOR_INGRESS_FIGURES_FLUSH_S": "0",
                "CONNECTOR_EXECUTOR_FIGURES_FLUSH_S": "0",
                "CONNECTOR_EXECUTOR_LEASE_S": str(self.lease_s),
                # a receipt claim lost with its connection expires after this (default 30 s)
                "CONNECTOR_MATERIALIZER_LEASE_S": str(self.lease_s),
                "CONNECTOR_EXECUTOR_RECLAIM_INTERVAL_S": "1",
                "CONNECTOR_EXECUTOR_POLL_INTERVAL_S": "0.2",
                "CONNECTOR_EXECUTOR_SHUTDOWN_GRACE_S": "2",
                "CONNECTOR_EXECUTOR_STATS_INTERVAL_S": "0",
                "CONNECTOR_EXECUTOR_WORKERS": "8",
                "CONNECTOR_EXECUTOR_CLAIM_BATCH": "16",
                # with a synchronous standby, ask for it per receipt batch (#26 item 1); unset: the server's
                **({"CONNECTOR_INGRESS_SYNCHRONOUS_COMMIT": "on"} if self.synchronous else {}),
                **self.env,
            }
        )
        if name == "ingress":
            args = ["ingress", "--http-port", str(self.http_port), "--grpc-port", str(free_port()),
                    "--metrics-port", str(metrics)]  # fmt: skip
        elif name == "materializer":
            env["CONNECTOR_MATERIALIZER_GRPC_PORT"] = str(free_port())
            env["CONNECTOR_MATERIALIZER_METRICS_PORT"] = str(metrics)
            args = ["materializer"]
        else:
            env["CONNECTOR_EXECUTOR_GRPC_PORT"] = "0"
            env["CONNECTOR_EXECUTOR_METRICS_PORT"] = str(metrics)
            args = ["executor", "--no-admin"]
        log = scratch / f"{name}.log"
        proc = subprocess.Popen(
            [CONNECTOR, *args], env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        self.services[name] = Service(name, proc, log, ports, metrics)

    def wait_serving(self) -> None:
        """Until one delivery is acked, materialized and run by each executor."""
        probe = Load(self.http_port, self.secret, rate=20, clients=2).start()
        try:
            executors = {s.proc.pid for n, s in self.services.items() if n.startswith("executor")}
            wait_until(
                lambda: (
                    (self.check_alive() or True)
                    and bool(probe.acked())
                    and {e["pid"] for e in self.effects()} >= executors
                ),
                120,
                lambda: (
                    f"services not serving: {probe.statuses()} {len(self.effects())} effects\n{self.tails()}"
                ),
                every=0.2,
            )
        finally:
            probe.stop()

    def stop(self) -> None:
        if self.load is not None:
            self.load.stop()
        for s in self.services.values():
            if s.proc.poll() is None:
                s.proc.terminate()
        deadline = time.monotonic() + 10  # a service hung on a silent server may not stop: then kill it
        for s in self.services.values():
            try:
                s.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(5)
        if self.proxies is not None:
            self.proxies.stop()
        self.pair.stop()

    # observation
    def check_alive(self) -> None:
        for s in self.services.values():
            if not s.alive():
                raise AssertionError(f"{s.name} exited ({s.proc.returncode}):\n{s.log_tail()}")

    def tails(self, chars: int = 800) -> str:
        return "\n".join(f"--- {s.name}:\n{s.log_tail(chars)}" for s in self.services.values())

    def effects(self) -> list[dict[str, Any]]:
        assert self.sink is not None
        if not self.sink.exists():
            return []
        return [json.loads(line) for line in self.sink.read_text().splitlines() if line.endswith("}")]

    def primary_port(self) -> int:
        """The writable server now (the standby after a promotion)."""
        for port in reversed(self.pair.ports):
            with contextlib.suppress(psycopg.Error):
                if not self.pair.sql(
                    port,
                    "SELECT pg_is_in_recovery() OR current_setting('default_transaction_read_only')::bool",
                )[0][0]:
                    return port
        raise AssertionError("no writable server")

    def db(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.pair.direct(self.primary_port()), autocommit=True, connect_timeout=5)

    # faults (each noted with its wall time)
    def fault(self, name: str) -> float:
        at = time.time()
        self.faults.append((name, at))
        return at

    def proxy_ports(self, services: tuple[str, ...] | None = None, server: int | None = None) -> list[int]:
        """The listeners of ``services`` to server ``server`` (0: the first primary, 1: the first
        standby; None: both)."""
        out = []
        for name in services or tuple(self.services):
            ports = self.services[name].proxies
            out += ports if server is None else [ports[server]]
        return out

    # the end: drain, then the ledger
    def drain(self, acked: set[str], timeout: float = 150.0) -> None:
        """Until every acked delivery's WorkItem is succeeded on the current primary (and nothing
        stored is left unrouted or unfinished)."""

        def state() -> dict[str, Any]:
            with self.db() as db:
                receipts = dict(db.execute(
                    "SELECT router_status, count(*) FROM connector_ingress_receipt"
                    " WHERE namespace = %s GROUP BY 1",
                    (NAMESPACE,)).fetchall())  # fmt: skip
                items = dict(
                    db.execute("SELECT state, count(*) FROM connector_work_item GROUP BY 1").fetchall()
                )
                lease = db.execute(
                    "SELECT min(lease_until) - now(), max(lease_until) - now() FROM connector_work_item"
                    " WHERE state = 'processing'").fetchone()  # fmt: skip
                due = db.execute(
                    "SELECT min(run_after) - now() FROM connector_work_item"
                    " WHERE state IN ('pending', 'retry')"
                ).fetchone()
            return {"receipts": receipts, "items": items, "lease_ends_in": lease, "next_due_in": due}

        def finished() -> bool:
            self.check_alive()
            s = state()
            unfinished = sum(v for k, v in s["items"].items() if k not in ("succeeded", "dead"))
            unrouted = sum(v for k, v in s["receipts"].items() if k != "materialized")
            return unfinished == 0 and unrouted == 0

        wait_until(finished, timeout, lambda: f"not drained: {state()}\n{self.tails()}", every=0.5)
        self.phase("drained")

    def ledger(self) -> Ledger:
        assert self.load is not None
        with self.db() as db:
            stored = {r[0] for r in db.execute(
                "SELECT provider_delivery_id FROM connector_ingress_receipt WHERE namespace = %s",
                (NAMESPACE,))}  # fmt: skip
            succeeded = db.execute("SELECT work_id, token, marker FROM test_succeeded_under").fetchall()
            finished = {r[0] for r in db.execute(
                "SELECT e.source_object_id FROM connector_work_item w JOIN connector_event e USING (event_id)"
                " WHERE w.state = 'succeeded'")}  # fmt: skip
            leases = {
                (r[0], r[1]): float(r[2])
                for r in db.execute(
                    "SELECT work_id, token, extract(epoch FROM max(until)) FROM test_lease GROUP BY 1, 2"
                )
            }
        return Ledger(self.load.acked(), stored, succeeded, finished, self.effects(), leases)


async def _install(url: str) -> None:
    from connector.common.packs import install
    from connector.common.packs.document import parse_manifest

    manifest = {
        "name": "failover-test",
        "namespace": NAMESPACE,
        "work_types": {"effect": {"handler": {"kind": "python", "target": "tests.failover.sink:effect"}}},
        "routes": [
            {
                "key": ROUTE,
                "verification": {"preset": "standard-webhooks", "secrets": [{"env": SECRET_ENV}]},
                "idempotency_header": "webhook-id",
                "extract": {"event_kind": {"pointer": "/type"}, "source_object_id": {"pointer": "/id"}},
                "fan_out": [{"work_type": "effect"}],
            }
        ],
    }
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await install.pack_apply(conn, parse_manifest(manifest), activate=True, actor="failover-test")


# -- the ledger ----------------------------------------------------------------------------------------


@dataclass
class Ledger:
    acked: set[str]
    stored: set[str]
    succeeded: list[tuple[int, int, str]]  # (work_id, token, marker) each time a row became succeeded
    finished: set[str]  # markers whose WorkItem is succeeded on the final primary
    effects: list[dict[str, Any]]
    leases: dict[tuple[int, int], float]  # (work id, token) -> the last lease end the database granted

    def after_lease(self) -> list[tuple[int, float]]:
        """Effects made after their lease had ended by the database's clock: (work id, seconds late)."""
        out = []
        for e in self.effects:
            until = self.leases.get((e["work_id"], e["token"]))
            if until is not None and e["wall"] > until:
                out.append((e["work_id"], round(e["wall"] - until, 3)))
        return out

    @property
    def lost(self) -> set[str]:
        """Acked, and not on the final primary."""
        return self.acked - self.stored

    def fence(self) -> dict[str, int]:
        """The token fence over the sink, in the sink's order: per delivery, an effect under a lower
        token than one already applied is refused (``fenced``); a second effect under the same token
        is a duplicate the fence cannot refuse (``unfenced``); under a higher token it is a
        re-execution after a lease was lost (applied; the key lets the target deduplicate)."""
        best: dict[str, int] = {}
        seen: set[tuple[str, int]] = set()
        out = Counter(applied=0, fenced=0, unfenced=0, reexecuted=0)
        for e in self.effects:
            m, t = e["marker"], e["token"]
            if (m, t) in seen:
                out["unfenced"] += 1
            elif m in best and t < best[m]:
                out["fenced"] += 1
            else:
                out["reexecuted" if m in best else "applied"] += 1
                best[m] = t
            seen.add((m, t))
        return dict(out)

    def succeeded_without_running(self) -> list[tuple[int, int, str]]:
        ran = {(e["marker"], e["token"]) for e in self.effects}
        return [row for row in self.succeeded if (row[2], row[1]) not in ran]

    def collisions(self) -> dict[str, list[Any]]:
        """An idempotency key or a (work id, token) naming two deliveries."""
        by_key: dict[str, set[str]] = defaultdict(set)
        by_token: dict[tuple[int, int], set[str]] = defaultdict(set)
        for e in self.effects:
            by_key[e["key"]].add(e["marker"])
            by_token[(e["work_id"], e["token"])].add(e["marker"])
        return {
            "keys": [k for k, v in by_key.items() if len(v) > 1],
            "tokens": [k for k, v in by_token.items() if len(v) > 1],
        }

    def unrun(self) -> set[str]:
        """Acked and stored, but with no effect in the sink or not succeeded."""
        ran = {e["marker"] for e in self.effects}
        return {m for m in self.acked & self.stored if m not in ran or m not in self.finished}


@contextlib.contextmanager
def figures_file() -> Iterator[Path | None]:
    """``CONNECTOR_FAILOVER_FIGURES``: a JSON-lines file the scenarios append their figures to."""
    path = os.environ.get("CONNECTOR_FAILOVER_FIGURES")
    yield Path(path) if path else None
