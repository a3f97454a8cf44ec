"""The dashboard in a real browser (headless Debian chromium driven by Playwright): the page of
one node of a busy 3-process cluster shows all 3 members; a member killed with SIGKILL shows as
dead within 2 s; a screenshot is written for humans."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.observe_util import get_json, need, serve_cluster

pytestmark = pytest.mark.timeout(90)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT_ENV = "AIONET_DASHBOARD_SCREENSHOT"  # also save a copy here (docs/img/dashboard.png)


def test_dashboard_shows_members_and_a_killed_one_dead(spawn, tmp_path: Path):
    chromium = need("chromium", "chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])")
    nodes = serve_cluster(spawn, 3, busy=True)  # traffic and tasks, for the charts
    url = f"http://127.0.0.1:{nodes[0][1]}"
    deadline = time.monotonic() + 20
    while len([m for m in get_json(url + "/status")["members"].values() if m["state"] == "alive"]) < 3:
        assert time.monotonic() < deadline, "the 3 nodes did not converge"
        time.sleep(0.1)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium, args=CHROMIUM_ARGS, headless=True,
            viewport={"width": 1400, "height": 1000},
        )  # fmt: skip
        try:
            page = browser.new_page()
            page.goto(url + "/", wait_until="domcontentloaded")
            page.wait_for_function(
                "document.querySelectorAll('#members tr[data-state=alive]').length === 3", timeout=10_000
            )
            assert page.locator("#conn").inner_text() == "live"
            # a few updates, so the charts have lines: every member has message-rate points
            page.wait_for_function(
                "['node-0', 'node-1', 'node-2'].every(n => (state.series.msgs[n] || []).length >= 3)", timeout=15_000
            )
            victim, _ = nodes[2]
            os.kill(victim.pid, signal.SIGKILL)
            t0 = time.monotonic()
            page.wait_for_selector('#members tr[data-member="node-2"][data-state="dead"]', timeout=2_000)
            took = time.monotonic() - t0
            assert took <= 2.0
            assert page.locator('#members tr[data-state="alive"]').count() == 2
            page.locator("#events li", has_text="node-2").filter(has_text="dead").first.wait_for(timeout=5_000)
            shot = tmp_path / "dashboard.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get(SCREENSHOT_ENV):
                page.screenshot(path=os.environ[SCREENSHOT_ENV], full_page=True)
        finally:
            browser.close()
