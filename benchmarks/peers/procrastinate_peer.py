"""Peer: Procrastinate (PyPI), drained by benchmarks/peers/procrastinate_driver.py.

    .venv/bin/python -m benchmarks.peers.procrastinate_peer [--quick] [--json-out PATH] [--items N]
        [--repeat R]

Creates a throwaway venv ``.bench/peers/procrastinate-venv`` (once; again when the pinned version
changes), installs ``procrastinate==VERSION`` with ``psycopg[binary]`` into it, and measures two
configurations, each on a fresh database with Procrastinate's own schema and the same no-op
workload as our executor: one worker with ``concurrency`` 16 and a connection pool of 17, and
- no locks;
- 100 locks (``lock`` random among 100 values: jobs sharing a lock run one at a time, in order:
  the analogue of our source lanes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.peers import PeerConfig, Unavailable, last_line, measure, run_json

VERSION = "3.10.0"
VENV_DIR = common.PEERS_DIR / "procrastinate-venv"
DRIVER = Path(__file__).with_name("procrastinate_driver.py")
CAP_S_FULL = 90.0
CAP_S_QUICK = 8.0
UNIT = "jobs/s"


def configs() -> list[PeerConfig]:
    return [
        PeerConfig(
            key="peer.procrastinate",
            name=f"procrastinate {VERSION}, no locks",
            scenario="drain",
            options={"locks": 0},
        ),
        PeerConfig(
            key="peer.procrastinate.locks",
            name=f"procrastinate {VERSION}, {common.LANES} locks",
            scenario="drain_lanes",
            options={"locks": common.LANES},
        ),
    ]


def _python() -> Path:
    return VENV_DIR / "bin" / "python"


def installed_versions() -> dict[str, str] | None:
    if not _python().exists():
        return None
    probe = (
        "import json, importlib.metadata as m; "
        "print(json.dumps({p: m.version(p) for p in ('procrastinate', 'psycopg', 'psycopg-pool')}))"
    )
    proc = subprocess.run([str(_python()), "-c", probe], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None
    try:
        return dict(json.loads(proc.stdout))
    except ValueError:
        return None


def ensure_installed() -> dict[str, Any]:
    versions = installed_versions()
    if versions is None or versions.get("procrastinate") != VERSION:
        print(f"peer: pip install procrastinate=={VERSION} into {VENV_DIR}", flush=True)
        try:
            if not _python().exists():
                venv.EnvBuilder(with_pip=True, clear=True).create(VENV_DIR)
        except Exception as exc:
            raise Unavailable(f"cannot create a venv for procrastinate: {exc}") from exc
        try:
            proc = subprocess.run(
                [str(_python()), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                 f"procrastinate=={VERSION}", "psycopg[binary,pool]"],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise Unavailable(f"pip install procrastinate=={VERSION} timed out") from exc
        versions = installed_versions()
        if proc.returncode != 0 or versions is None or versions.get("procrastinate") != VERSION:
            raise Unavailable(f"pip install procrastinate=={VERSION} failed: {last_line(proc.stderr)}")
    return {"peer": "procrastinate", "version": VERSION, "packages": versions}


def run_one(cfg: PeerConfig, *, items: int, cap_s: float) -> dict[str, Any]:
    with common.fresh_database("procrastinate") as url:
        config = {
            "conninfo": url,
            "items": items,
            "concurrency": common.WORKERS,
            "locks": cfg.options["locks"],
            "pool_size": common.WORKERS + 1,
            "cap_s": cap_s,
        }
        return run_json(
            [str(_python()), "-I", str(DRIVER)], env={"BENCH_CONFIG": json.dumps(config)}, timeout=cap_s + 180
        )


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
        print(f"peer: procrastinate not available: {exc}", file=sys.stderr)
        return 0
    extra = {**info, "workers": common.WORKERS, "pool_size": common.WORKERS + 1, "cap_s": cap_s}
    with common.bench_lock():
        rows = measure(
            configs(),
            lambda c: run_one(c, items=items, cap_s=cap_s),
            repeat=args.repeat,
            unit=UNIT,
            common_extra=extra,
        )
    common.write_json_out(args.json_out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
