"""A Plotly figure saved as a PNG by a headless browser (kaleido is not needed).

    save_chart_png(figure, "assets/sweep-embedded.png")

The figure is written into a page with plotly.js inline, opened in headless Chromium
through Playwright, and its chart element is screenshotted. Playwright (the Python
package) is optional: without it, or without a Chromium it can start, `ChartPngError`
(a ValueError) says what to install. The browser is $SPECDEMO_CHROMIUM,
else /usr/bin/chromium when present, else Playwright's own.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

SYSTEM_CHROMIUM = "/usr/bin/chromium"


class ChartPngError(ValueError):
    pass


def chromium_path() -> str | None:
    if os.environ.get("SPECDEMO_CHROMIUM"):
        return os.environ["SPECDEMO_CHROMIUM"]
    return SYSTEM_CHROMIUM if Path(SYSTEM_CHROMIUM).exists() else None


def save_chart_png(figure: Any, path: str | Path, width: int = 960, height: int = 540, scale: float = 1.0) -> Path:
    """Render `figure` (a plotly Figure) at width × height CSS pixels and save it as a PNG."""
    try:
        from playwright.sync_api import Error as PlaywrightError, sync_playwright
    except ImportError:
        raise ChartPngError("a chart PNG needs Playwright: pip install playwright, and a Chromium "
                            "(apt-get install chromium, or python -m playwright install chromium)") from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure = figure.to_dict() if hasattr(figure, "to_dict") else figure
    import plotly.graph_objects as go

    page_html = go.Figure(figure).update_layout(width=width, height=height).to_html(
        full_html=True, include_plotlyjs=True, div_id="chart", config={"staticPlot": True})
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "chart.html"
        source.write_text(page_html, encoding="utf-8")
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=chromium_path(),
                                                     args=["--no-sandbox"])
                try:
                    page = browser.new_page(viewport={"width": width + 40, "height": height + 40},
                                            device_scale_factor=scale)
                    page.goto(source.as_uri())
                    chart = page.locator("#chart .main-svg").first
                    chart.wait_for(state="visible", timeout=30_000)
                    page.locator("#chart").screenshot(path=str(path))
                finally:
                    browser.close()
        except PlaywrightError as error:
            raise ChartPngError(f"could not render the chart in Chromium: {str(error).splitlines()[0]}") from None
    return path
