"""The page's Playground tab and the /run and /compare endpoints: one prompt decoded by
each chosen method, round by round.

`build_tab` lays the tab out inside the current Blocks and wires its events. The work is
done by the plain functions of `handlers` (`stream_run` yields `RunUpdate`s, `compare` runs
to the end); this module only maps their data onto components. The decoding parameters'
controls and the endpoints' parameter names come from the schema through `forms`.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

import gradio as gr
from gradio.context import Context

from . import charts as charts_module
from . import forms, handlers, viz, whatif
from ..bench.measure.tables import summary_frame
from ..engine.methods import DEFAULT_METHODS, METHODS
from ..models.loading import ModelPair, Preset, onnx_can_export
from ..engine.runtimes import AUTO as AUTO_RUNTIME, ONNX, TORCH
from .engine_controls import ENGINE_NAMES, engine_controls
from .examples import EXAMPLES, encoder_decoder_examples
from .handlers import DRAFT_FIELD, MODEL_NAMES, PRECISION_NAMES, RUNTIME, TARGET_FIELD, Request, RunUpdate, make_request
from .page import AUTO, TabContext, session_id, wire_stop
from .streams import BySession, wire_status_then_draw

log = logging.getLogger(__name__)

# The endpoints' own inputs around the schema's parameters, in the API's order.
FORM_BEFORE, FORM_AFTER = ("prompt", "preset", "methods"), (*MODEL_NAMES, *ENGINE_NAMES, *PRECISION_NAMES, RUNTIME)
# What those inputs mean, as /run's and /compare's docstrings say it (the schema's come from its help texts).
FORM_HELP = {
    "prompt": "the text to continue; wrapped in the tokenizer's chat template when chat is on",
    "preset": "the model pair (target + draft) by its preset's name",
    "methods": "the methods to decode with, one after another, by their registry names; ar is the reference "
               "every other method is timed and compared against",
    TARGET_FIELD: "a target that overrides the preset's: a Hub id, a local folder or a .gguf file (empty: the preset's)",
    DRAFT_FIELD: "the draft for that target, sharing its tokenizer, or a published EAGLE, EAGLE-3 or Medusa head "
             "for it (empty: no draft, so AR and NASD only)",
    "target_dtype": "the target's precision: auto (bfloat16 on a GPU, float32 on a CPU) or one the device serves",
    "draft_dtype": "the draft's precision: auto (the target's default) or one the device serves",
    RUNTIME: "what runs the target's forwards: auto (ONNX Runtime where it runs the target, else torch), torch, or "
             "onnx where the page offers it",
}
CHARTS = charts_module.CHART_NAMES
# Where each chart sits: how the methods ran (two rows of two), why drafts were kept, the trees of
# tree methods, and the break-even beside the reading under the table.
RUN_CHARTS = ("gamma", "entropy", "accepted", "race")
WHY_CHARTS = ("entropy_acceptance", "position_acceptance")
TREE_CHARTS = ("tree_rounds", "tree")
TABLE_CHARTS = ("break_even",)
PLACEHOLDER = ("The charts of γ, entropy, accepted drafts and the race appear here when a run ends.",
               "They are drawn after the timed rounds, from the trace's own clock, so that drawing never slows a decoder.")


@dataclass
class Inputs:
    prompt: gr.Textbox
    preset: gr.Dropdown
    methods: gr.CheckboxGroup
    controls: dict[str, Any]  # the schema's parameters by name
    target: gr.Textbox
    draft: gr.Textbox
    engine: dict[str, Any]
    precisions: dict[str, gr.Dropdown]  # by PRECISION_NAMES
    runtime: gr.Dropdown  # the target's runtime (hidden where only torch serves the pair)
    run_btn: gr.Button
    stop_btn: gr.Button

    def event_inputs(self, methods: Any) -> list[Any]:
        return forms.inputs(self.controls, [self.prompt, self.preset, methods],
                            [self.target, self.draft, *self.engine.values(), *self.precisions.values(), self.runtime])


@dataclass(frozen=True)
class Shown:
    """What the page shows its visitor: how many panel slots, the chart sections or their
    placeholder, the trees' section, and whether the CSV buttons hold files.

    Gradio answers a property update (visibility, interactivity) by building the component
    anew and regenerating its configuration and API schema on the server's event loop; a value
    alone costs next to nothing. So `Outputs.apply` sends a property update only where this
    changes, and a plain value everywhere else."""

    panels: int
    charts: bool = False
    trees: bool = False
    files: bool = False


@dataclass
class Outputs:
    status: gr.Markdown
    panels: list[gr.HTML]
    charts: list[gr.Plot]  # in CHARTS order
    table: gr.Dataframe  # viz.FIRST_COLUMNS
    why: gr.Markdown
    summary_file: gr.DownloadButton
    rounds_file: gr.DownloadButton
    tokens_file: gr.DownloadButton
    placeholder: gr.Plot  # stands in for the charts until a run ends
    chart_groups: list[gr.Column]  # shown once a run ends
    trees: gr.Column  # shown once a run of a tree method ends
    details: gr.Dataframe  # the comparison's other columns (viz.split_table)

    @property
    def files(self) -> tuple[gr.DownloadButton, ...]:
        return self.summary_file, self.rounds_file, self.tokens_file

    def all(self) -> list[Any]:
        return [self.status, *self.panels, *self.charts, self.table, self.why, *self.files, self.placeholder,
                *self.chart_groups, self.trees, self.details]

    def apply(self, update: RunUpdate, shown: Shown) -> tuple[dict, Shown]:
        """A handler's RunUpdate mapped onto these components (the ones it leaves as None stay),
        for a page that shows `shown`; returns the update and what the page shows after it. A
        component's visibility or interactivity is sent only where it changes (see `Shown`)."""
        out: dict = {}
        if update.warning:
            gr.Warning(update.warning)
        if update.status is not None:
            out[self.status] = update.status
        if update.shown is not None:
            for k, panel in enumerate(self.panels):
                visible, was_visible = k < update.shown, k < shown.panels
                if visible != was_visible:
                    out[panel] = gr.update(visible=visible, value=update.panels.get(k, ""))
                elif visible:
                    out[panel] = update.panels.get(k, "")
            shown = replace(shown, panels=update.shown)
        else:
            out.update({self.panels[k]: html for k, html in update.panels.items()})
        if update.figures is not None:
            out.update({chart: update.figures[name] for chart, name in zip(self.charts, CHARTS) if name in update.figures})
        if update.charts_shown is not None and update.charts_shown != shown.charts:
            out[self.placeholder] = gr.update(visible=not update.charts_shown)
            out.update({group: gr.update(visible=update.charts_shown) for group in self.chart_groups})
            shown = replace(shown, charts=update.charts_shown)
        if update.trees_shown is not None and update.trees_shown != shown.trees:
            out[self.trees] = gr.update(visible=update.trees_shown)
            shown = replace(shown, trees=update.trees_shown)
        if update.table is not None:
            out[self.table], out[self.details] = viz.split_table(update.table)
        if update.why is not None:
            out[self.why] = update.why
        if update.files is not None:
            holding = {path is not None for path in update.files}
            for button, path in zip(self.files, update.files):
                out[button] = path if holding == {shown.files} else gr.update(value=path, interactive=path is not None)
            shown = replace(shown, files=holding == {True})
        return out, shown


