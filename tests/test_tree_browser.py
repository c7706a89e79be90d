"""Open the page in Chromium, run a tree method, and check that its tree is drawn."""

from __future__ import annotations

import pytest

from tests.test_browser import CHROMIUM, NO_CHROMIUM, opened_page
from tests.uiserver import serve

pytestmark = [pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")]


@pytest.fixture(scope="module")
def tree_page_url(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    with serve(tmp_path_factory.mktemp("browser-trees"),
               defaults={"max_new_tokens": 24, "methods": ["ar", "sd-tree"]}) as (url, _):
        yield url


def test_the_tree_view_renders_after_a_run(tree_page_url):
    with opened_page(tree_page_url) as page:
        page.locator("#sd-run").click(timeout=30_000)
        page.get_by_text("Done in", exact=False).wait_for(timeout=90_000)
        chart = page.locator("#sd-chart-tree .js-plotly-plot")
        chart.wait_for(timeout=30_000)
        # A slider to pick the round, and the round's nodes as points.
        assert chart.locator(".slider-container").count() == 1
        assert chart.locator(".scatterlayer .point").count() >= 3
        assert "round" in chart.locator(".gtitle").text_content()
        page.locator("#sd-table-details").get_by_text("Details", exact=False).first.click()  # nodes per round is a detail
        table_text = page.locator("#sd-table").inner_text() + page.locator("#sd-details").inner_text()
        assert "SD-tree" in table_text and "nodes / round" in table_text
