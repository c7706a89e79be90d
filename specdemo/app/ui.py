"""The Gradio playground: type a prompt, watch AR, SD, NASD and EGAG decode it round by round.

This module is the layout: a `with gr.Blocks()` block whose events map the plain data
that `handlers` yields onto components. The handlers live in `handlers` (playground),
`benchtab` and `sweeptab`; the decoding parameters' controls and the endpoints' parameter
names come from the schema through `forms`; everything that draws lives in `viz`.
`build_demo()` returns the Blocks (queue already set up); `launch()` adds the page's theme
and CSS, which Gradio 6 takes at launch time.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from typing import Any, Callable, Iterator, Mapping

import gradio as gr

from . import benchtab, forms, handlers, sweeptab, viz
from .engine_controls import ENGINE_NAMES, engine_controls
from .examples import DEFAULT_PROMPT, EXAMPLES
from .handlers import (  # noqa: F401  (the page's handlers, re-exported for callers of `ui`)
    PARAM_NAMES, PairCache, PairLoader, Request, RunUpdate, export_dir, fit_chat, gpu, make_request, on_zero_gpu,
    readable_failure, resolve_models, write_csvs,
)
from .limits import Limits
from ..models.loading import PRESETS, ModelPair, Preset, load_pair
from ..engine.methods import DEFAULT_METHODS, METHODS
from ..engine.params import DecodeParams
from ..bench.tables import summary_frame

log = logging.getLogger(__name__)

DEFAULTS = DecodeParams()
# Every event that decodes joins this one queue, so runs from different visitors (and from
# different tabs) take turns on the device instead of sharing it.
GPU_QUEUE = "gpu"


# ---------------------------------------------------------------------------------------
# The page


def build_demo(
    pair_loader: PairLoader | None = None,
    presets: Mapping[str, Preset] | None = None,
    default_preset: str | None = None,
    cache_limit: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    public: bool = False,
    defaults: Mapping[str, Any] | None = None,
    limits: Limits | None = None,
) -> gr.Blocks:
    """The playground's Blocks, queued so GPU work runs one request at a time.

    pair_loader: called as loader(target, draft, device=..., dtype=...) (default `load_pair`);
    tests pass presets with a tiny local pair. public: turn public mode on (it is also on
    for a Space or with SPECDEMO_PUBLIC=1); limits: the deployment's limits, read from the
    environment when not given. defaults: initial values of the page's inputs by parameter name (prompt, methods,
    max_new_tokens, temperature, ...), e.g. a shorter run for a slow machine.
    """
    initial = {**DEFAULTS.as_dict(), "seed": 0, "chat": True, "prompt": DEFAULT_PROMPT,
               "methods": list(DEFAULT_METHODS), **(defaults or {})}
    limits = limits or Limits.from_env(public=True if public else None)
    known = dict(presets if presets is not None else PRESETS)
    presets = limits.served(known)
    if not presets:
        raise ValueError(f"no preset to serve: the allow-list {', '.join(limits.allowed_presets)} "
                         f"names none of {', '.join(known)}")
    default_preset = default_preset if default_preset in presets else next(iter(presets))
    initial["max_new_tokens"] = min(initial["max_new_tokens"], limits.max_new_tokens)
    limit = cache_limit if cache_limit is not None else int(os.environ.get("SPECDEMO_MAX_PAIRS", "1"))
    cache = PairCache(pair_loader or load_pair, limit=limit)
    slots = len(METHODS)

    def load(request: Request) -> ModelPair:
        return cache.get(request.target, request.draft, device=device, dtype=dtype)

    with gr.Blocks(title="specdemo — speculative decoding playground", delete_cache=(3600, 3600)) as demo:
        demo.specdemo_cache = cache  # type: ignore[attr-defined]
        demo.specdemo_limits = limits  # type: ignore[attr-defined]
        demo.specdemo_presets = presets  # type: ignore[attr-defined]

        gr.Markdown(
            "# Speculative decoding playground\n"
            "One target model, four ways to decode it: **AR** (the target alone), **SD** (a small draft model "
            "proposes γ tokens, the target checks them in one forward; where the text repeats itself, the round "
            "copies from it instead), **NASD** (drafts from an n-gram table, "
            "no draft model) and **EGAG** (SD with γ set each round by the drafter's entropy). "
            "All are lossless: greedy runs give AR's text exactly. Watch them decode round by round, then read "
            "why each was fast or slow.",
            elem_id="sd-intro",
        )
        with gr.Tab("Playground", elem_id="sd-playground-tab"):
            with gr.Row(equal_height=False):
                with gr.Column(scale=5):
                    prompt = gr.Textbox(label="Prompt", value=initial["prompt"], lines=5, max_lines=14,
                                        placeholder="Type a prompt, or pick an example below")
                    gr.Examples([[text] for _, text in EXAMPLES], inputs=[prompt],
                                example_labels=[label for label, _ in EXAMPLES], label="Examples")
                with gr.Column(scale=3, min_width=300):
                    preset = gr.Dropdown(
                        label="Model pair (target + draft)", value=default_preset, interactive=True,
                        choices=[(_preset_label(p), name) for name, p in presets.items()],
                    )
                    methods = gr.CheckboxGroup(
                        label="Methods", value=initial["methods"],
                        choices=[(m.label, name) for name, m in METHODS.items()],
                        info="run one after another on the same prompt; AR is the baseline",
                    )
                    controls = forms.param_controls(forms.MAIN_PARAMS, initial,
                                                    maxima={"max_new_tokens": limits.max_new_tokens})
                    with gr.Row():
                        run_btn = gr.Button("Run", variant="primary", elem_id="sd-run")
                        stop_btn = gr.Button("Stop", variant="stop", elem_id="sd-stop")

            # A public demo serves its presets only (typed ids and paths are also refused server-side).
            with gr.Accordion("Custom models", open=False, visible=not limits.public):
                gr.Markdown("A target overrides the pair above: a Hub id, a local folder or a .gguf file. "
                            "The draft must share the target's tokenizer (leave it empty to run AR and NASD only).")
                with gr.Row():
                    target = gr.Textbox("", label="Target model", placeholder="e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
                    draft = gr.Textbox("", label="Draft model", placeholder="e.g. HuggingFaceTB/SmolLM2-135M-Instruct")
            with gr.Accordion("Advanced settings", open=False):
                controls.update(forms.param_controls(forms.ADVANCED_PARAMS, initial, row_width=forms.ROW_WIDTH))
                with gr.Row():
                    engine = engine_controls()

            status = gr.Markdown("Press **Run** to decode the prompt with every selected method.", elem_id="sd-status")
            gr.HTML(viz.legend_html(), css_template=viz.TOKEN_CSS, elem_id="sd-legend")
            with gr.Column(elem_id="sd-panels"):
                shown = viz.method_order(initial["methods"])
                panels = [
                    gr.HTML(
                        viz.render_panel(name, message="Press Run.") if k < len(shown) else "",
                        visible=k < len(shown), css_template=viz.TOKEN_CSS, elem_classes=["sd-slot"],
                    )
                    for k, name in enumerate(shown + [m for m in METHODS if m not in shown])
                ][:slots]

            gr.Markdown("### How each method ran", elem_classes=["sd-section"])
            empty = viz.all_figures([])
            with gr.Row(equal_height=True):
                gamma_plot = gr.Plot(empty["gamma"], show_label=False, elem_classes=["sd-chart"])
                entropy_plot = gr.Plot(empty["entropy"], show_label=False, elem_classes=["sd-chart"])
            with gr.Row(equal_height=True):
                accepted_plot = gr.Plot(empty["accepted"], show_label=False, elem_classes=["sd-chart"])
                race_plot = gr.Plot(empty["race"], show_label=False, elem_classes=["sd-chart"])
            with gr.Row(equal_height=True):
                tree_rounds_plot = gr.Plot(empty["tree_rounds"], show_label=False, elem_classes=["sd-chart"])
                tree_plot = gr.Plot(empty["tree"], show_label=False, elem_classes=["sd-chart"], elem_id="sd-tree-chart")

            gr.Markdown("### Comparison", elem_classes=["sd-section"])
            table = gr.Dataframe(viz.display_table(summary_frame([])), interactive=False, show_label=False,
                                 elem_id="sd-table", wrap=True)
            why = gr.Markdown("")
            with gr.Row():
                summary_file = gr.DownloadButton("Comparison table (CSV)", interactive=False, elem_id="sd-summary-csv")
                rounds_file = gr.DownloadButton("Per-round trace (CSV)", interactive=False, elem_id="sd-rounds-csv")

            # Outputs of the scripted /compare endpoint; never shown on the page.
            with gr.Column(visible=False):
                api_methods = gr.JSON(list(DEFAULT_METHODS), label="methods")
                api_table = gr.Dataframe(label="summary")
                api_summary = gr.File(label="summary_csv")
                api_rounds = gr.File(label="rounds_csv")
                api_texts = gr.JSON(label="texts")
                compare_btn = gr.Button("compare")

        runs = RunningSessions(tidy=functools.partial(forget_replaced_components, demo))

        # A closed tab's stream usually ends its run, but a tab closed before that stream opened
        # leaves nothing to notice it; the session's own heartbeat does, and fires `unload`.
        def tab_closed(request: gr.Request):
            runs.closed(_session(request))

        demo.unload(tab_closed)

        with gr.Tab("Benchmark", elem_id="sd-benchmark-tab"):
            benchtab.build_tab(presets, default_preset, lambda t, d: cache.get(t, d, device=device, dtype=dtype),
                               limits, gpu, export_dir, GPU_QUEUE, follow=runs.follow)

        with gr.Tab("Sweep", elem_id="sd-sweep-tab"):
            sweeptab.build_tab(presets, default_preset, lambda t, d: cache.get(t, d, device=device, dtype=dtype),
                               limits, gpu, export_dir, GPU_QUEUE, follow=runs.follow)

        charts = [gamma_plot, entropy_plot, accepted_plot, race_plot, tree_rounds_plot, tree_plot]
        chart_names = list(viz.all_figures([]))

        def components(update: RunUpdate) -> dict:
            """A handler's RunUpdate mapped onto the page's components."""
            out: dict = {}
            if update.warning:
                gr.Warning(update.warning)
            if update.status is not None:
                out[status] = update.status
            if update.shown is not None:
                out.update({panel: gr.update(visible=k < update.shown, value=update.panels.get(k, ""))
                            for k, panel in enumerate(panels)})
            else:
                out.update({panels[k]: html for k, html in update.panels.items()})
            if update.figures is not None:
                out.update({chart: update.figures[name] for chart, name in zip(charts, chart_names)})
            if update.table is not None:
                out[table] = update.table
            if update.why is not None:
                out[why] = update.why
            if update.files is not None:
                for button, path in zip((summary_file, rounds_file), update.files):
                    out[button] = gr.update(value=path, interactive=path is not None)
            return out

        # -- the streaming run ---------------------------------------------------------
        def run(form: dict, request: gr.Request):
            """Decode with each method in turn, yielding after every round."""
            yield from runs.follow(request, decode(form))

        def decode(form: dict):
            try:
                req = make_request(form["prompt"], form["preset"], form["target"], form["draft"], form,
                                   presets, limits, methods=form["methods"] or [])
            except ValueError as error:
                yield components(RunUpdate(status=f"⚠️ {error}", warning=str(error)))
                return
            with contextlib.closing(handlers.stream_run(req, load, limits, gpu)) as updates:
                for update in updates:
                    yield components(update)

        form_before, form_after = ("prompt", "preset", "methods"), ("target", "draft", *ENGINE_NAMES)
        run_outputs = [status, *panels, *charts, table, why, summary_file, rounds_file]
        run_event = run_btn.click(
            forms.endpoint(run, form_before, form_after, name="run", generator=True),
            inputs=forms.inputs(controls, [prompt, preset, methods], [target, draft, *engine.values()]),
            outputs=run_outputs,
            api_name="run",
            show_progress="hidden",
            concurrency_id=GPU_QUEUE,
        )
        stop_btn.click(lambda: "⏹ Stopped.", outputs=[status], cancels=[run_event], queue=False, api_visibility="private")

        # -- the scripted comparison ---------------------------------------------------
        def compare(form: dict, request: gr.Request):
            """Run the methods one after another; returns the summary table, the summary and
            per-round CSVs (the CLI's columns) and each method's output text."""
            try:
                req = make_request(form["prompt"], form["preset"], form["target"], form["draft"], form,
                                   presets, limits, methods=form["methods"])
                outcome = handlers.compare(req, load, limits, gpu)
            except ValueError as error:
                raise gr.Error(str(error), print_exception=False) from None
            except Exception as error:
                log.exception("comparison failed")
                raise gr.Error(handlers.readable_failure(error), print_exception=False) from None
            return outcome.table, outcome.summary_csv, outcome.rounds_csv, outcome.texts

        compare_btn.click(
            forms.endpoint(compare, form_before, form_after, name="compare"),
            inputs=forms.inputs(controls, [prompt, preset, api_methods], [target, draft, *engine.values()]),
            outputs=[api_table, api_summary, api_rounds, api_texts],
            api_name="compare",
            concurrency_id=GPU_QUEUE,
        )

    demo.queue(default_concurrency_limit=1, max_size=limits.queue_size)
    return demo


def _session(request: gr.Request | None) -> str | None:
    return request.session_hash if request is not None else None


class RunningSessions:
    """The visitors with a run in progress, and which of them have closed their tab since.
    Every streaming event of the page runs through `follow`."""

    def __init__(self, tidy: Callable[[gr.Request | None], None] = lambda request: None):
        self._tidy = tidy
        self._lock = threading.Lock()
        self._runs: dict[str | None, int] = {}
        self._closed: set[str | None] = set()

    def follow(self, request: gr.Request | None, updates: Iterator) -> Iterator:
        """Relay a run's updates until they end or its visitor's tab closes; then close the run
        (which stops its decoding) and tidy the visitor's session, also after Stop."""
        session = _session(request)
        self.started(session)
        try:
            with contextlib.closing(updates):
                for update in updates:
                    if not self.wanted(session):
                        return
                    yield update
        finally:
            self.finished(session)
            self._tidy(request)

    def started(self, session: str | None) -> None:
        with self._lock:
            self._runs[session] = self._runs.get(session, 0) + 1

    def closed(self, session: str | None) -> None:
        with self._lock:
            if session in self._runs:  # only sessions with a run are remembered, so none piles up
                self._closed.add(session)

    def wanted(self, session: str | None) -> bool:
        return session not in self._closed

    def finished(self, session: str | None) -> None:
        with self._lock:
            left = self._runs.get(session, 1) - 1
            if left > 0:
                self._runs[session] = left
            else:
                self._runs.pop(session, None)
                self._closed.discard(session)


def forget_replaced_components(demo: gr.Blocks, request: gr.Request | None) -> None:
    """Drop what Gradio left behind in this visitor's session during the last event.

    When an output is skipped and later given a value in the same stream, Gradio files a
    fresh copy of the component under a new id in the session, one per round trip; over a
    long session those copies would grow memory without bound. The page never refers to
    them (it knows only the ids it was built with), so they can go once the event is over.
    """
    session = getattr(request, "session_hash", None)
    state = getattr(getattr(demo, "state_holder", None), "session_data", {}).get(session) if session else None
    if state is None:
        return
    try:
        blocks = state.blocks_config.blocks
        for key in [key for key in blocks if key not in demo.blocks]:
            del blocks[key]
            state.config_values.pop(key, None)
    except AttributeError:  # a Gradio whose session state looks different: nothing to tidy
        log.debug("session state not tidied", exc_info=True)


def _preset_label(preset: Preset) -> str:
    offline = {"embedded": "its default draft, the feature head", "embedded-head": "feature-level draft head",
               "embedded-lm": "draft LM (the previous draft)"}
    if preset.name in offline:
        return f"{preset.name} — SmolLM2-135M-Instruct + {offline[preset.name]} (offline)"
    draft = preset.draft.split("/")[-1] if preset.draft else "no draft"
    return f"{preset.name} — {preset.target.split('/')[-1]} + {draft}"


# ---------------------------------------------------------------------------------------
# Look and launch

PAGE_CSS = viz.TOKEN_CSS + """
.gradio-container { max-width: 1400px !important; margin: 0 auto !important; }
#sd-intro { font-size: 0.95em; }
#sd-status { min-height: 1.6em; font-variant-numeric: tabular-nums; }
#sd-panels { display: grid !important; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; }
#sd-panels > .hidden, #sd-panels > [style*="display: none"] { display: none !important; }
/* Panels side by side share a height, so the grid reads as a grid while one grows. */
#sd-panels > .sd-slot { display: flex; flex-direction: column; }
#sd-panels > .sd-slot > .html-container { flex: 1 1 auto; padding: 0; }
#sd-panels .prose.sd-slot, #sd-panels .sd-panel { height: 100%; }
#sd-run { font-size: 1.05em; }
@media (max-width: 900px) { #sd-panels { grid-template-columns: minmax(0, 1fr); } }
.sd-section { margin-top: 0.6em; }
#sd-table table { font-variant-numeric: tabular-nums; }
"""

# System fonts only: the theme's default Google fonts would be fetched from the internet,
# which an offline workstation cannot reach.
THEME = gr.themes.Default(primary_hue="violet", secondary_hue="slate", neutral_hue="slate",
                       font=["ui-sans-serif", "system-ui", "Segoe UI", "Helvetica", "Arial", "sans-serif"],
                       font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"])


def launch_options() -> dict[str, Any]:
    """The keyword arguments Gradio 6 wants at launch for the page's look."""
    return {"css": PAGE_CSS, "theme": THEME}


def launch(demo: gr.Blocks, **kwargs) -> Any:
    return demo.launch(**{**launch_options(), **kwargs})