def build_tab(ctx: TabContext, initial: Mapping[str, Any]) -> None:
    """Lay the tab out inside the current Blocks and wire /run and /compare.
    initial: the inputs' first values by parameter name (prompt, methods, max_new_tokens, ...)."""
    inputs = _inputs(ctx, initial)
    outputs = _outputs(initial, warming=(ctx.warming or WARMING) if ctx.ready is not None else "")
    what_if = whatif.WhatIfPanel.build(initial)
    shown = BySession(Shown(panels=len(viz.method_order(initial["methods"]))))
    _wire_run(ctx, inputs, outputs, shown, what_if)
    _wire_compare(ctx, inputs)
    _wire_ready(ctx, outputs.status)


def preset_label(preset: Preset) -> str:
    """A pair as the dropdown names it, short enough to read whole in the box beside the prompt."""
    offline = {"embedded": "feature head", "embedded-head": "feature head", "embedded-lm": "draft LM"}
    if preset.name in offline:
        return f"{preset.name} — SmolLM2-135M + {offline[preset.name]}"
    draft = preset.draft.split("/")[-1] if preset.draft else "no draft"
    return f"{preset.name} — {preset.target.split('/')[-1]} + {draft}"


# --------------------------------------------------------------------------- layout


def _inputs(ctx: TabContext, initial: Mapping[str, Any]) -> Inputs:
    with gr.Row(equal_height=False):
        with gr.Column(scale=5):
            prompt = gr.Textbox(label="Prompt", value=initial["prompt"], lines=5, max_lines=14, elem_id="sd-prompt",
                                placeholder="Type a prompt, or pick an example below")
            gr.Examples([[text] for _, text in EXAMPLES], inputs=[prompt],
                        example_labels=[label for label, _ in EXAMPLES], label="Examples",
                        api_visibility="private")  # the page's own event, never an endpoint
        with gr.Column(scale=3, min_width=300):
            preset = gr.Dropdown(label="Model pair (target + draft)", value=ctx.default_preset, interactive=True,
                                 choices=[(preset_label(p), name) for name, p in ctx.presets.items()],
                                 elem_id="sd-preset")
            paired = encoder_decoder_examples(ctx.presets)
            if paired:  # choosing one also picks its pair
                gr.Examples([[text, name] for _, text, name in paired], inputs=[prompt, preset],
                            example_labels=[label for label, _, _ in paired],
                            label="Encoder-decoder examples (pick their pair)", api_visibility="private")
            methods = gr.CheckboxGroup(label="Methods", value=initial["methods"],
                                       choices=method_choices(ctx.presets[ctx.default_preset].draft),
                                       info="run one after another on the same prompt; AR is the baseline; "
                                            "beam search, the draft alone and AR without a cache are baselines")
            controls = forms.param_controls(forms.MAIN_PARAMS, initial,
                                            maxima={"max_new_tokens": ctx.limits.max_new_tokens})
            with gr.Row():
                run_btn = gr.Button("Run", variant="primary", elem_id="sd-run")
                stop_btn = gr.Button("Stop", variant="stop", elem_id="sd-stop")
    # A public demo serves its presets only (typed ids and paths are also refused server-side).
    with gr.Accordion("Custom models", open=False, visible=not ctx.limits.public):
        gr.Markdown("A target overrides the pair above: a Hub id, a local folder or a .gguf file. "
                    "The draft must share the target's tokenizer (leave it empty to run AR and NASD only); it may "
                    "also be a published draft head for the target, an EAGLE, EAGLE-3 or Medusa checkpoint "
                    "(a folder or a Hub id, recognised from its config).")
        with gr.Row():
            target = gr.Textbox("", label="Target model", placeholder="e.g. HuggingFaceTB/SmolLM2-360M-Instruct")
            draft = gr.Textbox("", label="Draft model", placeholder="e.g. HuggingFaceTB/SmolLM2-135M-Instruct, or an EAGLE-3 head's id")
    with gr.Accordion("Advanced settings", open=False):
        controls.update(forms.param_controls(forms.ADVANCED_PARAMS, initial, row_width=forms.ROW_WIDTH))
        with gr.Row():
            engine = engine_controls(ctx.engine_defaults(_encoder_decoder(ctx, ctx.default_preset)))
            precisions = precision_controls(ctx.precisions)
            runtime = runtime_control(ctx)
    preset.change(lambda name, chosen: _offer_methods(ctx, name, chosen), inputs=[preset, methods],
                  outputs=[methods], api_visibility="private", queue=False)
    # An encoder-decoder pair reads the prompt as it is: its chat switch would do nothing.
    preset.change(lambda name: gr.update(visible=not getattr(ctx.presets.get(name), "encoder_decoder", False)),
                  inputs=[preset], outputs=[controls["chat"]], api_visibility="private")
    preset.change(lambda name: engine_values(ctx, name), inputs=[preset], outputs=list(engine.values()),
                  api_visibility="private", queue=False)
    preset.change(lambda name: runtime_offered(ctx, name), inputs=[preset], outputs=[runtime],
                  api_visibility="private", queue=False)
    return Inputs(prompt, preset, methods, controls, target, draft, engine, precisions, runtime, run_btn, stop_btn)


