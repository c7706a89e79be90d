"""The Benchmark tab's batch sizes in Chromium: a user types "1,2", runs the suite, and sees the verdict
and the throughput-over-AR chart against batch size (AR's line at 1)."""

from __future__ import annotations

import pytest

from tests.test_browser import ARGS, CHROMIUM, NO_CHROMIUM, opened_page, shorter_answers
from tests.uiserver import serve

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM),
    pytest.mark.filterwarnings("ignore::Warning:gradio.queueing"),
]


@pytest.fixture(scope="module")
def page_url(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("batch-browser"), defaults={"max_new_tokens": 12}) as (url, _):
        yield url


@pytest.fixture(scope="module")
def chromium():
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


def test_benchmark_tab_runs_batch_sizes_and_shows_the_verdict_and_the_batch_chart(page_url, chromium):
    with opened_page(page_url, chromium) as page:
        page.get_by_role("tab", name="Benchmark").click(timeout=30_000)
        page.locator("#bench-category input").click()
        page.get_by_role("option", name="math", exact=True).click()
        page.locator("#bench-batch textarea").fill("1,2")
        shorter_answers(page)
        page.locator("#bench-run").click()
        page.locator("#bench-status").get_by_text("Done:", exact=False).wait_for(timeout=180_000)
        verdict = page.locator("#bench-batch-verdict")
        verdict.get_by_text("Drafting", exact=False).wait_for(timeout=60_000)
        assert "batch" in verdict.inner_text()
        chart = page.locator("#bench-chart-batch_ratio .js-plotly-plot")
        chart.wait_for(timeout=60_000)
        # What plotly drew: one line per drafting method over batch sizes 1 and 2, and AR's line at 1.
        drawn = chart.evaluate("e => ({x: e.data.map(t => Array.from(t.x)), names: e.data.map(t => t.name),"
                               " shapes: (e.layout.shapes || []).map(s => s.y0)})")
        assert [1, 2] in drawn["x"] and "SD" in drawn["names"]
        assert 1 in drawn["shapes"]
        assert page.locator("#bench-chart-batch_throughput .js-plotly-plot").count() == 1
