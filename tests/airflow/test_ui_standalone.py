"""The Spot view and the spot metrics end to end, on the session's ``airflow standalone``
after it ran the example DAG with preemptions (``standalone_server.py``).

Headless Chromium (Debian's ``chromium``, driven by Playwright) logs in to the Airflow UI
(the simple auth manager's form), then opens the train task's Spot tab and the Spot
jobs page, each the plugin's page in Airflow's iframe, in a 1,280 px wide window, and checks
that nothing in the frame scrolls sideways; screenshots go to
``$SPOT_TEST_ARTIFACTS`` (default ``tests/artifacts/``, git-ignored). The StatsD lines
Airflow's processes sent to the test's UDP listener carry the provider's metrics.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest

from spot_core.charts.clock import money

pytestmark = pytest.mark.timeout(900)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(
    os.environ.get("SPOT_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "artifacts")
)
PAGE_TIMEOUT_MS = 60_000
VIEWPORT = {"width": 1280, "height": 900}  # a laptop's window: the frame must fit in it
OVERFLOW = """() => {
  const root = document.documentElement;
  const wide = [...document.querySelectorAll('table, figure, svg, h1, p')]
    .filter(e => e.getBoundingClientRect().right > root.clientWidth + 1)
    .map(e => e.tagName + '.' + e.className.baseVal + e.className);
  return {scroll: root.scrollWidth, client: root.clientWidth, wide};
}"""


@pytest.fixture(scope="module")
def finished(standalone, runs) -> dict:
    """The example DAG's run, finished; its train task's JobRecord."""
    dag_id = "spot_ml_pipeline"
    state = standalone.wait_run(dag_id, runs[dag_id], timeout=600)
    assert state["runs"][runs[dag_id]] == "success", state
    record = state["xcom"]["train:-1:spot_job_record"]
    return {
        "run_id": runs[dag_id],
        "record": json.loads(record) if isinstance(record, str) else record,
    }


@pytest.fixture(scope="module")
def browser(standalone):
    """Chromium with a fresh profile, logged in to the UI as the admin through its form."""
    from playwright.sync_api import sync_playwright

    from tests.support.standalone_server import USERS

    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport=VIEWPORT,
        )
        try:
            page = context.new_page()
            page.goto(f"http://127.0.0.1:{standalone.port}/", timeout=PAGE_TIMEOUT_MS)
            page.wait_for_url("**/auth/login**", timeout=PAGE_TIMEOUT_MS)
            _shot(page, "login.png")
            page.fill('input[name="username"]', USERS[0][0])
            page.fill('input[name="password"]', USERS[0][2])
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(lambda url: "/auth/" not in url, timeout=PAGE_TIMEOUT_MS)
            assert any(c["name"] == "_token" for c in context.cookies())
            page.close()
            yield context
        finally:
            context.close()


def _plugin_frame(page, url_path: str):
    """The plugin page inside Airflow's iframe, once its body has loaded."""
    iframe = page.locator(f'iframe[src*="{url_path}"]')
    iframe.wait_for(timeout=PAGE_TIMEOUT_MS)
    frame = page.frame_locator(f'iframe[src*="{url_path}"]')
    frame.locator("h1").wait_for(timeout=PAGE_TIMEOUT_MS)
    return frame


def _frame_of(page, url_path: str):
    """The plugin page's Frame (to measure inside it), once it has loaded."""
    for frame in page.frames:
        if url_path in frame.url:
            return frame
    raise AssertionError(f"no frame at {url_path}: {[f.url for f in page.frames]}")


def _fits(frame) -> None:
    """Nothing in the frame is wider than the frame: no sideways scroll, no cut column."""
    measured = frame.evaluate(OVERFLOW)
    assert measured["scroll"] <= measured["client"], measured
    assert not measured["wide"], measured


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def test_unauthenticated_requests_are_refused(standalone):
    base = f"http://127.0.0.1:{standalone.port}"
    for path in ("/spot/jobs", "/spot/api/jobs", "/spot/ti/spot_ml_pipeline/x/train/-1"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + path, timeout=30)
        assert refused.value.code in (401, 403), path


