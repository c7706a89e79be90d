"""The page with a published head typed in as a custom draft: a Run shows the rounds it drafted."""

from __future__ import annotations

import pytest

from tests.published_heads import write_medusa
from tests.test_browser import CHROMIUM, NO_CHROMIUM, opened_page
from tests.uiserver import serve

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM),
    pytest.mark.filterwarnings("ignore::Warning:gradio.queueing"),
]


def test_a_run_with_medusa_heads_typed_as_the_draft_shows_their_rounds(tmp_path):
    with serve(tmp_path, defaults={"max_new_tokens": 24}) as (url, _):
        head = write_medusa(tmp_path / "medusa", tmp_path / "target")
        with opened_page(url) as page:
            page.get_by_text("Custom models").click()
            page.get_by_label("Target model").fill(str(tmp_path / "target"))
            page.get_by_label("Draft model").fill(str(head))
            page.locator("#sd-run").click(timeout=30_000)
            page.get_by_text("Done in", exact=False).wait_for(timeout=120_000)

            sd = page.locator('.sd-panel[data-method="sd"]')
            assert sd.count() == 1
            titles = [t.get_attribute("title") or "" for t in sd.locator(".sd-text .sd-tok").all()]
            assert titles and all("round" in t for t in titles)
            drafted = sd.locator(".sd-text .sd-tok.sd-accepted, .sd-text .sd-tok.sd-rejected")
            assert drafted.count() > 0, "the heads' drafts are shown, kept or refused"
            page.locator("#sd-table-details").get_by_text("Details", exact=False).first.click()  # the drafter's column
            assert "Medusa heads (" in page.locator("#sd-details").inner_text()
