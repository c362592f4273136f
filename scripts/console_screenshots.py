"""The console's screenshots in docs/console/, taken from real deliveries (issue #25): ``connector up``
(ingress, materializer, executor, console, the demo pack) over a fresh database, then what an
operator does in a second shell — ``connector demo send`` (deliveries that succeed) and ``--fail``
(dead letters), a circuit opened and a pack paused with ``connector admin``, deliveries held by them,
a rollback to the legacy path and a cutover started (quiescing) — and every console page in Debian's
chromium (Playwright), logged in through the one-time link of ``connector up``'s banner: 1280 px
light and dark, 390 px. Nothing is written into a table directly.

    .venv/bin/python scripts/console_screenshots.py [--out docs/console] [--keep]

Needs /usr/bin/chromium (scripts/install-browser.sh) and a PostgreSQL server (the tests' one,
``CONNECTOR_TEST_DATABASE_URL`` or 127.0.0.1:5432; a fresh database is created and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONNECTOR = str(Path(sys.executable).with_name("connector"))
CHROMIUM = os.environ.get("CONNECTOR_TEST_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
TARGET = "python:connector.cli.demo:deliver"  # the demo's deliver work type: its circuit target


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Up:
    """``connector up`` in a folder of its own, and a second shell there (``. .data/env``)."""

    def __init__(self, folder: Path, db_url: str) -> None:
        self.folder = folder
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
        ports = ("INGRESS_HTTP", "INGRESS_GRPC", "INGRESS_METRICS", "MATERIALIZER_GRPC",
                 "MATERIALIZER_METRICS", "EXECUTOR_GRPC", "EXECUTOR_METRICS", "CONSOLE")  # fmt: skip
        env.update({f"CONNECTOR_{p}_PORT": str(_free_port()) for p in ports})
        env.update(
            CONNECTOR_DATA_DIR=".data", CONNECTOR_DATABASE_URL=db_url, CONNECTOR_EXECUTOR_STATS_INTERVAL_S="5"
        )
        self.env = env
        self.log = folder / "up.log"
        self.proc = subprocess.Popen(  # noqa: S603 - our own fixed command line
            [CONNECTOR, "up"], cwd=folder, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT
        )

    def banner_link(self, timeout_s: float = 120) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            found = re.search(r"console\s+(http://\S+/login/link/\S+)", text)
            if found and "demo delivery executed" in text:
                return found.group(1)
            if self.proc.poll() is not None:
                raise SystemExit(f"connector up exited:\n{text[-3000:]}")
            time.sleep(0.3)
        raise SystemExit(f"no console link in the banner:\n{self.log.read_text()[-3000:]}")

    def sh(self, command: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
        env["PATH"] = f"{Path(CONNECTOR).parent}:{env.get('PATH', '')}"
        proc = subprocess.run(  # noqa: S603 - the fixed operator commands below
            ["bash", "-c", f". .data/env && {command}"],  # noqa: S607 - a second shell, as the README's
            cwd=self.folder, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise SystemExit(f"{command}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        print(f"$ {command}\n{proc.stdout.strip()}", flush=True)
        return proc.stdout

    def wait(self, what: str, check: Any, timeout_s: float = 90) -> Any:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.5)
        raise SystemExit(f"timed out waiting for {what}\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _dead(up: Up) -> list[dict[str, Any]]:
    return list(json.loads(up.sh("connector admin dlq list --json")).get("dead_letters", []))


def drive(up: Up) -> dict[str, Any]:
    """What an operator does, through the CLI; returns what the pages are about."""
    up.sh("connector demo send --count 24")
    failed = [json.loads(line) for line in up.sh("connector demo send --fail --count 4 --json").splitlines()]
    up.wait("4 dead letters", lambda: len(_dead(up)) >= 4)
    up.sh("connector demo send --count 12")
    return {"receipt_of_dead": failed[0]["receipt_id"]}


def hold(up: Up) -> None:
    """An open circuit and a pause, with deliveries held by each."""
    up.sh(f"connector admin circuit open demo {TARGET} --reason 'INC-7: downstream maintenance until 09:00'")
    up.sh("connector demo send --count 5")  # their deliver items wait for the circuit
    up.sh("connector admin pause demo --reason 'INC-42: provider outage, hold new work'")
    up.sh("connector demo send --count 3")  # every item waits for the pause


def cutover(up: Up) -> None:
    """The demo generation rolled back to the legacy path (its waiting items fenced) and a cutover
    back started: quiescing, the cutover gate's blockers shown by the console's dry run."""
    up.sh("connector admin cutover rollback --pack demo --wait 30")
    up.sh("connector admin cutover quiesce --pack demo")


PATHS = {"overview": "/", "delivery": "/deliveries/{receipt_of_dead}", "lanes": "/lanes",
         "cutover": "/cutover", "processes": "/processes"}  # fmt: skip


async def _shot(page: Any, out: Path, name: str) -> None:
    await page.screenshot(path=str(out / f"{name}.png"), full_page=True)
    print(f"  {name}.png", flush=True)


async def shoot(up: Up, link: str, out: Path, info: dict[str, Any]) -> None:
    """Log in through the banner's link once; the pages before the holds and the cutover (the
    failures, a bulk replay of two dead letters), then the rest after them."""
    from playwright.async_api import async_playwright

    base = link.split("/login/")[0]
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            light = await browser.new_context(viewport={"width": 1280, "height": 900})
            page = await light.new_page()
            await page.goto(link)  # the banner's one-time link
            await page.wait_for_selector("h1:text-is('Overview')")
            cookies = (await light.storage_state())["cookies"]
            dark = await browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="dark")
            phone = await browser.new_context(viewport={"width": 390, "height": 844})
            for ctx in (dark, phone):
                await ctx.add_cookies(cookies)
            dark_page, phone_page = await dark.new_page(), await phone.new_page()

            for name, path in (("deliveries", "/deliveries?namespace=demo"), ("failures", "/failures")):
                await page.goto(base + path)
                await _shot(page, out, f"{name}-1280")
            # a failure group: review it, select two dead letters, estimate, confirm, the job
            await page.click("a:text-matches('^Review [0-9]+$')")
            await page.wait_for_selector("input[name=ids]")
            await _shot(page, out, "failure-group-1280")
            boxes = page.locator("input[name=ids]")
            for i in range(2):
                await boxes.nth(i).check()
            await page.click("button:text('Estimate replay')")
            await page.wait_for_selector("h1:text-matches('^Replay [0-9]+ dead letters?')")
            await _shot(page, out, "bulk-estimate-1280")
            page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
            await page.click("button:text-matches('^Replay [0-9]+ dead letters?$')")
            await page.wait_for_url(re.compile(r".*/jobs/[0-9a-f]+$"))
            await page.wait_for_selector("#job-state:text('finished')", timeout=60_000)
            await _shot(page, out, "bulk-job-1280")

            await asyncio.to_thread(hold, up)
            await asyncio.to_thread(cutover, up)
            await asyncio.sleep(12)  # a figures flush (10 s) and a stats sample after the last change

            for p, suffix, wanted in (
                (page, "1280", ("overview", "delivery", "lanes", "cutover", "processes")),
                (dark_page, "1280-dark", ("overview",)),
                (phone_page, "390", ("delivery", "lanes")),
            ):
                for name in wanted:
                    path = PATHS[name].format(**info)
                    await p.goto(base + path)
                    if name == "overview":
                        await p.wait_for_selector("#queue-table table")
                        await p.wait_for_timeout(800)  # the charts draw once their script ran
                    await _shot(p, out, f"{name}-{suffix}")
        finally:
            await browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "console")
    parser.add_argument("--keep", action="store_true", help="keep the folder and database (printed)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        raise SystemExit(f"no browser at {CHROMIUM}: run scripts/install-browser.sh")
    from connector.common.core import testdb

    db_url = testdb.create_database("console_shots")
    folder = Path(tempfile.mkdtemp(prefix="console-shots-"))
    args.out.mkdir(parents=True, exist_ok=True)
    up = Up(folder, db_url)
    try:
        link = up.banner_link()
        info = drive(up)
        asyncio.run(shoot(up, link, args.out, info))
        print(f"screenshots in {args.out}", flush=True)
    finally:
        up.stop()
        if args.keep:
            print(f"kept: {folder} {db_url}")
        else:
            shutil.rmtree(folder, ignore_errors=True)
            testdb.drop_database(db_url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
