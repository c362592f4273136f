"""Peer job queues measured beside ours: each installs into its own throwaway environment under
``.bench/peers/`` and drains the same no-op workload (``benchmarks.common.drain_items``,
``WORKERS`` at a time, optionally spread over ``LANES`` serial lanes) on a fresh database of the
test server. Absence of a peer's toolchain or package is reported as "not available", never faked."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks import common


class Unavailable(Exception):
    """The peer cannot be measured here (toolchain or package missing); the message says why."""


@dataclass(frozen=True)
class PeerConfig:
    key: str
    name: str
    scenario: str
    options: dict[str, Any] = field(default_factory=dict)


def last_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return common.redact((lines[-1] if lines else "")[:limit])


def run_json(
    cmd: Sequence[str], *, env: dict[str, str], timeout: float, cwd: str | None = None
) -> dict[str, Any]:
    """Run a driver that prints one JSON object as its last stdout line; raise with its last stderr
    line when it fails."""
    try:
        proc = subprocess.run(
            list(cmd),
            env={**os.environ, **env},
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"driver timed out after {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise RuntimeError(
            f"driver exited {proc.returncode}: {last_line(proc.stderr) or last_line(proc.stdout)}"
        )
    try:
        return dict(json.loads(last_line(proc.stdout, limit=100_000)))
    except ValueError as exc:
        raise RuntimeError(f"driver printed no JSON result: {last_line(proc.stdout)}") from exc


def measure(
    configs: Sequence[PeerConfig],
    run_one: Callable[[PeerConfig], dict[str, Any]],
    *,
    repeat: int,
    unit: str,
    common_extra: dict[str, Any],
) -> list[dict[str, Any]]:
    """Run each configuration ``repeat`` times (fresh database each time, by ``run_one``) and make
    one row per configuration: the median rate, every sample in ``extra``. A configuration that
    fails is reported as unavailable with the reason."""
    rows = []
    for cfg in configs:
        samples: list[dict[str, Any]] = []
        error: str | None = None
        for i in range(repeat):
            print(f"peer: {cfg.name} (run {i + 1}/{repeat})", flush=True)
            try:
                samples.append(run_one(cfg))
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                break
        if error is not None or not samples:
            rows.append(
                common.unavailable_row(
                    cfg.key, cfg.name, unit, error or "no sample", scenario=cfg.scenario, extra=common_extra
                )
            )
            continue
        value = common.median(s["jobs_per_s"] for s in samples)
        extra = {
            **common_extra,
            **cfg.options,
            "repeat": len(samples),
            "samples_per_s": [round(s["jobs_per_s"], 1) for s in samples],
            "items": samples[0]["items"],
            "executed": [s["executed"] for s in samples],
            "capped": any(s.get("capped") for s in samples),
            "drain_s": [round(s["drain_s"], 3) for s in samples],
            "enqueue_per_s": [round(s["enqueue_per_s"], 1) for s in samples],
        }
        name = cfg.name
        if extra["capped"]:
            least = min(s["executed"] for s in samples)
            name += f" [capped at {common_extra.get('cap_s', '?')} s: {least:,} of {extra['items']:,} run]"
        print(f"peer: {name}: {common.fmt_value(value)} {unit}", flush=True)
        rows.append(common.make_row(cfg.key, name, value, unit, scenario=cfg.scenario, extra=extra))
    return rows
