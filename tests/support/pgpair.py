"""A primary and a streaming standby on loopback for failover proofs (issue #26): two private
clusters (``benchmarks/pgcluster.py``: the machine's PostgreSQL binaries, as the ``postgres`` user
when run as root), the standby made by ``pg_basebackup -R``. The steps are explicit, so a test can
lose a tail of writes *deterministically*: ``stop_standby()`` (the standby keeps what it replayed),
writes on the primary (the tail), ``kill_primary()`` (kill -9 of the postmaster and its backends),
``start_standby()`` + ``promote()``: the new primary has everything before the tail and nothing of
it, on a new timeline — what an asynchronous standby promoted by an HA manager has after a crash.

    with PrimaryStandby() as pair:
        pair.primary_url ... pair.base_backup(); pair.start_standby() ...
        pair.url_both  # libpq multi-host URL, target_session_attrs=read-write
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from benchmarks.pgcluster import PrivateCluster, _free_port


class PrimaryStandby:
    def __init__(self, settings: dict[str, object] | None = None) -> None:
        self.primary = PrivateCluster(
            {
                "wal_level": "replica",
                "max_wal_senders": "4",
                "wal_keep_size": "'64MB'",
                "fsync": "off",
                **(settings or {}),
            },
            prefix="connector-pair-",
        )
        self.standby_port = 0
        self._standby_started = False

    # -- layout --------------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        assert self.primary.root is not None
        return self.primary.root

    @property
    def standby_data(self) -> Path:
        return self.root / "standby"

    @property
    def primary_url(self) -> str:
        return self.primary.url("postgres", "postgres")

    @property
    def standby_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/postgres"

    @property
    def url_both(self) -> str:
        """Both servers, the writable one wins (what the services are given in production)."""
        return (
            f"postgresql://postgres@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby_port}/postgres"
            "?target_session_attrs=read-write"
        )

    def scratch(self) -> Path:
        """A folder every process (and the ``postgres`` user) may write: for sinks and flags."""
        path = self.root / "scratch"
        path.mkdir(exist_ok=True)
        path.chmod(0o777)
        return path

    # -- steps ---------------------------------------------------------------------------------------
    def start(self) -> PrimaryStandby:
        self.primary.start()
        self.standby_port = _free_port()
        return self

    def base_backup(self) -> None:
        """The standby's data folder from the primary as it is now (``-R``: it will stream)."""
        self.primary._run(
            "pg_basebackup", "-D", str(self.standby_data), "-R", "-X", "stream", "-c", "fast",
            "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres", "--no-sync",
        )  # fmt: skip
        with (self.standby_data / "postgresql.conf").open("a") as f:
            f.write(f"\nport = {self.standby_port}\n")

    def start_standby(self) -> None:
        self.primary._run(
            "pg_ctl", "-D", str(self.standby_data), "-l", str(self.root / "standby.log"), "-w", "start"
        )
        self._standby_started = True

    def stop_standby(self) -> None:
        """Stop the standby (fast): it keeps exactly what it had replayed."""
        self.primary._run("pg_ctl", "-D", str(self.standby_data), "-m", "fast", "-w", "stop")
        self._standby_started = False

    def wait_replayed(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary_url, autocommit=True) as p:
            lsn = p.execute("SELECT pg_current_wal_lsn()").fetchone()[0]  # type: ignore[index]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.standby_url, autocommit=True) as s:
            while not s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise AssertionError("the standby did not replay the primary's WAL in time")
                time.sleep(0.05)

    def kill_primary(self) -> None:
        """kill -9 of the primary's postmaster and every backend (a machine that died)."""
        pid = int((self.primary.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
        for p in [pid, *(int(x) for x in children.stdout.split())]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
        (self.primary.data / "postmaster.pid").unlink(missing_ok=True)

    def promote(self) -> None:
        self.primary._run("pg_ctl", "-D", str(self.standby_data), "-w", "promote")

    # -- teardown ------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.primary.root is None:
            return
        if (self.standby_data / "postmaster.pid").exists():
            with contextlib.suppress(Exception):
                self.primary._run("pg_ctl", "-D", str(self.standby_data), "-m", "immediate", "-w", "stop")
        self.primary.stop()

    def __enter__(self) -> PrimaryStandby:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