def test_the_spot_tab_of_the_train_task_in_chromium(standalone, finished, browser):
    record = finished["record"]
    attempts = record["attempts"]
    assert record["preemptions"] >= 1 and len(attempts) >= 2
    page = browser.new_page()
    base = f"http://127.0.0.1:{standalone.port}"
    page.goto(
        f"{base}/dags/spot_ml_pipeline/runs/{quote(finished['run_id'], safe='')}"
        "/tasks/train/plugin/spot",
        timeout=PAGE_TIMEOUT_MS,
    )
    try:
        frame = _plugin_frame(page, "/spot/ti/spot_ml_pipeline/")
        rows = frame.locator("table.attempts tr.attempt-row")
        assert rows.count() == len(attempts)
        for row, attempt in zip(rows.all_inner_texts(), attempts, strict=True):
            assert attempt["outcome"] in row and money(attempt["cost"]) in row
        assert frame.locator("svg.spot-timeline rect.attempt").count() == len(attempts)
        ledger = frame.locator("table.ledger").inner_text()
        assert money(record["ledger"]["spent"]) in ledger
        assert money(record["ledger"]["on_demand_equivalent"]) in ledger
        assert re.search(rf"preemptions\s+{record['preemptions']:d}", ledger)
        # the local cloud's trace market: the tab says its costs are capacity time
        assert "capacity time" in frame.locator("p.clock").inner_text()
        tab_frame = _frame_of(page, "/spot/ti/")
        assert "{MAP_INDEX}" not in tab_frame.url and "%7BMAP_INDEX%7D" not in tab_frame.url
        assert tab_frame.url.endswith("/train/-1"), tab_frame.url
        _fits(tab_frame)
    finally:
        _shot(page, "spot-tab.png")
    tab = browser.new_page()  # the tab's own page, whole (the iframe scrolls inside Airflow)
    tab.goto(
        base + page.locator('iframe[src*="/spot/ti/"]').get_attribute("src"),
        timeout=PAGE_TIMEOUT_MS,
    )
    assert tab.locator("svg.spot-timeline rect.attempt").count() == len(attempts)
    _shot(tab, "spot-tab-page.png")


def test_the_spot_jobs_page_in_chromium(standalone, finished, browser):
    page = browser.new_page()
    page.goto(f"http://127.0.0.1:{standalone.port}/plugin/spot-jobs", timeout=PAGE_TIMEOUT_MS)
    try:
        frame = _plugin_frame(page, "/spot/jobs")
        jobs = frame.locator("table.jobs").inner_text()
        assert "spot_ml_pipeline" in jobs and "train" in jobs and "batch_inference" in jobs
        savings = frame.locator("table.savings").inner_text()
        assert "spot_ml_pipeline" in savings
        pools = frame.locator("table.pools tr.pool-row")
        assert pools.count() >= 1
        assert frame.locator("svg.spot-savings").count() == 1
        _fits(_frame_of(page, "/spot/jobs"))
    finally:
        _shot(page, "spot-jobs.png")


def test_spot_metrics_reach_statsd(standalone, finished, statsd):
    """One spot.attempts per finished attempt of train, tagged with its DAG, task and pool."""
    record = finished["record"]
    lines = [line for line in list(statsd.lines) if line.startswith(("airflow.spot.", "spot."))]
    train = [
        line for line in lines if "dag_id=spot_ml_pipeline" in line and "task_id=train" in line
    ]
    attempts = [line for line in train if re.match(r"(airflow\.)?spot\.attempts,", line)]
    assert len(attempts) == len(record["attempts"]), lines[:50]
    preempted = [line for line in train if re.match(r"(airflow\.)?spot\.preemptions,", line)]
    assert len(preempted) == record["preemptions"]
    for name in ("spot.cost", "spot.saved", "spot.lost_work_seconds"):
        assert any(name + "," in line and "|g" in line for line in train), name
    if record["preemptions"]:  # each resumed attempt: its time to resume, in seconds
        assert any("spot.time_to_resume," in line and "|g" in line for line in train)
    assert all("pool=" in line for line in train)
