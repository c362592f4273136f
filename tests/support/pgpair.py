"""A primary and a streaming standby on loopback, private to one test (never the shared 5432
server): ``initdb`` of the primary (``benchmarks.pgcluster.PrivateCluster``), the standby made by
``pg_basebackup -R`` and started on its own port. Failover is driven by the test itself:
``kill_primary()`` (kill -9 of the postmaster: its sockets reset, a loud failure), ``promote()``
(``pg_ctl promote``), ``synchronous(True)`` (``synchronous_standby_names`` names the standby and a
reload), ``demote_old_primary()`` (the old primary's data replaced by a fresh base backup of the new
primary and started as its standby, on its old port: the "old primary back as a standby" case).

Why not Patroni here: Debian's patroni 3.0.2 + etcd-server 3.4 install and run on this machine
(as ``postgres``: PostgreSQL refuses root), with ``synchronous_mode_strict``; but after the leader's
whole node is killed (Patroni and PostgreSQL, kill -9) the standby became writable only after
19.4 s (``ttl: 20``, ``loop_wait: 2``; Patroni's default ttl is 30 s): a test's "serving again
within 15 s of the fault" would measure Patroni's leader-key ttl, not the services. The
promotion's effect on the services is the same either way (a new writable primary on another
port, the old one dead, silent or read-only), so the test promotes at once with ``pg_ctl promote``
and the figures are the services' own.

    with PgPair() as pair:
        url = pair.url("postgres", "postgres")   # multi-host, target_session_attrs=read-write
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from benchmarks.pgcluster import PrivateCluster, _free_port
from tests.support.netfault import ProxyProcess


class PgPair:
    def __init__(
        self,
        *,
        synchronous: bool = False,
        settings: dict[str, object] | None = None,
        replication_proxy: bool = False,
    ) -> None:
        conf: dict[str, object] = {
            "wal_level": "replica",
            "max_wal_senders": 10,
            "hot_standby": "on",
            "wal_keep_size": "'256MB'",
            "fsync": "off",
            "max_connections": 200,
            **(settings or {}),
        }
        self.primary = PrivateCluster(conf, prefix="connector-pgpair-")
        self._synchronous = synchronous
        #: With ``replication_proxy``: the standby streams through this forwarder, whose ``stall()``
        #: holds back replication (the standby lags) while the primary keeps committing.
        self.replication: ProxyProcess | None = ProxyProcess(0) if replication_proxy else None
        self.standby_port = 0
        self.standby_data: Path | None = None
        #: Ports in URL order: [first primary, first standby]; after a failover the roles swap.
        self.ports: list[int] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> PgPair:
        self.primary.start()
        assert self.primary.root is not None
        with (self.primary.data / "pg_hba.conf").open("a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        self.sql(self.primary.port, "SELECT pg_reload_conf()")
        self.standby_data = self.primary.root / "standby"
        self.standby_port = _free_port()
        stream_from = self.primary.port
        if self.replication is not None:
            self.replication = ProxyProcess(self.primary.port).start()
            stream_from = self.replication.port
        self._basebackup(self.primary.port, self.standby_data, self.standby_port, "standby", stream_from)
        self._pg_ctl(self.standby_data, "start", port=self.standby_port)
        self.ports = [self.primary.port, self.standby_port]
        self.wait_streaming(self.primary.port)
        if self._synchronous:
            self.synchronous(True)
        return self

    def stop(self) -> None:
        for data in (self.standby_data, self._old_primary_data()):
            if data is not None and (data / "postmaster.pid").exists():
                subprocess.run([*self._as, str(self.primary.bin / "pg_ctl"), "-D", str(data), "-m",
                                "immediate", "-w", "stop"], capture_output=True, timeout=60)  # fmt: skip
        if self.replication is not None:
            self.replication.stop()
        self.primary.stop()

    def __enter__(self) -> PgPair:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- helpers -----------------------------------------------------------------------------

    @property
    def _as(self) -> list[str]:
        return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _old_primary_data(self) -> Path | None:
        return self.primary.data if self.primary.root is not None else None

    def _pg_ctl(self, data: Path, *args: str, port: int | None = None) -> None:
        cmd = [*self._as, str(self.primary.bin / "pg_ctl"), "-D", str(data), "-w", "-t", "60"]
        if args[0] == "start":
            cmd += ["-l", str(data.parent / f"{data.name}.log"), "-o", f"-p {port}"]
        out = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=90)
        if out.returncode != 0:
            log = data.parent / f"{data.name}.log"
            tail = log.read_text(errors="replace")[-1500:] if args[0] == "start" and log.exists() else ""
            raise RuntimeError(
                f"pg_ctl {args[0]} failed: {(out.stderr or out.stdout)[-800:]}\nserver log: {tail}"
            )

    def _basebackup(self, source_port: int, data: Path, port: int, name: str, stream_from: int = 0) -> None:
        if data.exists():
            shutil.rmtree(data)
        out = subprocess.run(
            [*self._as, str(self.primary.bin / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(source_port),
             "-U", "postgres", "-D", str(data), "-R", "-X", "stream", "--checkpoint=fast"],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"pg_basebackup failed: {out.stderr[-800:]}")
        with (data / "postgresql.auto.conf").open("a") as f:
            f.write(
                f"primary_conninfo = 'host=127.0.0.1 port={stream_from or source_port} user=postgres "
                f"application_name={name}'\n"
            )

    def url(self, user: str, dbname: str, *, target_session_attrs: str | None = "read-write") -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        query = f"?target_session_attrs={target_session_attrs}" if target_session_attrs else ""
        return f"postgresql://{user}@{hosts}/{dbname}{query}"

    def direct(self, port: int, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/{dbname}"

    def sql(self, port: int, statement: str, dbname: str = "postgres") -> list[tuple[object, ...]]:
        with psycopg.connect(self.direct(port, dbname), autocommit=True, connect_timeout=5) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def wait_streaming(self, primary_port: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.sql(primary_port, "SELECT 1 FROM pg_stat_replication WHERE state = 'streaming'"):
            assert time.monotonic() < deadline, "the standby did not start streaming"
            time.sleep(0.1)

    # -- faults ------------------------------------------------------------------------------

    def synchronous(self, on: bool, primary_port: int | None = None) -> None:
        port = primary_port or self.ports[0]
        names = "'standby'" if on else "''"
        self.sql(port, f"ALTER SYSTEM SET synchronous_standby_names = {names}")
        self.sql(port, "SELECT pg_reload_conf()")
        if on:
            deadline = time.monotonic() + 30
            while not self.sql(port, "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'"):
                assert time.monotonic() < deadline, "the standby did not become synchronous"
                time.sleep(0.1)

    def kill_primary(self) -> None:
        """kill -9 of the primary's postmaster and its backends (a crash: sockets reset)."""
        pid = int((self.primary.data / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        subprocess.run(["pkill", "-9", "-P", str(pid)], capture_output=True)
        (self.primary.data / "postmaster.pid").unlink(missing_ok=True)
        self._forget_socket(pid, self.primary.port)

    def _forget_socket(self, pid: int, port: int) -> None:
        """Remove a killed postmaster's socket lock file once it is dead. Where nothing reaps
        orphans (a container whose PID 1 is not an init) the killed postmaster stays a zombie, and
        a new server on the port refuses to start: "lock file .s.PGSQL.<port>.lock already exists
        ... Is another postmaster (PID n) using socket file" (CI failed the demoted-primary test so)."""
        import psutil

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        assert self.primary.root is not None
        for name in (f".s.PGSQL.{port}.lock", f".s.PGSQL.{port}"):
            (self.primary.root / "sock" / name).unlink(missing_ok=True)

    def stop_primary_fast(self) -> None:
        self._pg_ctl(self.primary.data, "-m", "fast", "stop")

    def promote(self) -> None:
        """Promote the standby; it becomes the first host of ``url()`` (so a multi-host URL built
        before still lists both)."""
        assert self.standby_data is not None
        self._pg_ctl(self.standby_data, "promote")
        deadline = time.monotonic() + 30
        while self.sql(self.standby_port, "SELECT pg_is_in_recovery()")[0][0]:
            assert time.monotonic() < deadline, "promotion did not finish"
            time.sleep(0.05)

    def demote_old_primary(self) -> None:
        """The old primary comes back, on its old port, as a standby of the promoted one."""
        data = self.primary.data
        if (data / "postmaster.pid").exists():
            with_pid = (data / "postmaster.pid").read_text().split()
            subprocess.run(["kill", "-9", with_pid[0]], capture_output=True)
            (data / "postmaster.pid").unlink(missing_ok=True)
            self._forget_socket(int(with_pid[0]), self.primary.port)
        self._basebackup(self.standby_port, data, self.primary.port, "old_primary")
        self._pg_ctl(data, "start", port=self.primary.port)
        self.wait_streaming(self.standby_port)

    # -- a deterministic lost tail (tests/executor/test_failover_identity.py) ----------------------

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        lsn = self.sql(self.ports[0], "SELECT pg_current_wal_lsn()")[0][0]
        deadline = time.monotonic() + timeout
        while not self.sql(self.standby_port, f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0]:
            assert time.monotonic() < deadline, "the standby did not replay the primary's WAL"
            time.sleep(0.05)

    def stop_standby(self) -> None:
        """Stop the standby (fast): it keeps exactly what it had replayed, and receives nothing of
        what the primary writes from now on — the tail an asynchronous failover loses."""
        assert self.standby_data is not None
        self._pg_ctl(self.standby_data, "-m", "fast", "stop")

    def start_standby(self) -> None:
        assert self.standby_data is not None
        self._pg_ctl(self.standby_data, "start", port=self.standby_port)

    def scratch(self) -> Path:
        """A folder every process (the ``postgres`` user too) may write: sinks, flags."""
        assert self.primary.root is not None
        path = self.primary.root / "scratch"
        path.mkdir(exist_ok=True)
        path.chmod(0o777)
        return path
