"""Attack scenario: a quiet namespace's acks and the ingress' memory under a mixed attack.

    .venv/bin/python -m benchmarks.attack_bench [--quick] [--json-out PATH] [--phase-s 20]
    ./dev bench --only attack

What it does (under the benchmark lock, ``benchmarks.common.bench_lock``):

1. a scratch database (migrated) with two routes verified by the Standard Webhooks preset: the
   quiet namespace (``benchmarks.ingress_bench``'s ``bench/events``) and a noisy one
   (``noisy/events``) that the attack aims at;
2. ``connector ingress`` as its own process (uvloop, default settings: the defaults are what is
   measured);
3. a quiet load generator in its own process: ``--quiet-rate`` signed deliveries/s on
   ``--quiet-connections`` keep-alive connections (paced, one at a time per connection), ack
   latency from the request's first byte to its answer;
4. phases of ``--phase-s`` each, in this order, in one run: *baseline* (quiet load only), *attack*
   (quiet load + the attack), *after* (quiet load only again). The ingress RSS is sampled every
   100 ms; *idle* is its RSS after start-up and a warm-up, before the baseline;
5. the attack, in another process of its own: 300 idle sockets, 100 slow-body clients (headers of a
   1 MiB body, then one byte a second), ``--flood-connections`` clients posting 1 MiB bodies that are
   refused back to back (wrong signature on the noisy route, so the whole body is read and its HMAC
   computed; every fourth to an unknown route, answered before the body), and a decompression bomb
   every second (1 GiB of zeros gzipped to ~1 MiB, Content-Encoding gzip, alternately to the noisy
   route, an unknown route and ``/healthz``). Every socket the server closes is reopened (at most
   200/s: holding sockets, not a connection flood);
6. prints the quiet namespace's p50/p99 per phase, the p99 ratio attack/baseline (target <= 2),
   the RSS of idle and the maximum per phase (target: attack maximum within 50 MiB of idle), what
   the attacker got back, and the rows for ``--json-out``.

Nothing here is a test: it measures and reports.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file, or a child role
    sys.path.insert(0, str(ROOT))

from benchmarks import ingress_bench  # noqa: E402
from benchmarks.webhook_load import read_status, signed_request  # noqa: E402

QUIET = f"/v1/webhooks/{ingress_bench.NAMESPACE}/{ingress_bench.ROUTE_KEY}"
NOISY_NAMESPACE = "noisy"
NOISY = f"/v1/webhooks/{NOISY_NAMESPACE}/{ingress_bench.ROUTE_KEY}"
UNKNOWN = f"/v1/webhooks/{NOISY_NAMESPACE}/nothing-here"
MIB = 1 << 20


# --------------------------------------------------------------------------------------------------
# Quiet load (``attack_bench.py --role quiet '<json>'``)
# --------------------------------------------------------------------------------------------------


async def _quiet(cfg: dict[str, Any]) -> dict[str, Any]:
    host, port = "127.0.0.1", cfg["port"]
    key = base64.b64decode(cfg["secret"].removeprefix("whsec_"))
    interval = cfg["connections"] / cfg["rate"]
    stop_at = time.monotonic() + cfg["duration"]
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = 0
    tag = os.urandom(4).hex()

    async def client(n: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        due = time.monotonic() + interval * n / cfg["connections"]
        seq = 0
        while (now := time.monotonic()) < stop_at:
            if due > now:
                await asyncio.sleep(due - now)
            due += interval
            seq += 1
            msg_id = f"quiet_{tag}_{n}_{seq}".encode()
            body = b'{"type":"quiet.event","id":"%s","pad":"%s"}' % (msg_id, b"q" * 900)
            request = signed_request(
                QUIET.encode(), host, port, key, msg_id, str(int(time.time())).encode(), body
            )
            started = time.perf_counter()
            try:
                writer.write(request)
                status = await asyncio.wait_for(read_status(reader), 30)
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                errors += 1  # the connection was lost (it should not be): reconnect
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
                continue
            statuses[status] = statuses.get(status, 0) + 1
            if status == 200:
                latencies.append(time.perf_counter() - started)
        writer.close()

    await asyncio.gather(*(client(i) for i in range(cfg["connections"])))
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    return {
        "acks": len(latencies),
        "statuses": statuses,
        "errors": errors,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "max_ms": latencies[-1] * 1000 if latencies else 0.0,
    }


# --------------------------------------------------------------------------------------------------
# The attack (``attack_bench.py --role attack '<json>'``: runs until SIGTERM, then prints its counts)
# --------------------------------------------------------------------------------------------------


def bomb(inflated: int = 1 << 30) -> bytes:
    """gzip of ``inflated`` zero bytes (1 GiB -> ~1 MiB)."""
    z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    return b"".join([z.compress(zeros) for _ in range(inflated // MIB)] + [z.flush()])


async def _attack(cfg: dict[str, Any]) -> dict[str, Any]:
    host, port = "127.0.0.1", cfg["port"]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    counts: dict[str, int] = {}

    def note(what: str) -> None:
        counts[what] = counts.get(what, 0) + 1

    async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(asyncio.open_connection(host, port), 5)

    # (Re)opening idle and slow sockets is paced: the first 400 at once, then at most 200 a second.
    gap, next_at = 1 / 200, loop.time() - 400 / 200

    async def pace() -> None:
        nonlocal next_at
        now = loop.time()
        at = next_at = max(now, next_at + gap)
        if at > now:
            await asyncio.sleep(at - now)

    async def hold_idle() -> None:
        while not stop.is_set():
            await pace()
            try:
                reader, writer = await connect()
            except (OSError, TimeoutError):
                note("idle_connect_failed")
                continue
            note("idle_opened")
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                await _until(reader.read(), stop)  # returns when the server closes it
            writer.close()

    async def hold_slow() -> None:
        head = (
            f"POST {NOISY} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nwebhook-id: slow\r\n"
            f"webhook-timestamp: {int(time.time())}\r\nwebhook-signature: v1,AAAA\r\n"
            f"Content-Length: {MIB}\r\n\r\n{{"
        ).encode()
        while not stop.is_set():
            await pace()
            try:
                reader, writer = await connect()
                writer.write(head)
            except (OSError, TimeoutError):
                note("slow_connect_failed")
                continue
            note("slow_opened")
            answer = asyncio.ensure_future(reader.read(12))
            try:
                while not stop.is_set() and not answer.done():  # one byte a second
                    await asyncio.wait([answer], timeout=1.0)
                    if not answer.done():
                        writer.write(b" ")
                if answer.done() and not answer.cancelled() and answer.exception() is None:
                    note(f"slow_answer_{answer.result()[9:12].decode(errors='replace') or 'closed'}")
            except OSError:
                note("slow_reset")
            finally:
                answer.cancel()
                writer.close()

    big = b'{"pad":"' + b"f" * (MIB - 10) + b'"}'
    assert len(big) == MIB

    rate = cfg["flood_rate"]
    every = cfg["flood_connections"] / rate if rate else 0.0

    async def flood(n: int) -> None:
        i = 0
        due = loop.time() + every * n / cfg["flood_connections"]
        while not stop.is_set():
            i += 1
            if every:  # paced: --flood-rate bodies a second over all flood connections
                due += every
                if due > loop.time():
                    await _until(asyncio.sleep(due - loop.time()), stop)
                else:
                    note("flood_behind")  # the server did not keep up with the offered rate
                    due = loop.time()
            target = UNKNOWN if i % 4 == 0 else NOISY
            request = (
                f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"webhook-id: flood-{n}-{i}\r\nwebhook-timestamp: {int(time.time())}\r\n"
                f"webhook-signature: v1,{base64.b64encode(os.urandom(32)).decode()}\r\n"
                f"Content-Length: {len(big)}\r\n\r\n"
            ).encode()
            try:
                reader, writer = await connect()
            except (OSError, TimeoutError):
                note("flood_connect_failed")
                await asyncio.sleep(0.1)
                continue
            try:
                writer.write(request + big)
                await _until(writer.drain(), stop)
                status = await _until(asyncio.wait_for(read_status(reader), 30), stop)
                note(f"flood_{status}")
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
                note("flood_closed_early")  # e.g. the 404 answered before the body, then closed
            finally:
                writer.close()

    payload = bomb()

    async def bombs() -> None:
        targets = [NOISY, UNKNOWN, "/healthz"]
        i = 0
        while not stop.is_set():
            target = targets[i % len(targets)]
            i += 1
            method = "GET" if target == "/healthz" else "POST"
            head = (
                f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Encoding: gzip\r\nwebhook-id: bomb-{i}\r\nwebhook-timestamp: {int(time.time())}\r\n"
                f"webhook-signature: v1,{base64.b64encode(os.urandom(32)).decode()}\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n"
            ).encode()
            with contextlib.suppress(OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                reader, writer = await connect()
                try:
                    writer.write(head + payload)
                    status = await _until(asyncio.wait_for(read_status(reader), 10), stop)
                    note(f"bomb_{status}")
                finally:
                    writer.close()
            await _until(asyncio.sleep(1.0), stop)

    tasks = [asyncio.ensure_future(hold_idle()) for _ in range(cfg["idle"])]
    tasks += [asyncio.ensure_future(hold_slow()) for _ in range(cfg["slow"])]
    await asyncio.sleep(0.5)  # let the idle and slow sockets connect before the flood starts
    tasks += [asyncio.ensure_future(flood(n)) for n in range(cfg["flood_connections"])]
    tasks.append(asyncio.ensure_future(bombs()))
    print("placed", flush=True)
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return counts


async def _until(aw: Any, stop: asyncio.Event) -> Any:
    """``aw``'s result, or ``None`` once ``stop`` is set first."""
    task = asyncio.ensure_future(aw)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopper], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        return None
    finally:
        for t in (task, stopper):
            if not t.done():
                t.cancel()


