"""The README's "First hour", run as written (#24): ``connector up`` in one process, then each command
of the README's block in a new shell from the same folder (``. .data/env`` first): send a delivery,
make one fail, find the dead letter, trace it, dry-run and replay it, see it succeed. WORK_ID and
RECEIPT are taken from the previous commands' output, as a reader does; between sending the failing
delivery and listing dead letters the test waits for the dead letter (the state, not a time). The
``connector up`` log shows one readable line per accepted delivery, dead letter and replay."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONNECTOR = str(Path(sys.executable).with_name("connector"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def readme_block() -> list[str]:
    """The commands of the README's "First hour" code block (comments stripped)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## First hour") :]
    block = section[section.index("```sh\n") + 6 : section.index("```\n", section.index("```sh\n") + 6)]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_readme_block_is_the_walk() -> None:
    assert readme_block()[0] == ". .data/env"
    assert any(c.startswith("connector demo send --fail") for c in readme_block())
    assert any(c.startswith("connector admin dlq replay WORK_ID") for c in readme_block())


def _shell(cwd: Path, env: dict[str, str], command: str) -> subprocess.CompletedProcess[str]:
    """A new shell in ``cwd``: only ``PATH`` without the virtualenv, ``HOME``, then the README's
    command (after ``. .data/env`` like the README's first line)."""
    return subprocess.run(
        ["bash", "-c", f". .data/env && {command}"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _dead_letters(cwd: Path, env: dict[str, str]) -> list[dict]:
    proc = _shell(cwd, env, "connector admin dlq list --json")
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout).get("dead_letters", []))


def test_first_hour_as_the_readme_says(tmp_path: Path, db_url: str) -> None:
    ports = {
        name: str(_free_port())
        for name in (
            "CONNECTOR_INGRESS_HTTP_PORT",
            "CONNECTOR_INGRESS_GRPC_PORT",
            "CONNECTOR_INGRESS_METRICS_PORT",
            "CONNECTOR_MATERIALIZER_GRPC_PORT",
            "CONNECTOR_MATERIALIZER_METRICS_PORT",
            "CONNECTOR_EXECUTOR_GRPC_PORT",
            "CONNECTOR_EXECUTOR_METRICS_PORT",
        )
    }
    up_env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    up_env.update(ports, CONNECTOR_DATA_DIR=".data", CONNECTOR_DATABASE_URL=db_url)
    # The second shell: no virtualenv on PATH, no CONNECTOR_* but what .data/env sets. (The test's
    # database URL is the caller's own, so `connector up` does not write it: the walk needs none.)
    bare = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    up = subprocess.Popen(
        [CONNECTOR, "up"], cwd=tmp_path, env=up_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert up.stdout is not None
        banner = []
        for line in up.stdout:
            banner.append(line)
            if "press Ctrl-C to stop" in line:
                break
        else:
            pytest.fail(f"connector up exited ({up.wait()}): {''.join(banner)}{up.stderr.read()}")
        commands = readme_block()
        assert commands[0] == ". .data/env"
        outputs: dict[str, str] = {}
        receipt = work_id = ""
        for command in commands[1:]:
            if command.startswith("connector admin dlq list"):
                # The failing delivery is a dead letter after its 3 attempts (a second or two).
                deadline = time.monotonic() + 60
                while not (dead := _dead_letters(tmp_path, bare)):
                    assert time.monotonic() < deadline, "no dead letter within 60 s"
                    time.sleep(0.2)
                work_id = str(dead[0]["work_item"]["work_id"])
            literal = command.replace("RECEIPT", receipt).replace("WORK_ID", work_id)
            if command.startswith("connector admin find --work-id"):
                deadline = time.monotonic() + 60
                while "deliver=succeeded" not in _shell(tmp_path, bare, literal).stdout:
                    assert time.monotonic() < deadline, "the replayed item did not succeed within 60 s"
                    time.sleep(0.2)
            proc = _shell(tmp_path, bare, literal)
            assert proc.returncode == 0, f"{literal}: {proc.stdout}{proc.stderr}"
            outputs[command] = proc.stdout
            if command.startswith("connector demo send --fail"):
                receipt = re.search(r"receipt (\d+)", proc.stdout).group(1)  # type: ignore[union-attr]
        assert "HTTP 200" in outputs["connector demo send"]
        assert (
            work_id in outputs["connector admin dlq list"]
            and "DemoTargetDown" in (outputs["connector admin dlq list"])
        )
        assert f"receipt {receipt}" in outputs["connector admin trace RECEIPT"]
        assert "dry run: these would be replayed" in outputs["connector admin dlq replay WORK_ID --dry-run"]
        assert "pending" in outputs["connector admin dlq replay WORK_ID"]
        assert "deliver=succeeded" in outputs["connector admin find --work-id WORK_ID"]
    finally:
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=60)
    assert up.returncode == 0, err
    for line in ("delivery accepted", "work item dead-lettered", "work item replayed"):
        assert line in err, err
    assert "Traceback" not in err
