"""Descriptor exhaustion cannot refuse a genuine delivery: a real ``connector ingress`` process under
``ulimit -n 256`` (soft and hard), 300 idle sockets, 100 slow-body clients and an attacker that
reconnects whatever is shed, while genuine signed deliveries arrive on new connections.

The timeouts are set far beyond the test's length, so only the connection cap (derived from the
descriptor limit: 128) and its shedding order can keep the door open. Control: the same scenario
against the code before the cap (``git archive`` of the parent commit on ``PYTHONPATH``) fails —
genuine deliveries see ``ECONNRESET`` (uvloop's ``EMFILE`` handling resets every connection waiting
in the backlog), which is how issue #11 found it.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import urllib.request
from typing import Any

from tests.ingress.processes import wait_ready

from .conftest import NAMESPACE, SECRETS, github_headers, install_routes, receipt_count

LIMIT = 256


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _start(db_url: str, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        **SECRETS,
        "CONNECTOR_DATABASE_URL": db_url,
        "CONNECTOR_INGRESS_GRPC_PORT": str(_free_port()),
        "CONNECTOR_INGRESS_METRICS_PORT": str(_free_port()),
        "CONNECTOR_INGRESS_HTTP_HEADER_TIMEOUT_S": "600",
        "CONNECTOR_INGRESS_HTTP_BODY_TIMEOUT_S": "600",
        "CONNECTOR_INGRESS_HTTP_KEEPALIVE_TIMEOUT_S": "600",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "connector.cli.main", "ingress", "--http-port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        preexec_fn=_low_nofile,  # only setrlimit, before exec
    )


async def _deliver(port: int, n: int) -> int:
    body = json.dumps({"genuine": n}).encode()
    headers = {**github_headers(body, delivery=f"genuine-{n}"), "Content-Type": "application/json"}
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
    try:
        head = f"POST /v1/webhooks/{NAMESPACE}/github HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(head.encode() + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
        return int(answer[9:12])
    finally:
        writer.close()


class Held:
    """One attacker socket and a watcher that ends when the server closes it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.gone = asyncio.ensure_future(reader.read())  # EOF (or reset) once the server sheds it


async def _attack(port: int, stop: asyncio.Event, placed: asyncio.Event, held: list[Held]) -> int:
    """300 idle sockets, 100 slow bodies, then reopen what the server sheds (at most 200/s: holding
    sockets, not a connection flood — that one is the kernel's and a load balancer's to absorb)."""

    async def idle() -> None:
        held.append(Held(*await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)))

    async def slow(n: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"POST /v1/webhooks/{NAMESPACE}/github HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-GitHub-Delivery: slow-{n}\r\nContent-Length: 100000\r\n\r\n{{".encode()
        )
        held.append(Held(reader, writer))

    await asyncio.gather(*(idle() for _ in range(300)), return_exceptions=True)
    await asyncio.gather(*(slow(n) for n in range(100)), return_exceptions=True)
    placed.set()
    reopened = 0
    while not stop.is_set():
        for h in [h for h in held if h.gone.done()]:
            h.writer.close()
            held.remove(h)
        results = await asyncio.gather(
            *(idle() for _ in range(min(400 - len(held), 20))), return_exceptions=True
        )
        reopened += sum(1 for r in results if not isinstance(r, BaseException))
        await asyncio.sleep(0.1)
    return reopened


async def _scenario(port: int) -> tuple[list[Any], int]:
    stop, placed = asyncio.Event(), asyncio.Event()
    held: list[Held] = []
    attacker = asyncio.create_task(_attack(port, stop, placed, held))
    try:
        await asyncio.wait([attacker, asyncio.ensure_future(placed.wait())], return_when="FIRST_COMPLETED")
        assert placed.is_set(), attacker
        statuses: list[Any] = []
        for batch in range(5):  # 50 genuine deliveries, 10 at a time, each on a new connection
            statuses += await asyncio.gather(
                *(_deliver(port, batch * 10 + i) for i in range(10)), return_exceptions=True
            )
    finally:
        stop.set()
        reopened = await attacker
        for h in held:
            h.writer.close()
            h.gone.cancel()
    return statuses, reopened


def test_descriptor_exhaustion_by_idle_and_slow_clients_cannot_refuse_a_genuine_delivery(db_url: str) -> None:
    install_routes(db_url)
    port = _free_port()
    proc = _start(db_url, port)
    try:
        wait_ready(proc, port)
        statuses, reopened = asyncio.run(_scenario(port))
        alive = proc.poll() is None
        # The server is still healthy once the attack has gone.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logs = proc.stderr.read().decode() if proc.stderr else ""
    assert alive
    assert statuses == [200] * 50, statuses
    assert receipt_count(db_url) == 50
    assert reopened > 0  # the attacker's sockets were shed (and reopened) while genuine ones got in
    started = next(json.loads(line) for line in logs.splitlines() if '"ingress started"' in line)
    assert started["http_max_connections"] == LIMIT // 2
    assert "Too many open files" not in logs and "EMFILE" not in logs
