"""A TCP proxy per (service, database server) for the failover tests, in its own process:
``python -m tests.failover.proxy`` reads one command per line on stdin and answers ``ok ...`` on
stdout. Every listener forwards to one server on loopback and has a mode:

* ``pass``: forward both ways (the initial mode; also how a partition heals);
* ``reset``: a loud failure — every open connection is closed with an RST (``SO_LINGER 0``) and a new
  one is accepted and reset at once (the client sees "server closed the connection unexpectedly");
* ``blackhole``: a silent failure — an iptables ``DROP`` of every segment to or from the listener's
  port on ``lo`` (no RST, no FIN: the client's kernel retransmits into the void; only its
  keepalives / ``tcp_user_timeout`` / ``connect_timeout`` can tell), and the proxy stops forwarding.
  A userland stall alone is not silent: the proxy's kernel would still acknowledge data and answer
  keepalive probes (tests/support/netfault.py measured it). ``pass`` removes the rule: the
  connections the client did not give up on resume.

Commands: ``listen TARGET_PORT`` (answers ``ok PORT``: a new listener on a free port),
``mode PORT pass|reset|blackhole``, ``quit``. The rules are removed when the process ends (and by
the parent, ``tests.failover.harness.Proxies.stop``, should it be killed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import struct
import subprocess
import sys


def iptables() -> str:
    """The iptables binary: ``iptables`` on PATH, else Debian's ``iptables-nft`` / ``-legacy`` (the
    package installs both but its alternatives link may be missing). ``scripts/install-failover.sh``
    installs the package."""
    for name in ("iptables", "iptables-nft", "iptables-legacy"):
        found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if found:
            return found
    raise RuntimeError("iptables is needed to black-hole a port: run scripts/install-failover.sh")


def _rules(port: int) -> list[list[str]]:
    return [
        ["INPUT", "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP"],
        ["INPUT", "-i", "lo", "-p", "tcp", "--sport", str(port), "-j", "DROP"],
    ]


def drop_on(port: int) -> None:
    ipt = iptables()
    for rule in _rules(port):
        subprocess.run([ipt, "-w", "-I", *rule], check=True, capture_output=True)


def drop_off(port: int) -> None:
    ipt = iptables()
    for rule in _rules(port):
        while subprocess.run([ipt, "-w", "-D", *rule], capture_output=True).returncode == 0:
            pass


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(OSError):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class Listener:
    def __init__(self, target: int) -> None:
        self.target = target
        self.mode = "pass"
        self.port = 0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.conns: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await src.read(65536):
                await self.flowing.wait()
                dst.write(data)
                await dst.drain()
        if self.mode == "pass":
            dst.transport.abort()  # the other side ended: so does this one (a server's kill -9 resets)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            _rst(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            _rst(writer)
            return
        pair = (writer, up_writer)
        self.conns.add(pair)
        try:
            await asyncio.gather(
                self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
            )
        finally:
            self.conns.discard(pair)

    def set_mode(self, mode: str) -> None:
        if mode == self.mode:
            return
        if self.mode == "blackhole":
            drop_off(self.port)
        self.mode = mode
        if mode == "pass":
            self.flowing.set()
        elif mode == "reset":
            self.flowing.set()
            for client, upstream in list(self.conns):
                _rst(client)
                _rst(upstream)
            self.conns.clear()
        elif mode == "blackhole":
            self.flowing.clear()
            drop_on(self.port)
        else:
            raise ValueError(mode)


async def _main() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    listeners: dict[int, Listener] = {}
    try:
        while line := (await reader.readline()).decode().strip():
            words = line.split()
            try:
                if words[0] == "listen":
                    listener = Listener(int(words[1]))
                    port = await listener.start()
                    listeners[port] = listener
                    answer = f"ok {port}"
                elif words[0] == "mode":
                    listeners[int(words[1])].set_mode(words[2])
                    answer = f"ok {words[1]} {words[2]}"
                elif words[0] == "quit":
                    break
                else:
                    answer = f"error unknown command {words[0]}"
            except Exception as exc:  # one line back to the test, which raises it
                answer = f"error {type(exc).__name__}: {exc}"
            sys.stdout.write(answer + "\n")
            sys.stdout.flush()
    finally:
        for listener in listeners.values():
            if listener.mode == "blackhole":
                drop_off(listener.port)
        sys.stdout.flush()
        os._exit(0)  # the open connections' tasks end with the process, without a cancellation's noise


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main())