def _encoder_decoder(ctx: TabContext, preset_name: str) -> bool:
    return bool(getattr(ctx.presets.get(preset_name), "encoder_decoder", False))


def engine_values(ctx: TabContext, preset_name: str) -> list[Any]:
    """A new pair starts from its own engine defaults, in `ENGINE_NAMES` order: compiled on a GPU for a
    decoder-only pair, eager for an encoder-decoder one (graph capture runs decoder-only models)."""
    if preset_name not in ctx.presets:
        return [gr.skip() for _ in ENGINE_NAMES]
    options = ctx.engine_defaults(_encoder_decoder(ctx, preset_name))
    return [getattr(options, name) for name in ENGINE_NAMES]


def precision_controls(offered: tuple[str, ...]) -> dict[str, gr.Dropdown]:
    """The target's and the draft's precision, for a preset's pair as for custom models. auto loads what
    the page loads without a choice (the pair it preloads and warms), so only another choice loads anew."""
    info = {"target_dtype": "auto: bfloat16 on a GPU, float32 on a CPU. Greedy SD still equals AR at the "
                            "target's precision; another precision loads the pair again",
            "draft_dtype": "auto: the same default as the target. A lower-precision draft is still lossless: the "
                           "target verifies every draft"}
    labels = {"target_dtype": "Target precision", "draft_dtype": "Draft precision"}
    # A value outside the list reaches `make_request`, whose message names the field and the choices
    # (Gradio's own refusal would be a bare error with no status line).
    return {name: gr.Dropdown([AUTO, *offered], value=AUTO, label=labels[name], info=info[name],
                              allow_custom_value=True, elem_id=f"sd-{name.replace('_', '-')}")
            for name in PRECISION_NAMES}


