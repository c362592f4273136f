"""Two PostgreSQL servers managed by a real HA engine: Debian's ``patroni`` (3.0.2) with one ``etcd``
(3.4, v3 API), all on loopback and free ports, run as the ``postgres`` user in a folder outside
pytest's base temp. Synchronous mode (a commit is acknowledged only once the synchronous standby
has it; Patroni manages ``synchronous_standby_names``), not strict: with two nodes, strict mode leaves
the promoted leader alone and unable to commit anything (tried: every delivery answered 503
``commit_deadline`` after the promotion) — a third node is what strict mode needs. The same face as
``tests.support.pgpair.PgPair`` where ``tests.failover.harness.Cluster`` uses it (``ports``,
``direct``, ``sql``, ``scratch``), and ``kill_leader_node()``: kill -9 of the leader's Patroni *and*
PostgreSQL (a whole node crash); Patroni's standby promotes itself once the leader key expires.

Timing: ``ttl: 10``, ``loop_wait: 1``, ``retry_timeout: 3`` (Patroni's defaults are 30/10/10 — a
failover in ~30-40 s; 3.0.2 enforces no minimum ttl; ``loop_wait + 2 * retry_timeout <= ttl``).
Needs ``scripts/install-failover.sh`` (the test skips, saying so, when patroni or etcd is missing).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.pgcluster import pg_bin
from tests.failover.harness import free_port

PATRONI = "/usr/bin/patroni"
ETCD = "/usr/bin/etcd"


def available() -> str | None:
    """None when Patroni and etcd can run here, else why not."""
    for path in (PATRONI, ETCD):
        if not Path(path).exists():
            return f"{path} missing: run scripts/install-failover.sh (Debian's patroni and etcd-server)"
    return None


class PatroniPair:
    def __init__(self, ttl: int = 10) -> None:
        self.ttl = ttl
        self.root = Path(tempfile.mkdtemp(prefix="connector-patroni-"))
        self.root.chmod(0o755)
        self.etcd_port = free_port()
        self.etcd_peer = free_port()
        self.names = ["pg0", "pg1"]
        self.ports = [free_port(), free_port()]  # in URL order: the first leader first
        self.rest = [free_port(), free_port()]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.replication = None  # the face of PgPair (no replication proxy here)
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    # -- lifecycle ---------------------------------------------------------------------------

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(path, user.pw_uid, user.pw_gid)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [*self._as, *args], stdout=log, stderr=subprocess.STDOUT, cwd=self.root
        )

    def start(self) -> PatroniPair:
        self._chown(self.root)
        etcd_data = self.root / "etcd"
        etcd_data.mkdir(mode=0o700)
        self._chown(etcd_data)
        peer = f"http://127.0.0.1:{self.etcd_peer}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn("etcd", [ETCD, "--name", "etcd0", "--data-dir", str(etcd_data),
                             "--listen-client-urls", client, "--advertise-client-urls", client,
                             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                             "--initial-cluster", f"etcd0={peer}", "--initial-cluster-state", "new",
                             "--log-level", "warn"])  # fmt: skip
        self._wait(lambda: self._http(f"{client}/health"), 30, "etcd healthy")
        for i in range(2):
            self._write_config(i)
        self._spawn("pg0", [PATRONI, str(self.root / "pg0.yml")])
        self._wait(lambda: self.writable(self.ports[0]), 90, "pg0 bootstrapped as the leader")
        self._spawn("pg1", [PATRONI, str(self.root / "pg1.yml")])
        # Patroni's view, not only the server's: in synchronous mode only the member recorded in the
        # DCS as the synchronous standby may be promoted (``synchronous_standby_names`` is ``*`` until then).
        self._wait(lambda: self.role("pg1") == "sync_standby", 120, "pg1 recorded as the synchronous standby")
        return self

    def role(self, name: str) -> str | None:
        """A member's role in Patroni's ``GET /cluster`` (``leader``, ``sync_standby``, ``replica``)."""
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"http://127.0.0.1:{self.rest[1]}/cluster", timeout=2) as r:
                for member in json.load(r).get("members", []):
                    if member.get("name") == name:
                        return str(member.get("role"))
        return None

    def _write_config(self, i: int) -> None:
        name = self.names[i]
        node = self.root / name
        node.mkdir(mode=0o700)
        self._chown(node)
        config: dict[str, Any] = {
            "scope": "connector-failover",
            "name": name,
            "log": {"level": "WARNING"},
            "restapi": {
                "listen": f"127.0.0.1:{self.rest[i]}",
                "connect_address": f"127.0.0.1:{self.rest[i]}",
            },
            "etcd3": {"hosts": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": self.ttl,
                    "loop_wait": 1,
                    "retry_timeout": 3,
                    "synchronous_mode": True,
                    "synchronous_mode_strict": False,  # strict: a lone new leader accepts no commit at all
                    "postgresql": {
                        "use_pg_rewind": False,
                        "parameters": {
                            "wal_level": "replica",
                            "max_wal_senders": 10,
                            "max_replication_slots": 10,
                            "max_connections": 200,
                            "fsync": "off",
                            "wal_keep_size": "256MB",
                            "hot_standby": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.ports[i]}",
                "connect_address": f"127.0.0.1:{self.ports[i]}",
                "data_dir": str(node / "data"),
                "bin_dir": str(pg_bin()),
                "pgpass": str(node / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                },
                "parameters": {"unix_socket_directories": str(node)},
            },
            "tags": {},
        }
        path = self.root / f"{name}.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        self._chown(path)

    def stop(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None and name != "etcd":
                self._kill_tree(proc, signal.SIGTERM)
        for name, proc in self.procs.items():
            if name != "etcd":
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(20)
        for name in self.names:  # PostgreSQL left behind by a killed Patroni
            self._kill_postmaster(name)
        for proc in self.procs.values():
            if proc.poll() is None:
                self._kill_tree(proc, signal.SIGKILL)
                proc.wait(10)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PatroniPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _http(url: str) -> bool:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        return False

    def _wait(self, check: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                logs = "\n".join(
                    f"--- {p.name}:\n{p.read_text(errors='replace')[-1500:]}" for p in self.root.glob("*.log")
                )
                raise AssertionError(f"patroni: {what}: not after {timeout:.0f} s\n{logs}")
            time.sleep(0.2)

    def direct(self, port: int, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/{dbname}"

    def sql(self, port: int, statement: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        with psycopg.connect(self.direct(port, dbname), autocommit=True, connect_timeout=3) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def _sql_or_none(self, port: int, statement: str) -> list[tuple[object, ...]] | None:
        try:
            return self.sql(port, statement)
        except psycopg.Error:
            return None

    def writable(self, port: int) -> bool:
        rows = self._sql_or_none(port, "SELECT NOT pg_is_in_recovery()")
        return bool(rows and rows[0][0])

    def scratch(self) -> Path:
        path = self.root / "scratch"
        path.mkdir(exist_ok=True)
        path.chmod(0o777)
        return path

    # -- faults ------------------------------------------------------------------------------

    def _kill_tree(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        import psutil

        with contextlib.suppress(psutil.NoSuchProcess):
            parent = psutil.Process(proc.pid)
            for child in parent.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.send_signal(sig)
            parent.send_signal(sig)

    def _kill_postmaster(self, name: str) -> None:
        pidfile = self.root / name / "data" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
            subprocess.run(["pkill", "-9", "-P", str(pid)], capture_output=True)

    def kill_leader_node(self) -> None:
        """kill -9 of pg0's Patroni and its PostgreSQL (postmaster and backends): the node is gone."""
        self._kill_tree(self.procs["pg0"], signal.SIGKILL)
        self._kill_postmaster("pg0")

    def wait_promoted(self, timeout: float = 60.0) -> float:
        """Until pg1 accepts writes; returns that instant (wall clock)."""
        self._wait(lambda: self.writable(self.ports[1]), timeout, "pg1 promoted by Patroni")
        return time.time()
