"""Peer: graphile-worker (npm), drained by benchmarks/peers/graphile_worker_bench.cjs.

    .venv/bin/python -m benchmarks.peers.graphile_worker_peer [--quick] [--json-out PATH] [--items N]
        [--repeat R]

Installs ``graphile-worker@VERSION`` into ``.bench/peers/graphile-worker`` with npm (once; again
when the pinned version changes) and measures four configurations, each on a fresh database
(graphile-worker installs its own schema there) with the same no-op workload as our executor:

- default: ``concurrency`` 16, ``maxPoolSize`` 17, no batching;
- batched: the same plus ``localQueue: {size: 500}``, ``completeJobBatchDelay: 0`` and
  ``failJobBatchDelay: 0`` (the batching options of the package's performance page, which uses
  ``localQueue.size`` 500 and batch delays 0);
- each with and without 100 named queues (``queue_name`` random among 100 names: jobs of one queue
  run one at a time, in order: the analogue of our source lanes).

``NO_LOG_SUCCESS=1`` and a silent logger keep per-job logging out of the measurement.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.peers import PeerConfig, Unavailable, last_line, measure, run_json

VERSION = "0.17.3"  # newest release whose engines field accepts Node 20 (0.18.0 wants Node >= 22.18)
INSTALL_DIR = common.PEERS_DIR / "graphile-worker"
SCRIPT = Path(__file__).with_name("graphile_worker_bench.cjs")
LOCAL_QUEUE_SIZE = 500
BATCH_DELAY_MS = 0
CAP_S_FULL = 90.0
CAP_S_QUICK = 8.0
UNIT = "jobs/s"


def configs() -> list[PeerConfig]:
    out = []
    for queues in (0, common.LANES):
        for batched in (False, True):
            label = "batched" if batched else "default"
            lanes = f", {queues} named queues" if queues else ", no queues"
            options: dict[str, Any] = {"batched": batched, "queues": queues}
            if batched:
                options.update(
                    localQueue_size=LOCAL_QUEUE_SIZE,
                    completeJobBatchDelay=BATCH_DELAY_MS,
                    failJobBatchDelay=BATCH_DELAY_MS,
                )
            out.append(
                PeerConfig(
                    key=f"peer.graphile_worker.{label}{'.queues' if queues else ''}",
                    name=f"graphile-worker {VERSION} {label}{lanes}",
                    scenario="drain_lanes" if queues else "drain",
                    options=options,
                )
            )
    return out


def installed_version() -> str | None:
    pkg = INSTALL_DIR / "node_modules" / "graphile-worker" / "package.json"
    try:
        return str(json.loads(pkg.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def ensure_installed() -> dict[str, Any]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None:
        raise Unavailable("node not found on PATH")
    if installed_version() != VERSION:
        if npm is None:
            raise Unavailable("npm not found on PATH")
        INSTALL_DIR.mkdir(parents=True, exist_ok=True)
        pkg = INSTALL_DIR / "package.json"
        if not pkg.exists():
            pkg.write_text(json.dumps({"name": "connector-bench-graphile-worker", "private": True}) + "\n")
        print(f"peer: npm install graphile-worker@{VERSION} into {INSTALL_DIR}", flush=True)
        try:
            proc = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--save-exact", f"graphile-worker@{VERSION}"],
                cwd=INSTALL_DIR,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise Unavailable(f"npm install graphile-worker@{VERSION} timed out") from exc
        if proc.returncode != 0 or installed_version() != VERSION:
            why = last_line(proc.stderr) or last_line(proc.stdout)
            raise Unavailable(f"npm install graphile-worker@{VERSION} failed: {why}")
    node_version = subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {"peer": "graphile-worker", "version": VERSION, "node": node_version, "node_bin": node}


def run_one(cfg: PeerConfig, *, items: int, cap_s: float, node: str) -> dict[str, Any]:
    with common.fresh_database("gw") as url:
        config = {
            "connectionString": url,
            "items": items,
            "concurrency": common.WORKERS,
            "queues": cfg.options["queues"],
            "batched": cfg.options["batched"],
            "localQueueSize": LOCAL_QUEUE_SIZE,
            "completeJobBatchDelay": BATCH_DELAY_MS,
            "capMs": int(cap_s * 1000),
        }
        env = {
            "BENCH_CONFIG": json.dumps(config),
            "NODE_PATH": str(INSTALL_DIR / "node_modules"),
            "NO_LOG_SUCCESS": "1",
        }
        return run_json([node, str(SCRIPT)], env=env, timeout=cap_s + 180)


def main(argv: list[str] | None = None) -> int:
    parser = common.stage_argparser(__doc__)
    parser.add_argument(
        "--items", type=int, default=None, help="jobs per run (default: the shared drain count)"
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per configuration; the median is reported"
    )
    args = parser.parse_args(argv)
    items = args.items or common.drain_items(args.quick)
    cap_s = CAP_S_QUICK if args.quick else CAP_S_FULL
    try:
        info = ensure_installed()
    except Unavailable as exc:
        rows = [common.unavailable_row(c.key, c.name, UNIT, str(exc), scenario=c.scenario) for c in configs()]
        common.write_json_out(args.json_out, rows)
        print(f"peer: graphile-worker not available: {exc}", file=sys.stderr)
        return 0
    node = info.pop("node_bin")
    extra = {**info, "workers": common.WORKERS, "max_pool_size": common.WORKERS + 1, "cap_s": cap_s}
    with common.bench_lock():
        rows = measure(
            configs(),
            lambda c: run_one(c, items=items, cap_s=cap_s, node=node),
            repeat=args.repeat,
            unit=UNIT,
            common_extra=extra,
        )
    common.write_json_out(args.json_out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