RUNTIME_INFO = ("auto: the target on ONNX Runtime where it runs it (the CPU), else torch; exported on first use "
                "(about 30 s). Greedy SD still equals AR on the same runtime; trees, beam search, AR without a "
                "cache, target KV policies and compile run on the torch copy of the target, and their rows say so")


def runtime_control(ctx: TabContext, elem_id: str = "sd-runtime", info: str = RUNTIME_INFO,
                    runtimes: Sequence[str] | None = None) -> gr.Dropdown:
    """What runs the target's forwards. Like a precision it changes how the target is loaded, so in the
    Playground it sits beside them (the Benchmark and Sweep tabs have their own, `elem_id`, and their own
    `runtimes`); shown only where onnx runs here and the chosen pair's target can be exported for it."""
    runtimes = list(runtimes if runtimes is not None else ctx.runtimes)
    offered = runtime_offered(ctx, ctx.default_preset, hidden=TORCH if TORCH == runtimes[0] or AUTO_RUNTIME not in runtimes else AUTO_RUNTIME)
    return gr.Dropdown(runtimes, value=offered.get("value", runtimes[0]), label="Target runtime",
                       info=info, allow_custom_value=True, visible=offered["visible"], elem_id=elem_id)


def runtime_offered(ctx: TabContext, preset_name: str, hidden: str | None = None) -> dict:
    """The runtime control for a pair: shown where onnx serves its target, else hidden and set to `hidden`
    (None: auto, which gives torch there with the reason, or torch where torch is the page's default): an
    encoder-decoder target, a .gguf file, a GPU."""
    preset = ctx.presets.get(preset_name)
    if hidden is None:
        hidden = TORCH if ctx.runtimes[0] == TORCH else AUTO_RUNTIME
    offered = ONNX in ctx.runtimes and preset is not None and not preset.encoder_decoder \
        and onnx_can_export(preset.target)
    return gr.update(visible=offered) if offered else gr.update(visible=False, value=hidden)


