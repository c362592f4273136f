"""The console in a real browser (Debian's chromium, driven by Playwright) against real processes: a
``connector executor`` (claims + admin API) and a ``connector console`` over a fresh database seeded
with dead letters in lanes, a blocked lane, a forced-open circuit, a paused pack, a cutover in
progress and registered processes (tests/console/stage.py).

What a person would do and see: log in, every page at 1280 px and at phone width, light and dark
(screenshots under ``build/console-screenshots/``, the copies in docs/console/ come from there); a
grouped bulk replay of 60 dead letters from the UI (estimate, confirmation naming the count,
progress, done) after which the database shows each ran exactly once, in lane order; pause and
resume a pack; a read-only session sees no action control and its forged POST is refused and writes
nothing; no payload for a role without payload access; the CSP header on every page, no CSP
violation or console error, no request to another origin; the actions reachable with the keyboard.
"""

from __future__ import annotations

import asyncio
import html
import itertools
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from connector.v1 import admin_service_pb2 as pb
from tests.admin.conftest import TOKENS

from .conftest import OPERATOR, VIEW, Seed, digest
from .stage import CIRCUIT_TARGET, Scene, stage

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CONNECTOR = str(Path(sys.executable).with_name("connector"))
CHROMIUM = os.environ.get("CONNECTOR_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("CONNECTOR_CONSOLE_SCREENSHOTS", ROOT / "build" / "console-screenshots"))
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
]  # fmt: skip
DEAD, LANES = 60, 6
SECRET = "do-not-leak"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{what} did not listen on {port}:\n{log.read_text()[-3000:]}")


@dataclass
class Stack:
    base: str
    db_url: str
    folder: Path
    scene: Scene
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def calls(self) -> list[tuple[int, int]]:
        path = self.folder / "calls"
        if not path.exists():
            return []
        return [(int(a), int(b)) for a, b in (line.split() for line in path.read_text().splitlines())]


@pytest.fixture
def browser_path() -> str:
    if not Path(CHROMIUM).exists():
        message = (
            f"no browser at {CHROMIUM}: install Debian's chromium (apt-get install chromium chromium-driver;"
            " ./dev test runs scripts/install-browser.sh) or set CONNECTOR_TEST_CHROMIUM"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


@pytest_asyncio.fixture
async def stack(db_url: str, adb: psycopg.AsyncConnection, tmp_path: Path) -> AsyncIterator[Stack]:
    seed = Seed(adb)
    with psycopg.connect(db_url, autocommit=True) as db:
        scene = await stage(seed, db, dead=DEAD, lanes=LANES)
    # the dead letters' work type runs tests/console/handlers.py:flaky (records every execution)
    await adb.execute(
        "UPDATE connector_pack_generation SET manifest = jsonb_set(manifest,"
        " '{work_types,sync,handler,target}', to_jsonb('tests.console.handlers:flaky'::text))"
        " WHERE installed_pack_id = %s",
        (scene.shop,),
    )
    admin_port, console_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    env.update(
        CONNECTOR_DATABASE_URL=db_url,
        CONNECTOR_ADMIN_TOKENS=TOKENS,
        CONNECTOR_EXECUTOR_GRPC_PORT=str(admin_port),
        CONNECTOR_EXECUTOR_METRICS_PORT=str(_free_port()),
        CONNECTOR_EXECUTOR_POLL_INTERVAL_S="0.2",
        CONNECTOR_LOG_LEVEL="INFO",
        CONSOLE_TEST_DIR=str(tmp_path),
        PYTHONPATH=str(ROOT),
    )
    stack = Stack(f"http://127.0.0.1:{console_port}", db_url, tmp_path, scene)
    logs = []
    try:
        for what, argv, port in (
            ("executor", [CONNECTOR, "executor"], admin_port),
            ("console", [CONNECTOR, "console", "--port", str(console_port),
                         "--admin-address", f"127.0.0.1:{admin_port}"], console_port),
        ):  # fmt: skip
            log = tmp_path / f"{what}.log"
            logs.append(log)
            proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)
            stack.procs.append(proc)
            await asyncio.to_thread(_wait_port, port, proc, log, what)
        # the operator actions of the scene, through the real admin API
        import grpc

        from connector.v1 import admin_service_pb2_grpc

        channel = grpc.aio.insecure_channel(f"127.0.0.1:{admin_port}")
        stub = admin_service_pb2_grpc.AdminServiceStub(channel)
        md = (("authorization", f"Bearer {OPERATOR}"),)
        await stub.OpenCircuit(
            pb.OpenCircuitRequest(
                installed_pack_id=scene.crm, target=CIRCUIT_TARGET, reason="crm maintenance"
            ),
            metadata=md,
        )
        await stub.PausePack(
            pb.PausePackRequest(installed_pack_id=scene.crm, reason="INC-42 outage"), metadata=md
        )
        await channel.close()
        yield stack
    finally:
        for proc in stack.procs:
            proc.terminate()
        for proc in stack.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        for log in logs:  # nothing secret reached a log line
            text = log.read_text()
            assert OPERATOR not in text and VIEW not in text and SECRET not in text, log.name


