"""A private PostgreSQL cluster for measurements that need server settings the shared server does not
have (``shared_preload_libraries = pg_stat_statements``): ``initdb`` into a temporary folder with the
machine's PostgreSQL binaries, started on a free port of 127.0.0.1, stopped and deleted afterwards.
The machine's shared server (5432) is never touched.

    with PrivateCluster() as cluster:
        url = cluster.url("postgres", "postgres")

Binaries: ``CONNECTOR_PG_BIN``, else ``/usr/lib/postgresql/15/bin``, else the newest
``/usr/lib/postgresql/*/bin``, else ``pg_config --bindir``; ``pg_stat_statements`` must be installed
with them (Debian's server package ships it). ``initdb`` refuses to run as root: as root the
cluster runs as the ``postgres`` system user (``runuser``), and its folder lives outside pytest's
base temp (see NOTES.md: every pytest session resets ``/tmp/pytest-of-<user>`` to 0700).
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

DEFAULT_BIN = "/usr/lib/postgresql/15/bin"


def pg_bin() -> Path:
    explicit = os.environ.get("CONNECTOR_PG_BIN")
    if explicit:
        return Path(explicit)
    if Path(DEFAULT_BIN, "initdb").exists():
        return Path(DEFAULT_BIN)
    # Another Debian/Ubuntu server package: the newest installed version.
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: _version(p.parts[-3]))
    if found:
        return found[-1].parent
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0 and Path(out.stdout.strip(), "initdb").exists():
            return Path(out.stdout.strip())
    raise RuntimeError(
        f"no PostgreSQL server binaries (initdb): set CONNECTOR_PG_BIN (looked in {DEFAULT_BIN}, "
        "/usr/lib/postgresql/*/bin and pg_config on PATH)"
    )


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(x) for x in name.split(".") if x.isdigit())


def _free_port() -> int:
    """A free port for a server that may be stopped and started again on it (a private cluster, a
    standby, a demoted primary): chosen *below* the kernel's ephemeral range, so that while the
    server is down no outgoing connection can be given its number (CI once failed a restart on
    port 52743 this way: "could not start server")."""
    low = 32768
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1025, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded range: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """``initdb`` + ``pg_ctl start`` with ``settings`` in postgresql.conf; ``stop`` removes it."""

    def __init__(self, settings: dict[str, Any] | None = None, *, prefix: str = "connector-pg-") -> None:
        self.settings = dict(settings or {})
        self.prefix = prefix
        self.bin = pg_bin()
        self.root: Path | None = None
        self.port = 0
        self._as_user: list[str] = []

    @property
    def data(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    def _run(self, *args: str, timeout: float = 120) -> None:
        cmd = [*self._as_user, str(self.bin / args[0]), *args[1:]]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if out.returncode != 0:
            raise RuntimeError(
                f"{args[0]} failed ({out.returncode}): {(out.stderr or out.stdout).strip()[-800:]}"
            )

    def start(self) -> PrivateCluster:
        self.root = Path(tempfile.mkdtemp(prefix=self.prefix))
        self.root.chmod(0o755)
        sock = self.root / "sock"
        sock.mkdir()
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            os.chown(sock, user.pw_uid, user.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync", "--no-instructions")  # fmt: skip
        conf = {
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{sock}'",
            "log_min_messages": "warning",
            **{k: str(v) for k, v in self.settings.items()},
        }
        with (self.data / "postgresql.conf").open("a") as f:
            f.write("\n# connector PrivateCluster\n")
            for k, v in conf.items():
                f.write(f"{k} = {v}\n")
        log = str(self.root / "server.log")
        for attempt in range(3):  # a free port may be taken by someone else before the server binds it
            self.port = _free_port()
            try:
                self._run(
                    "pg_ctl",
                    "-D",
                    str(self.data),
                    "-l",
                    log,
                    "-o",
                    f"-p {self.port}",
                    "-w",
                    "-t",
                    "60",
                    "start",
                )
                break
            except RuntimeError:
                if attempt == 2 or "could not bind" not in self.log_tail():
                    raise
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url("postgres", "postgres"), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def url(self, user: str, dbname: str) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def log_tail(self, chars: int = 2000) -> str:
        if self.root is None:
            return ""
        try:
            return (self.root / "server.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.root is None:
            return
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout=60)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> PrivateCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