def method_choices(draft: str | None) -> list[tuple[str, str]]:
    """The Methods box's (label, name) choices for a pair with this draft."""
    return [(METHODS[name].label, name) for name in handlers.offered_methods(draft)]


def _offer_methods(ctx: TabContext, preset_name: str, chosen: list[str] | None):
    """A new pair: offer the methods it can run, and keep the chosen ones among them."""
    preset = ctx.presets.get(preset_name)
    if preset is None:
        return gr.skip()
    offered = handlers.offered_methods(preset.draft)
    return gr.update(choices=method_choices(preset.draft), value=[m for m in chosen or [] if m in offered])


def _outputs(initial: Mapping[str, Any], warming: str = "") -> Outputs:
    """warming: the status line while the default pair warms up ("" when it is loaded on demand)."""
    status = gr.Markdown(warming or READY, label="status_line", elem_id="sd-status")
    gr.HTML(viz.legend_html(), css_template=viz.TOKEN_CSS, elem_id="sd-legend")
    with gr.Column(elem_id="sd-panels"):
        shown = viz.method_order(initial["methods"])
        panels = [
            gr.HTML(viz.render_panel(name, message="Press Run.") if k < len(shown) else "",
                    visible=k < len(shown), css_template=viz.TOKEN_CSS, elem_classes=["sd-slot"],
                    label=f"tokens_{k + 1}", show_label=False)
            for k, name in enumerate(shown + [m for m in METHODS if m not in shown])
        ][:len(METHODS)]
    plots: dict[str, gr.Plot] = {}

    def chart_rows(names: tuple[str, ...]) -> None:
        for i in range(0, len(names), 2):
            with gr.Row(equal_height=True):
                plots.update({name: gr.Plot(label=f"{name}_chart", show_label=False, elem_classes=["sd-chart"],
                                            elem_id=f"sd-chart-{name}")
                              for name in names[i : i + 2]})

    # A chart of its own, not a line of text: the browser loads and compiles plotly.js while the page
    # opens, not while it draws the first run's charts.
    placeholder = gr.Plot(viz.placeholder_figure(PLACEHOLDER), label="charts_placeholder", show_label=False,
                          elem_id="sd-charts-placeholder")
    with gr.Column(visible=False, elem_id="sd-run-charts") as run_charts:
        gr.Markdown("### How each method ran", elem_classes=["sd-section"])
        chart_rows(RUN_CHARTS)
        gr.Markdown("### Why drafts were kept", elem_classes=["sd-section"])
        chart_rows(WHY_CHARTS)
    with gr.Column(visible=False, elem_id="sd-tree-charts") as trees:
        gr.Markdown("### Trees of drafts (tree methods)", elem_classes=["sd-section"])
        chart_rows(TREE_CHARTS)
    gr.Markdown("### Comparison", elem_classes=["sd-section"])
    first, rest = viz.split_table(viz.display_table(summary_frame([])))
    table = gr.Dataframe(first, interactive=False, label="comparison", show_label=False, elem_id="sd-table", wrap=True)
    with gr.Accordion("Details: drafter, tokens, time to first token, forwards, γ, KV cache, first divergence",
                      open=False, elem_id="sd-table-details"):
        details = gr.Dataframe(rest, interactive=False, label="comparison_details", show_label=False,
                               elem_id="sd-details", wrap=True)
    why = gr.Markdown("", label="reading")
    with gr.Column(visible=False, elem_id="sd-table-charts") as table_charts:
        chart_rows(TABLE_CHARTS)
    with gr.Row():
        summary_file = gr.DownloadButton("Comparison table (CSV)", interactive=False, elem_id="sd-summary-csv")
        rounds_file = gr.DownloadButton("Per-round trace (CSV)", interactive=False, elem_id="sd-rounds-csv")
        tokens_file = gr.DownloadButton("Per-token decisions (CSV)", interactive=False, elem_id="sd-tokens-csv")
    charts = [plots[name] for name in CHARTS]
    return Outputs(status, panels, charts, table, why, summary_file, rounds_file, tokens_file, placeholder,
                   [run_charts, table_charts], trees, details)


