"""Network faults on loopback for failover tests.

* ``blackhole(port)``: an iptables ``DROP`` of every TCP segment to or from ``port`` on ``lo`` — a
  host that went silent (no RST, no FIN). This is the only way to make a peer silent *at the TCP
  level* on one machine: a userland proxy that stops forwarding still has its kernel acknowledge
  data and answer keepalive probes, so keepalives and ``tcp_user_timeout`` never fire against it
  (measured: a query through such a proxy hung with and without them; through a DROP rule it failed
  after 4.4 s with keepalives 2/1/3 and ``tcp_user_timeout`` 4000).
* ``ProxyProcess``: a TCP forwarder in its own process (``python -m tests.support.netfault LISTEN
  HOST:PORT``), so that one client (one service) can be cut off by black-holing the proxy's port
  while every other client reaches the same server directly. ``SIGUSR1`` toggles a userland stall
  (stop forwarding, keep the sockets: a hung peer).

Needs root and iptables (``apt-get install iptables``: ``ensure_iptables()`` installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator


def ensure_iptables() -> str:
    """The iptables binary, installed from Debian's packages when missing (the tests run as root)."""
    found = shutil.which("iptables")
    if found is None:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "iptables"]
        if subprocess.run(install, capture_output=True, env=env, timeout=600).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=600)
            subprocess.run(install, check=True, capture_output=True, env=env, timeout=600)
        found = shutil.which("iptables")
    assert found, "iptables is needed to black-hole a port (apt-get install iptables)"
    return found


def _rules(port: int) -> list[list[str]]:
    return [
        ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"],
        ["INPUT", "-i", "lo", "-p", "tcp", "--sport", str(port), "-j", "DROP"],
    ]


def blackhole_on(port: int) -> None:
    ipt = ensure_iptables()
    for rule in _rules(port):
        subprocess.run([ipt, "-I", *rule], check=True, capture_output=True)


def blackhole_off(port: int) -> None:
    ipt = ensure_iptables()
    for rule in _rules(port):
        while subprocess.run([ipt, "-D", *rule], capture_output=True).returncode == 0:
            pass


@contextlib.contextmanager
def blackhole(port: int) -> Iterator[None]:
    blackhole_on(port)
    try:
        yield
    finally:
        blackhole_off(port)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProxyProcess:
    """``python -m tests.support.netfault`` on a free port, forwarding to ``target_port``."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ProxyProcess:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.netfault",
                str(self.port),
                f"{self.target[0]}:{self.target[1]}",
            ],
            stdout=subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(b"listening"), line
        return self

    def stall(self) -> None:
        """Toggle the userland stall (a hung peer: the kernel still acknowledges)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None
        blackhole_off(self.port) if shutil.which("iptables") else None


async def _serve(listen: int, host: str, port: int) -> None:
    stalled = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGUSR1, lambda: stalled.clear() if stalled.is_set() else stalled.set())

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await src.read(65536):
                while stalled.is_set():
                    await asyncio.sleep(0.05)
                dst.write(data)
                await dst.drain()
        dst.transport.abort()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.transport.abort()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", listen, reuse_address=True)
    print("listening", listen, flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    listen = int(sys.argv[1])
    host, _, port = sys.argv[2].rpartition(":")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(listen, host, int(port)))


if __name__ == "__main__":
    main()