# --------------------------------------------------------------------------------------------------
# Orchestration
# --------------------------------------------------------------------------------------------------


def _install_noisy_route(url: str) -> None:
    """The attacked namespace: the same Standard Webhooks route, namespace ``noisy``."""
    import psycopg
    from psycopg.types.json import Jsonb

    from connector.common.packs.document import parse_manifest
    from connector.common.packs.manifest import sha256_hex
    from connector.common.store import vocabulary

    manifest = parse_manifest(
        {
            "name": "noisy",
            "namespace": NOISY_NAMESPACE,
            "work_types": {"noop": {"handler": {"kind": "python", "target": "bench:noop"}}},
            "routes": [
                {
                    "key": ingress_bench.ROUTE_KEY,
                    "verification": {
                        "preset": "standard-webhooks",
                        "secrets": [{"env": ingress_bench.SECRET_ENV}],
                    },
                    "idempotency_header": "webhook-id",
                    "fan_out": [{"work_type": "noop"}],
                }
            ],
        }
    )
    route = manifest.routes[0].model_dump(mode="json")
    doc = manifest.model_dump(mode="json")
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        row = conn.execute(
            "INSERT INTO connector_installed_pack (name, namespace, active_generation) VALUES (%s, %s, 1)"
            " RETURNING installed_pack_id",
            (manifest.name, manifest.namespace),
        ).fetchone()
        assert row is not None
        conn.execute(
            "INSERT INTO connector_pack_generation (installed_pack_id, generation, status, manifest,"
            " manifest_sha256, activated_at) VALUES (%s, 1, 'active', %s, %s, now())",
            (row[0], Jsonb(doc), sha256_hex(doc)),
        )
        conn.execute(
            "INSERT INTO connector_route (installed_pack_id, generation, namespace, route_key, route_version,"
            " config, config_sha256) VALUES (%s, 1, %s, %s, 1, %s, %s)",
            (row[0], NOISY_NAMESPACE, ingress_bench.ROUTE_KEY, Jsonb(route), sha256_hex(route)),
        )
        conn.execute("SELECT pg_notify(%s, '')", (vocabulary.CHANNEL_PACKS,))


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class RssSampler:
    """The process's RSS every 100 ms, in a thread, and its CPU (cores busy) over the block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[float] = []
        self.cpu = 0.0
        self._cpu0 = self._wall0 = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with contextlib.suppress(OSError):
                self.samples.append(_rss_mib(self.pid))

    def __enter__(self) -> RssSampler:
        self._cpu0, self._wall0 = ingress_bench._cpu_seconds(self.pid), time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(OSError):
            used = ingress_bench._cpu_seconds(self.pid) - self._cpu0
            self.cpu = used / max(1e-9, time.monotonic() - self._wall0)

    @property
    def peak(self) -> float:
        return max(self.samples, default=0.0)


def _role(role: str, cfg: dict[str, Any]) -> dict[str, Any]:
    try:
        import uvloop

        return uvloop.run(_quiet(cfg) if role == "quiet" else _attack(cfg))
    except ImportError:
        return asyncio.run(_quiet(cfg) if role == "quiet" else _attack(cfg))


def _quiet_phase(args: argparse.Namespace, port: int, duration: float) -> dict[str, Any]:
    cfg = {
        "port": port,
        "secret": ingress_bench.SECRET_VALUE,
        "rate": args.quiet_rate,
        "connections": args.quiet_connections,
        "duration": duration,
    }
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--role", "quiet", json.dumps(cfg)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _run(args: argparse.Namespace, url: str) -> dict[str, Any]:
    ingress_bench._install_route(url)
    _install_noisy_route(url)
    http_port, grpc_port, metrics_port = (ingress_bench._free_port() for _ in range(3))
    env = {
        **os.environ,
        "CONNECTOR_DATABASE_URL": url,
        ingress_bench.SECRET_ENV: ingress_bench.SECRET_VALUE,
        "CONNECTOR_LOG_LEVEL": "WARNING",
    }
    ingress = subprocess.Popen(
        [sys.executable, "-m", "connector.cli.main", "ingress", "--http-port", str(http_port),
         "--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)],
        env=env,
    )  # fmt: skip
    attacker: subprocess.Popen[str] | None = None
    try:
        ingress_bench._wait_ready(http_port, ingress)
        _quiet_phase(args, http_port, args.warmup)  # warm-up (code paths, pool, allocator)
        time.sleep(1.0)
        idle = _rss_mib(ingress.pid)
        phases: dict[str, dict[str, Any]] = {}
        with RssSampler(ingress.pid) as rss:
            phases["baseline"] = _quiet_phase(args, http_port, args.phase_s)
        phases["baseline"]["rss_peak_mib"] = rss.peak
        phases["baseline"]["ingress_cpu"] = rss.cpu
        attack_cfg = {
            "port": http_port,
            "idle": args.idle,
            "slow": args.slow,
            "flood_connections": args.flood_connections,
            "flood_rate": args.flood_rate,
        }
        attacker = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--role", "attack", json.dumps(attack_cfg)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert attacker.stdout is not None
        line = attacker.stdout.readline()  # "placed" once the bomb is built and the sockets open
        if line.strip() != "placed":
            raise SystemExit(f"the attacker did not start: {line!r}")
        time.sleep(2.0)  # the sockets pile up to the cap
        with RssSampler(ingress.pid) as rss, RssSampler(attacker.pid) as attacker_rss:
            phases["attack"] = _quiet_phase(args, http_port, args.phase_s)
        phases["attack"]["rss_peak_mib"] = rss.peak
        phases["attack"]["ingress_cpu"] = rss.cpu
        phases["attack"]["attacker_cpu"] = attacker_rss.cpu
        attacker.send_signal(signal.SIGTERM)
        counts_line = attacker.communicate(timeout=60)[0].strip().splitlines()
        attack_counts = json.loads(counts_line[-1]) if counts_line else {}
        attacker = None
        time.sleep(1.0)
        with RssSampler(ingress.pid) as rss:
            phases["after"] = _quiet_phase(args, http_port, args.phase_s)
        phases["after"]["rss_peak_mib"] = rss.peak
        phases["after"]["ingress_cpu"] = rss.cpu
        alive = ingress.poll() is None
    finally:
        if attacker is not None:
            attacker.kill()
            attacker.wait()
        ingress.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            ingress.wait(timeout=30)
        if ingress.poll() is None:
            ingress.kill()
    base, att = phases["baseline"], phases["attack"]
    ratio = att["p99_ms"] / base["p99_ms"] if base["p99_ms"] else float("inf")
    delta = att["rss_peak_mib"] - idle
    print()
    print(
        f"attack scenario: quiet namespace {args.quiet_rate:.0f} deliveries/s on {args.quiet_connections}"
        f" connections, {args.phase_s:.0f} s per phase; attack: {args.idle} idle sockets, {args.slow} slow"
        f" bodies, {args.flood_rate or 'unpaced'}/s 1 MiB refused bodies on {args.flood_connections}"
        " connections, a 1 GiB gzip bomb a second"
    )
    for name, p in phases.items():
        print(
            f"  {name:<9} acks {p['acks']:>6}  p50 {p['p50_ms']:7.2f} ms  p99 {p['p99_ms']:7.2f} ms"
            f"  max {p['max_ms']:7.1f} ms  statuses {p['statuses']}  lost {p['errors']}"
            f"  RSS peak {p['rss_peak_mib']:.1f} MiB  ingress CPU {p['ingress_cpu']:.2f} cores"
        )
    print(f"  quiet p99 attack / baseline   {ratio:.2f}x (target <= 2)")
    print(f"  ingress RSS idle {idle:.1f} MiB, attack peak {att['rss_peak_mib']:.1f} MiB: +{delta:.1f} MiB"
          " (target <= 50)")  # fmt: skip
    print(f"  the attacker got            {dict(sorted(attack_counts.items()))}")
    print(f"  attacker CPU                {att['attacker_cpu']:.2f} cores")
    print(f"  ingress alive throughout    {alive}")
    summary = {
        "phases": phases,
        "idle_rss_mib": idle,
        "p99_ratio": ratio,
        "rss_delta_mib": delta,
        "attack": attack_counts,
        "alive": alive,
        "load_average": os.getloadavg(),
    }
    print(json.dumps(summary))
    return summary


def _rows(args: argparse.Namespace, summary: dict[str, Any], common: Any) -> list[dict[str, Any]]:
    base, att = summary["phases"]["baseline"], summary["phases"]["attack"]
    extra = {
        "quiet_rate_per_s": args.quiet_rate,
        "flood_rate_per_s": args.flood_rate,
        "phase_s": args.phase_s,
        "baseline_p99_ms": round(base["p99_ms"], 2),
        "attack_p99_ms": round(att["p99_ms"], 2),
        "after_p99_ms": round(summary["phases"]["after"]["p99_ms"], 2),
        "idle_rss_mib": round(summary["idle_rss_mib"], 1),
        "attack_rss_peak_mib": round(att["rss_peak_mib"], 1),
        "attack": summary["attack"],
        "quiet_statuses": {k: p["statuses"] for k, p in summary["phases"].items()},
    }
    return [
        common.make_row("attack.quiet_p99_ms", "attack: quiet namespace ack p99 under the mixed attack",
                        att["p99_ms"], "ms", extra=extra),
        common.make_row("attack.quiet_p99_ratio", "attack: quiet namespace ack p99, attack / unattacked",
                        summary["p99_ratio"], "ratio", target="<= 2"),
        common.make_row("attack.rss_delta_mib", "attack: ingress RSS peak under attack minus idle",
                        summary["rss_delta_mib"], "MiB", target="<= 50"),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 4 s phases")
    parser.add_argument("--json-out", type=Path, help='write {"rows": [...]} (docs/benchmarks.md contract)')
    parser.add_argument("--phase-s", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--quiet-rate", type=float, default=100.0, help="quiet deliveries/s")
    parser.add_argument("--quiet-connections", type=int, default=4)
    parser.add_argument("--idle", type=int, default=300, help="idle sockets")
    parser.add_argument("--slow", type=int, default=100, help="slow-body clients")
    parser.add_argument("--flood-connections", type=int, default=4, help="clients of 1 MiB refused bodies")
    parser.add_argument(
        "--flood-rate", type=float, default=100.0, help="1 MiB refused bodies a second (0: back to back)"
    )
    parser.add_argument("--role", choices=["quiet", "attack"], help=argparse.SUPPRESS)
    parser.add_argument("config", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        print(json.dumps(_role(args.role, json.loads(args.config))), flush=True)
        return 0
    if args.quick:
        args.phase_s, args.warmup = 4.0, 1.0
    from benchmarks import common

    with common.bench_lock(), common.fresh_migrated_database("attack") as url:
        summary = _run(args, url)
    common.write_json_out(args.json_out, _rows(args, summary, common))
    return 0


if __name__ == "__main__":
    sys.exit(main())