# --------------------------------------------------------------------------- events


def _loader(ctx: TabContext):
    def load(request: Request) -> ModelPair:
        return ctx.load(request.target, request.draft, target_dtype=request.target_dtype,
                        draft_dtype=request.draft_dtype, runtime=request.runtime)
    return load


class RunStreams:
    """The Run's updates for a visitor, as the page's two events and /run take them. Gradio
    rebuilds every output an update leaves alone as it does for a property update (see `Shown`):
    with the status lines sent through one event with every panel, chart and file among its
    outputs, the server's event loop spent 1.2–1.3 s of CPU on a default run beside the decoders;
    with the status in an event of its own and properties sent only where they change, 0.3 s."""

    def __init__(self, ctx: TabContext, outputs: Outputs, shown: BySession[Shown],
                 what_if: whatif.WhatIfPanel | None = None):
        self.ctx, self.outputs, self.shown, self.what_if = ctx, outputs, shown, what_if
        self.last: BySession[RunUpdate] = BySession()  # a page run's final update, until it is drawn

    def updates(self, form: dict, session: str | None = None, page: bool = False) -> Iterator[RunUpdate]:
        """The Run's updates; on the page (`page`), its finished results are kept for the What-if panel."""
        ctx = self.ctx
        try:
            req = make_request(form["prompt"], form["preset"], form[TARGET_FIELD], form[DRAFT_FIELD], form,
                               ctx.presets, ctx.limits, methods=form["methods"] or [],
                               precisions=ctx.precisions, runtimes=ctx.runtimes)
        except ValueError as error:
            yield RunUpdate(status=f"⚠️ {error}", warning=str(error))
            return
        yield from handlers.wait_for_warm_up(ctx.ready, ctx.warming or WARMING)
        with contextlib.closing(handlers.stream_run(req, _loader(ctx), ctx.limits, ctx.gpu, ctx.threads)) as stream:
            for update in stream:
                if page and update.results and self.what_if is not None:
                    self.what_if.remember_run(session, req.prompt, req.params, update.results,
                                              lambda: _loader(ctx)(req))
                yield update

    def show(self, update: RunUpdate, session: str | None) -> dict:
        out, now = self.outputs.apply(update, self.shown.get(session))
        self.shown.set(session, now)
        return out

    def every_output(self, form: dict, session: str | None) -> Iterator[dict]:
        """/run: each update onto every output."""
        with contextlib.closing(self.updates(form)) as stream:
            for update in stream:
                yield self.show(update, session)

    def status_lines(self, form: dict, session: str | None) -> Iterator[Any]:
        """The page's Run: the status line alone; the run's last update is kept for `draw`."""
        with contextlib.closing(self.updates(form, session, page=True)) as stream:
            for update in stream:
                if update.warning:
                    gr.Warning(update.warning)
                if update.only_status():
                    yield update.status if update.status is not None else gr.skip()
                else:
                    self.last.set(session, update)

    def draw(self, session: str | None) -> Any:
        update = self.last.pop(session)
        return gr.skip() if update is None else self.show(update, session)

    def forget(self, session: str | None) -> None:
        self.shown.pop(session)
        self.last.pop(session)