class Watch:
    """What a page did besides rendering: requests to other origins, CSP violations, console errors."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.foreign: list[str] = []
        self.problems: list[str] = []

    def attach(self, page: Any) -> None:
        page.on(
            "request",
            lambda r: None if r.url.startswith((self.base, "data:")) else self.foreign.append(r.url),
        )
        page.on("console", lambda m: self.problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: self.problems.append(str(e)))


@pytest_asyncio.fixture
async def pw() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        yield p


async def _login(context: Any, base: str, token: str, watch: Watch) -> Any:
    page = await context.new_page()
    watch.attach(page)
    response = await page.goto(base + "/")
    assert page.url.startswith(base + "/login")
    assert response is not None and "script-src 'self'" in response.headers["content-security-policy"]
    await page.fill("#token", token)
    await page.press("#token", "Enter")  # keyboard: the form submits
    await page.wait_for_selector("h1:text-is('Overview')")
    return page


PAGES = [
    ("overview", "/"),
    ("deliveries", "/deliveries?namespace=shop"),
    ("delivery", None),  # the first dead letter's delivery
    ("failures", "/failures"),
    ("failure-group", None),
    ("lanes", "/lanes"),
    ("cutover", "/cutover"),
    ("processes", "/processes"),
]


async def _shoot(page: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


async def test_the_console_in_a_browser(browser_path: str, stack: Stack, pw: Any) -> None:
    scene, base = stack.scene, stack.base
    browser = await pw.chromium.launch(executable_path=browser_path, args=ARGS)
    watch = Watch(base)
    try:
        context = await browser.new_context(viewport={"width": 1280, "height": 900})
        page = await _login(context, base, OPERATOR, watch)
        cookie = next(c for c in await context.cookies() if c["name"] == "connector_console")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

        # 1. every page, with what it must show; screenshots at 1280 px (light and dark) and 390 px
        group_path = (
            f"/failures/group?pack={scene.shop}&work_type=sync&failure_class=downstream_rejected"
            "&summary=crm+refused+the+change%3A+422"
        )
        expect = {
            "overview": [
                "Accepted / s" if hasattr(pb, "GetFiguresRequest") else "Unrouted receipts",
                "Packs",
            ],
            "deliveries": [str(scene.receipt_of_dead), "dead"],
            "delivery": ["Timeline", "Why not running", "Replay work item", "executor-91c2", "lease token 3"],
            "failures": [f"Review {DEAD}", "crm refused the change: 422", "Failed receipts"],
            "failure-group": ["Estimate replay", "all dead letters matching this group"],
            "lanes": ["post:inv-7", CIRCUIT_TARGET, "open (forced)", "INC-42 outage", "Rate-limit keys"],
            "cutover": ["legacy", "quiescing", "Complete the cutover"],
            "processes": ["4242", "stale", "executor"],
        }
        for name, path in PAGES:
            target = path or (f"/deliveries/{scene.receipt_of_dead}" if name == "delivery" else group_path)
            response = await page.goto(base + target)
            assert response is not None and response.status == 200, (name, response and response.status)
            csp = response.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "unsafe" not in csp and "frame-ancestors 'none'" in csp
            text = await page.text_content("main") or ""
            for needle in expect[name]:
                assert needle in text, (name, needle)
            if name == "overview":  # live: it polls while visible, and stops while the tab is hidden
                await page.wait_for_selector("#queue-table table")  # loaded once with the page
                async with page.expect_request(
                    lambda r: "/overview/live?pack=0&window=hour" in r.url, timeout=30_000
                ):
                    pass
                await page.evaluate(
                    "Object.defineProperty(document, 'hidden', {value: true, configurable: true})"
                )
                polled: list[str] = []

                def poll(r: Any, seen: list[str] = polled) -> None:
                    if "/overview/live?" in r.url:
                        seen.append(r.url)

                page.on("request", poll)
                await asyncio.sleep(11)  # more than two 5 s periods
                page.remove_listener("request", poll)
                assert polled == [], polled
                await page.evaluate(
                    "Object.defineProperty(document, 'hidden', {value: false, configurable: true})"
                )
            await _shoot(page, f"{name}-1280")
        dark = await browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="dark")
        phone = await browser.new_context(viewport={"width": 390, "height": 844})
        for ctx, suffix in ((dark, "1280-dark"), (phone, "390")):
            p = await _login(ctx, base, OPERATOR, watch)
            for name, path in PAGES:
                target = path or (
                    f"/deliveries/{scene.receipt_of_dead}" if name == "delivery" else group_path
                )
                await p.goto(base + target)
                if suffix == "390":  # usable at phone width: no page-wide horizontal scroll
                    wide = await p.evaluate("document.documentElement.scrollWidth")
                    assert wide <= 390, (name, wide)
                await _shoot(p, f"{name}-{suffix}")
            if suffix == "1280-dark":
                bg = await p.evaluate("getComputedStyle(document.body).backgroundColor")
                assert bg == "rgb(13, 17, 23)", bg

        # 2. keyboard: from the top of the delivery page, Tab reaches the replay button
        await page.goto(base + f"/deliveries/{scene.receipt_of_dead}")
        reached = False
        for _ in range(60):
            await page.keyboard.press("Tab")
            label = await page.evaluate("document.activeElement && document.activeElement.textContent")
            if label and label.startswith("Replay work item"):
                reached = True
                break
        assert reached, "the replay button is not reachable with Tab"

        # 3. pause and resume a pack from the Lanes page
        await page.goto(base + "/lanes")
        form = page.locator("form[aria-label='Pause a pack']")
        await form.locator("select[name=pack]").select_option(str(scene.shop))
        await form.locator("input[name=reason]").fill("deploy freeze")
        await form.locator("button[type=submit]").click()
        await page.wait_for_selector(f".flash:text('pack {scene.shop} paused')")
        with psycopg.connect(stack.db_url) as db:
            row = db.execute(
                "SELECT reason, actor FROM connector_pause WHERE installed_pack_id = %s", (scene.shop,)
            ).fetchone()
        assert row is not None and row[0] == "deploy freeze" and row[1].startswith("key:")
        await page.click("button:text('Resume shop')")
        await page.wait_for_selector(f".flash:text('pack {scene.shop} resumed')")
        with psycopg.connect(stack.db_url) as db:
            gone = db.execute(
                "SELECT count(*) FROM connector_pause WHERE installed_pack_id = %s", (scene.shop,)
            )
            assert gone.fetchone() == (0,)

        # 4. the grouped bulk replay of 60 dead letters, from the Failures page
        assert stack.calls() == []  # the executor ran none of them yet (they are dead)
        await page.goto(base + "/failures")
        await page.click(f"a:text('Review {DEAD}')")
        await page.check("input[name=scope][value=all]")
        await page.click("button:text('Estimate replay')")
        await page.wait_for_selector(f"h1:text('Replay {DEAD} dead letters?')")
        estimate = await page.inner_text("main")
        assert f"Lanes\n{LANES}" in estimate or f"Lanes\t{LANES}" in estimate, estimate
        await _shoot(page, "bulk-estimate-1280")
        page.once("dialog", lambda d: asyncio.ensure_future(d.accept()))  # the confirmation names the count
        confirm_text: list[str] = []
        page.once("dialog", lambda d: confirm_text.append(d.message))
        await page.click(f"button:text('Replay {DEAD} dead letters')")
        await page.wait_for_url(re.compile(r".*/jobs/[0-9a-f]+$"))
        assert confirm_text and confirm_text[0].startswith(f"Replay {DEAD} dead letters?")
        await page.wait_for_selector("#job-state:text('finished')", timeout=60_000)
        await _shoot(page, "bulk-job-1280")
        assert f"{DEAD} replayed, 0 refused, of {DEAD}" in await page.inner_text("main")

        # the executor ran each exactly once, in lane order
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(stack.calls()) < DEAD:
            await asyncio.sleep(0.2)
        calls = stack.calls()
        ran = [w for w, _ in calls]
        assert sorted(ran) == scene.dead, "each replayed dead letter ran exactly once"
        assert all(attempt == 1 for _, attempt in calls)
        for lane, ids in scene.lanes.items():
            assert [w for w in ran if w in ids] == ids, f"lane {lane} ran out of order"
        with psycopg.connect(stack.db_url) as db:
            rows = db.execute(
                "SELECT source_lane_key, work_id, state, attempts, replay_count, started_at, finished_at"
                " FROM connector_work_item WHERE work_id = ANY(%s) ORDER BY source_lane_key, delivery_seq",
                (scene.dead,),
            ).fetchall()
        assert {(r[2], r[3], r[4]) for r in rows} == {("succeeded", 1, 1)}
        for a, b in itertools.pairwise(rows):
            if a[0] == b[0]:  # the next member of a lane started after the previous one finished
                assert b[5] >= a[6], (a, b)

        # 5. a read-only session: no action control anywhere; a forged POST is refused, writes nothing
        view_ctx = await browser.new_context(viewport={"width": 1280, "height": 900})
        view = await _login(view_ctx, base, VIEW, watch)
        for name, path in PAGES:
            target = path or (f"/deliveries/{scene.receipt_of_dead}" if name == "delivery" else group_path)
            await view.goto(base + target)
            actions = await view.eval_on_selector_all(
                "form[method=post]", "fs => fs.map(f => f.getAttribute('action'))"
            )
            assert actions == ["/logout"], (name, actions)
            assert SECRET not in await view.content()
        csrf = await view.get_attribute("meta[name=csrf-token]", "content")
        async with await psycopg.AsyncConnection.connect(stack.db_url, autocommit=True) as adb:
            before = await digest(adb)
            forged = await view.request.post(
                base + "/packs/pause",
                form={"pack": str(scene.shop), "reason": "forged", "csrf": csrf or ""},
                headers={"Origin": base},
            )
            assert forged.status == 403
            no_csrf = await view.request.post(
                base + "/packs/pause",
                form={"pack": str(scene.shop), "reason": "forged"},
                headers={"Origin": base},
            )
            assert no_csrf.status == 403
            assert await digest(adb) == before
        status = await view.request.get(base + f"/deliveries/{scene.receipt_of_dead}?payload=1")
        assert status.status == 403 and SECRET not in html.unescape(await status.text())

        # nothing left for another origin; no CSP violation, no script error, no failed load
        assert not watch.foreign, watch.foreign
        assert not watch.problems, watch.problems
    finally:
        await browser.close()
