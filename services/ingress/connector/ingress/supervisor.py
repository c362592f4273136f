"""``connector ingress --workers N|auto`` (``--processes`` is the same option): N ingress worker
processes on one HTTP and one gRPC port; ``auto`` is the container's CPU count (``container_cpus``).

The ingress is CPU-bound in one process (HTTP parsing, HMAC, JSON: ~90 µs per delivery). The unit of
scale is a process; on one host, N workers share the listening ports with ``SO_REUSEPORT`` and
the kernel spreads new connections across them. Each worker is an ordinary ``connector ingress``
process (own pool, own group-commit writers, own ``connector_process`` row), started with
``--worker`` (bind with ``SO_REUSEPORT``; metrics on ``metrics_port + index``, or an ephemeral port
when ``metrics_port`` is 0).

The supervisor (this module, no event loop, no database) only keeps the workers running:

* a worker reports that it is serving by writing one byte to a pipe the supervisor gave it
  (``CONNECTOR_INGRESS_READY_FD``) once its servers are up;
* a worker that exits while the supervisor runs is started again after a back-off (1 s, doubling
  to 30 s while it keeps exiting before it served for ``STARTUP_S``; reset after it served
  longer);
* ``STARTUP_FAILURES`` consecutive exits of one worker *before it reported serving* (a port in
  use, a database that does not answer, bad settings) stop everything: exit code 1, the workers'
  own logs say why;
* SIGTERM / SIGINT is forwarded to every worker, which stops as a single ingress does (stop
  accepting, in-flight requests commit, writers drain, deregister); a worker still running after
  ``shutdown_grace_s + 5`` s is killed. Exit code 0.

Ports must be fixed (non-zero): workers of an ephemeral port would each get a different one.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

STARTUP_S = 10.0
STARTUP_FAILURES = 3
BACKOFF_MAX_S = 30.0


READY_FD_ENV = "CONNECTOR_INGRESS_READY_FD"
#: Where a container's CPU limit is (cgroup v2 ``cpu.max``; v1 quota and period).
CGROUP_ROOT = "/sys/fs/cgroup"


def container_cpus(cgroup_root: str = CGROUP_ROOT) -> int:
    """The CPUs this process may use: the CPUs it may run on, lowered to its cgroup's CPU limit
    rounded up (a container limited to 1.5 CPUs gets 2 workers), at least 1. ``--workers auto``."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = period = None
    try:
        with open(os.path.join(cgroup_root, "cpu.max")) as f:
            text = f.read().split()
        if text and text[0] != "max":
            quota, period = int(text[0]), int(text[1])
    except (OSError, ValueError, IndexError):
        try:
            with open(os.path.join(cgroup_root, "cpu", "cpu.cfs_quota_us")) as f:
                q = int(f.read())
            with open(os.path.join(cgroup_root, "cpu", "cpu.cfs_period_us")) as f:
                p = int(f.read())
            if q > 0 and p > 0:
                quota, period = q, p
        except (OSError, ValueError):
            pass
    if quota is not None and period:
        cpus = min(cpus, -(-quota // period))
    return max(1, cpus)


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    ready_r: int | None = None
    ready: bool = False
    started_at: float = 0.0
    restart_at: float = 0.0
    backoff_s: float = 1.0
    restarts: int = 0
    fast_failures: int = 0
    last_codes: list[int] = field(default_factory=list)


def worker_command(index: int, args: Sequence[str]) -> list[str]:
    """The command line of worker ``index``: this interpreter running the ``connector`` CLI."""
    return [sys.executable, "-m", "connector.cli.main", "ingress", "--worker", str(index), *args]


def supervise(n: int, args: Sequence[str], *, grace_s: float, poll_s: float = 0.2) -> int:
    """Run ``n`` workers until SIGTERM/SIGINT; returns the process exit code."""
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    workers = [_Worker(i) for i in range(n)]
    code = 0
    try:
        for w in workers:
            _start(w, args)
        log.info(
            "ingress supervisor started",
            extra={"workers": n, "pids": [w.proc.pid for w in workers if w.proc]},
        )
        while not stopping:
            now = time.monotonic()
            for w in workers:
                _poll_ready(w)
                if w.proc is not None and (rc := w.proc.poll()) is not None:
                    _poll_ready(w)
                    ran = now - w.started_at
                    w.proc = None
                    _close_ready(w)
                    w.last_codes = [*w.last_codes[-4:], rc]
                    if not w.ready:
                        w.fast_failures += 1
                    else:
                        w.fast_failures = 0
                    if not w.ready or ran < STARTUP_S:
                        w.backoff_s = min(BACKOFF_MAX_S, w.backoff_s * 2) if w.restarts else 1.0
                    else:
                        w.backoff_s = 1.0
                    if w.fast_failures >= STARTUP_FAILURES:
                        log.error(
                            "ingress worker keeps failing at start; stopping all workers (its log says why)",
                            extra={"worker": w.index, "exit_codes": w.last_codes},
                        )
                        code = 1
                        stopping = True
                        break
                    w.restart_at = now + w.backoff_s
                    log.warning(
                        "ingress worker exited; restarting",
                        extra={
                            "worker": w.index,
                            "exit_code": rc,
                            "ran_s": round(ran, 1),
                            "in_s": w.backoff_s,
                        },
                    )
                if w.proc is None and not stopping and now >= w.restart_at:
                    w.restarts += 1
                    _start(w, args)
            if not stopping:
                time.sleep(poll_s)
    finally:
        _stop_all(workers, grace_s + 5.0)
        for w in workers:
            _close_ready(w)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("ingress supervisor stopped", extra={"exit_code": code})
    return code


def _start(w: _Worker, args: Sequence[str]) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    env = {**os.environ, READY_FD_ENV: str(write_fd)}
    try:
        # Our own interpreter and CLI, with the supervisor's validated settings: no outside input.
        w.proc = subprocess.Popen(worker_command(w.index, args), env=env, pass_fds=(write_fd,))  # noqa: S603
    finally:
        os.close(write_fd)
    w.ready_r, w.ready = read_fd, False
    w.started_at = time.monotonic()


def _poll_ready(w: _Worker) -> None:
    if w.ready or w.ready_r is None:
        return
    try:
        if os.read(w.ready_r, 1):
            w.ready = True
            _close_ready(w)
    except BlockingIOError:
        pass


def _close_ready(w: _Worker) -> None:
    if w.ready_r is not None:
        os.close(w.ready_r)
        w.ready_r = None


def report_ready() -> None:
    """In a worker: tell the supervisor (if any) that this process is serving."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"r")
        os.close(int(fd))
    except OSError:
        pass  # the supervisor is gone; nothing to tell


def _stop_all(workers: Sequence[_Worker], limit_s: float) -> None:
    running = [w.proc for w in workers if w.proc is not None and w.proc.poll() is None]
    for p in running:
        p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + limit_s
    for p in running:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("ingress worker did not stop in time; killing it", extra={"pid": p.pid})
            p.kill()
            p.wait(5)