def _wire_run(ctx: TabContext, inputs: Inputs, outputs: Outputs, shown: BySession[Shown],
              what_if: whatif.WhatIfPanel) -> None:
    """The page's Run: each method in turn under a status line, then everything it found drawn at
    once by the event chained after it, and the What-if panel prepared from it. /run, for API
    clients, streams the same run as one event with every output."""
    streams = RunStreams(ctx, outputs, shown, what_if)

    def run(form: dict, request: gr.Request):
        """Decode the prompt with each method in turn, as the Run button does: streams the status line, then
        every output at the end: tokens_k the k-th method's tokens (AR first) as HTML, one Plotly figure a
        chart, the comparison table, its reading and the three CSV files."""
        yield from ctx.follow(request, streams.every_output(form, session_id(request)))

    def run_on_page(form: dict, request: gr.Request):
        yield from ctx.follow(request, streams.status_lines(form, session_id(request)))

    event_inputs = inputs.event_inputs(inputs.methods)
    event = inputs.run_btn.click(
        forms.endpoint(run_on_page, FORM_BEFORE, FORM_AFTER, name="run_on_page", generator=True, helps=FORM_HELP),
        inputs=event_inputs, outputs=[outputs.status], api_visibility="private",
        # No status tracker: one tracked as pending runs an animation timer in the browser for the
        # whole run, on the cores the decoders are timed on; the status line says how far it is.
        show_progress="hidden", concurrency_id=ctx.queue_id,
    )
    wire_status_then_draw(streams, event, outputs.all())
    what_if.wire(event, ctx.queue_id, ctx.gpu)
    wire_stop(inputs.stop_btn, outputs.status, event)
    with gr.Column(visible=False):
        api_btn = gr.Button("run")
    api_run = forms.endpoint(run, FORM_BEFORE, FORM_AFTER, name="run", generator=True, helps=FORM_HELP)
    api_btn.click(api_run, inputs=event_inputs, outputs=outputs.all(), api_name="run", show_progress="hidden",
                  concurrency_id=ctx.queue_id)
    forms.describe_inputs(api_run, event_inputs)


READY = "Press **Run** to decode the prompt with every selected method."
WARMING = ("⏳ Loading the default model pair and warming it up, so that the first Run is timed like the "
           "next ones …")


def _wire_ready(ctx: TabContext, status: gr.Markdown) -> None:
    """A page served while the default pair loads opens saying so, and says when it is ready."""
    if ctx.ready is None:
        return

    def wait_until_ready():
        ctx.ready.wait()
        return READY

    # The Blocks being built (the page), whose load event fires when a visitor opens it.
    Context.root_block.load(wait_until_ready, outputs=[status], api_visibility="private", concurrency_limit=None,
                       show_progress="hidden")


def _wire_compare(ctx: TabContext, inputs: Inputs) -> None:
    """The scripted /compare: its outputs are components never shown on the page."""
    with gr.Column(visible=False):
        api_methods = gr.CheckboxGroup(list(METHODS), value=list(DEFAULT_METHODS), label="methods")
        api_outputs = [gr.Dataframe(label="summary"), gr.File(label="summary_csv"), gr.File(label="rounds_csv"),
                       gr.JSON(label="texts"), gr.File(label="tokens_csv")]
        compare_btn = gr.Button("compare")

    def compare(form: dict, request: gr.Request):
        """Run the methods one after another; returns the summary table, the summary and
        per-round CSVs (the CLI's columns), each method's output text and the per-token CSV."""
        try:
            req = make_request(form["prompt"], form["preset"], form[TARGET_FIELD], form[DRAFT_FIELD], form,
                               ctx.presets, ctx.limits, methods=form["methods"],
                               precisions=ctx.precisions, runtimes=ctx.runtimes)
            outcome = handlers.compare(req, _loader(ctx), ctx.limits, ctx.gpu, ctx.threads)
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        except Exception as error:
            log.exception("comparison failed")
            raise gr.Error(handlers.readable_failure(error), print_exception=False) from None
        return outcome.table, outcome.summary_csv, outcome.rounds_csv, outcome.texts, outcome.tokens_csv

    api_compare = forms.endpoint(compare, FORM_BEFORE, FORM_AFTER, name="compare", helps=FORM_HELP)
    compare_inputs = inputs.event_inputs(api_methods)
    compare_btn.click(api_compare, inputs=compare_inputs, outputs=api_outputs, api_name="compare",
                      concurrency_id=ctx.queue_id)
    forms.describe_inputs(api_compare, compare_inputs)
