"""Helpers for tests that run ``connector ingress`` as a real process."""

from __future__ import annotations

import subprocess
import time
import urllib.request


def wait_ready(proc: subprocess.Popen[bytes], port: int, timeout: float = 30.0) -> None:
    """Poll ``/readyz`` on ``port`` until it answers 200; fail if the process exits first."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.05)
