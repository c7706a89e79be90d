"""The Playground's "What if" panel: other γ and EGAG settings for the Run's prompt, replayed exactly
from one recorded greedy AR run, with tokens/s predicted from this machine's cost table.

Under greedy decoding every lossless method writes AR's tokens, so the rounds of any chain setting
can be replayed from AR's recording (`engine.replay`) by the real drafter and γ policy, without the
target; the cost table (`bench.measure.costs`) turns those rounds into tokens/s. After a greedy Run
the page records AR once more on the same prompt, after the timed rounds, so that nothing the Run
measured pays for it (the Run's own AR is timed on the runtime's plain loop; recording it there
would add the recorder's copies to the very time the table reports).

The first half is plain functions (`prepare`, `figures`, `gamma_curve`, `curve_figure`), tested
without a server; `WhatIfPanel` lays the panel out and wires its events.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import gradio as gr
from gradio.context import Context

from ..bench.measure.costs import CostTable, cost_table, ensure_drafter, predict_tokens_per_s
from ..engine.methods import ENTROPY_GAMMA, FIXED_GAMMA, METHODS, REFERENCE, Method
from ..engine.pair import DRAFT_ROLE, TARGET_ROLE
from ..engine.params import PARAMS, DecodeParams
from ..engine.replay import ChainBook, Recording, chain_book, record, replay_refusal
from ..engine.trace import GenerationResult
from . import viz
from .page import decoding_thread, session_id
from .streams import BySession

# The two methods the panel replays, by the registry's role names: fixed γ (SD) and γ from the entropy (EGAG).
FIXED = METHODS[FIXED_GAMMA]
ADAPTIVE = METHODS[ENTROPY_GAMMA]
MAX_GAMMA = 8  # the sliders' and the chart's largest γ: what one chain per position is drafted up to
# The γ policy's parameters the sliders move; the drafter (copy_n, draft_kv) stays as the Run had it.
KNOB_NAMES = ("gamma", "gamma_min", "gamma_max", "ema")


@dataclass(frozen=True)
class Knob:
    """One slider: a parameter of a method, its range from the schema (γ capped at MAX_GAMMA)."""

    method: str
    name: str
    label: str
    low: float
    high: float
    step: float

    @property
    def key(self) -> str:
        return f"{self.method}.{self.name}"


def knobs_of(method: Method) -> list[Knob]:
    """The sliders of a method: its own parameters among KNOB_NAMES, in its entry's order."""
    out = []
    for name in method.params:
        if name not in KNOB_NAMES:
            continue
        spec = PARAMS[name]
        if spec.kind is int:
            low, high, step = spec.low, min(spec.high, MAX_GAMMA), 1
        else:
            low, high, step = spec.slider
        out.append(Knob(method.name, name, f"{method.label}: {spec.label.split(': ', 1)[-1]}", low, high, step))
    return out


KNOBS = knobs_of(FIXED) + knobs_of(ADAPTIVE)


@dataclass(frozen=True)
class Figures:
    """A setting's replayed figures: τ (new tokens per round), acceptance (accepted ÷ drafted), and the
    predicted tokens/s and speedup over AR (NaN where no cost table was at hand)."""

    method: str
    params: dict[str, Any]
    tau: float
    acceptance: float
    tokens_per_s: float
    speedup: float
    rounds: int
    estimate: bool = False


@dataclass
class WhatIf:
    """What the panel replays from: the recording, the pair, the cost table, the Run's parameters and its
    measured results by method, and the settings already replayed."""

    recording: Recording
    pair: Any
    params: DecodeParams
    costs: CostTable | None
    measured: dict[str, GenerationResult]
    book: ChainBook | None = None  # the drafter's chains from every position, drafted once for every setting
    replays: dict[tuple, GenerationResult] = field(default_factory=dict)
    ar_tokens_per_s: float = math.nan
    curve: list = field(default_factory=list)  # the fixed method's Figures at every γ (gamma_curve)

    def base_params(self, method: Method) -> dict[str, Any]:
        """The method's own parameters as the Run had them."""
        return {name: getattr(self.params, name) for name in method.params}

    def replayed(self, method: str, params: Mapping[str, Any]) -> GenerationResult:
        key = (method, tuple(sorted(params.items())))
        if key not in self.replays:
            if self.book is None:
                self.book = chain_book(self.recording, pair=self.pair, methods=(FIXED.name, ADAPTIVE.name),
                                       max_gamma=MAX_GAMMA)
            self.replays[key] = self.book.replay(method, **params)
        return self.replays[key]

    def predicted_tokens_per_s(self, result: GenerationResult) -> float:
        if self.costs is None:
            return math.nan
        return predict_tokens_per_s(result, self.costs, prefill_seconds=self.recording.ar_prefill_seconds)


def sampling_refusal(params: DecodeParams) -> str:
    """Why the panel cannot replay a Run with these parameters ("" where it can): the engine's sentence."""
    if params.sampling.greedy:
        return ""
    # The engine's refusal of a sampled replay reads the parameters alone, never the recording.
    return replay_refusal(None, FIXED.name, params)


def prepare(pair, prompt: str, params: DecodeParams, results: Sequence[GenerationResult],
            costs: CostTable | None | Callable[[Any], CostTable] = cost_table) -> WhatIf:
    """Record greedy AR on `prompt` with the Run's parameters, and get this machine's cost table (`costs`:
    a table, None for none, or how to get one for the pair); ValueError where the Run sampled."""
    refused = sampling_refusal(params)
    if refused:
        raise ValueError(refused)
    recording = record(pair, prompt, max_new_tokens=params.max_new_tokens, chat=params.chat,
                       seed=params.seed or 0, target_kv=params.target_kv, kv_budget=params.kv_budget,
                       kv_sinks=params.kv_sinks)
    table = costs(pair) if callable(costs) else costs
    measured = {r.method: r for r in results if r.method in (REFERENCE, FIXED.name, ADAPTIVE.name)}
    whatif = WhatIf(recording, pair, params, table, measured)
    ar = whatif.replayed(REFERENCE, {})
    if table is not None:
        for method in (FIXED, ADAPTIVE):
            ensure_drafter(table, pair, whatif.replayed(method.name, whatif.base_params(method)))
    whatif.ar_tokens_per_s = whatif.predicted_tokens_per_s(ar)
    whatif.curve = gamma_curve(whatif)
    return whatif


def figures(whatif: WhatIf, method: str, **params) -> Figures:
    """The replayed figures of `method` with `params` over the Run's own (γ_min lowered to γ_max where
    it would exceed it)."""
    spec = METHODS[method]
    chosen = {**whatif.base_params(spec), **params}
    if "gamma_min" in chosen and "gamma_max" in chosen:
        chosen["gamma_min"] = min(chosen["gamma_min"], chosen["gamma_max"])
    result = whatif.replayed(method, chosen)
    stats = result.stats
    tokens_per_s = whatif.predicted_tokens_per_s(result)
    speedup = tokens_per_s / whatif.ar_tokens_per_s if whatif.ar_tokens_per_s else math.nan
    return Figures(method, chosen, stats["mean_accepted_tokens"], stats["acceptance_rate"], tokens_per_s, speedup,
                   stats["rounds"], bool(getattr(result, "estimate", False)))


def gamma_curve(whatif: WhatIf) -> list[Figures]:
    """The fixed-γ method's figures at every γ from 1 to MAX_GAMMA."""
    return [figures(whatif, FIXED.name, gamma=g) for g in range(1, MAX_GAMMA + 1)]


def measured_speedups(whatif: WhatIf) -> list[tuple[str, int, float, float]]:
    """(label, γ, measured, predicted speedup over the Run's AR) of the settings the Run really decoded: the
    fixed method at its γ, the adaptive one at its γ_max; predicted by the replay of that very setting."""
    ar = whatif.measured.get(REFERENCE)
    if ar is None or not ar.stats["tokens_per_s"]:
        return []
    out = []
    for method, axis in ((FIXED, "gamma"), (ADAPTIVE, "gamma_max")):
        run = whatif.measured.get(method.name)
        if run is None:
            continue
        own = {name: run.params[name] for name in KNOB_NAMES if name in method.params and name in run.params}
        x = int(own.get(axis, getattr(whatif.params, axis)))
        out.append((f"{method.label} run ({axis.replace('gamma', 'γ')}={x})", x,
                    run.stats["tokens_per_s"] / ar.stats["tokens_per_s"], figures(whatif, method.name, **own).speedup))
    return out


def run_speed(whatif: WhatIf) -> float:
    """The Run's measured AR tokens/s (NaN without it): a predicted speedup read at today's speed."""
    ar = whatif.measured.get(REFERENCE)
    return ar.stats["tokens_per_s"] if ar is not None else math.nan


def curve_figure(whatif: WhatIf, curve: Sequence[Figures], chosen: Sequence[Figures] = ()):
    """Predicted speedup against γ for this prompt (the fixed method), the chosen settings as points, and
    the Run's measured settings marked by their measured speedups."""
    label = FIXED.label
    traces = [dict(type="scatter", x=[f.params["gamma"] for f in curve], y=[f.speedup for f in curve],
                   mode="lines+markers", name=f"{label} predicted", line=dict(color=viz.method_color(FIXED.name)),
                   customdata=[[f.tau, f.acceptance] for f in curve],
                   hovertemplate=viz.hover_with_label(f"{label} predicted", "γ=%{x}<br>speedup %{y:.2f}×<br>τ "
                                                      "%{customdata[0]:.2f}, acceptance %{customdata[1]:.0%}")),
              dict(type="scatter", x=[1, MAX_GAMMA], y=[1, 1], mode="lines", name="AR",
                   line=dict(color=viz.method_color(REFERENCE), dash="dot"), hoverinfo="skip")]
    for f in chosen:
        x = f.params.get("gamma", f.params.get("gamma_max"))
        traces.append(dict(type="scatter", x=[x], y=[f.speedup], mode="markers", name=f"{METHODS[f.method].label} "
                           "(sliders)", marker=dict(color=viz.method_color(f.method), size=12, symbol="circle-open",
                                                    line=dict(width=3))))
    for name, x, speedup, _ in measured_speedups(whatif):
        method = FIXED if name.startswith(FIXED.label + " ") else ADAPTIVE
        traces.append(dict(type="scatter", x=[x], y=[speedup], mode="markers", name=f"{name}, measured",
                           marker=dict(color=viz.method_color(method.name), size=11, symbol="x")))
    return viz.plain_figure(traces, f"Predicted speedup over AR against γ, this prompt ({label}; "
                            f"{ADAPTIVE.label} at its γ max)", "γ (draft length; γ max for "
                            f"{ADAPTIVE.label})", "speedup over AR", xaxis=dict(dtick=1, rangemode="normal"))


def figures_markdown(whatif: WhatIf, shown: Sequence[Figures]) -> str:
    """The panel's reading of the sliders' settings, one line a method."""
    lines = []
    for f in shown:
        setting = ", ".join(f"{short_label(k)} {v:g}" for k, v in f.params.items() if k in KNOB_NAMES)
        at_run = f.speedup * run_speed(whatif)
        speed = ("no prediction (no cost table)" if math.isnan(f.speedup) else f"predicted **{f.speedup:.2f}×** AR"
                 + (f" (≈ {at_run:.1f} tok/s at the Run's AR speed)" if not math.isnan(at_run) else ""))
        lines.append(f"- **{METHODS[f.method].label}** ({setting}): τ **{f.tau:.2f}** tokens per round, acceptance "
                     f"**{_pct(f.acceptance)}**, {speed}, {f.rounds} rounds"
                     + (" — *an estimate: this target is exact only up to near-ties*" if f.estimate else ""))
    checks = [f"{name}: predicted {predicted:.2f}×, measured {measured:.2f}×"
              for name, _, measured, predicted in measured_speedups(whatif) if not math.isnan(predicted)]
    if checks:
        lines.append("\nThe prediction at the Run's own settings, against what the Run measured: " + "; ".join(checks)
                     + ". τ and acceptance are exact; the speedups are only as good as the cost table.")
    return "\n".join(lines)


def short_label(name: str) -> str:
    """A parameter as the panel's readings name it: its page label without the method or the gloss."""
    return re.sub(r" \(.*\)$", "", PARAMS[name].label.split(": ", 1)[-1])


def _pct(value: float) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.0%}"


def ready_line(whatif: WhatIf) -> str:
    r = whatif.recording
    return (f"Replayed from greedy AR recorded on this prompt ({len(r.tokens)} tokens, {r.runtime}); the "
            f"{DRAFT_ROLE}'s rounds are exact, the {TARGET_ROLE} never runs, and tokens/s is predicted from this "
            "machine's cost table.")


# --------------------------------------------------------------------------- the panel

RECORDING = ("⏳ Recording greedy AR on this prompt once more, now that the Run's timed rounds are over (one AR "
             "decode; the first time on this machine, also a few seconds of calibrating its cost table) …")
IDLE = ("After a greedy **Run**, move the sliders to see what other settings would have done on the same "
        "prompt: replayed exactly from AR's recorded run, without decoding again.")


@dataclass
class WhatIfPanel:
    status: gr.Markdown
    sliders: dict[str, gr.Slider]  # by Knob.key
    reading: gr.Markdown
    chart: gr.Plot
    quiet: gr.Markdown
    kept: BySession[WhatIf] = field(default_factory=BySession)
    ran: BySession[tuple] = field(default_factory=BySession)  # (prompt, params, results) of the last Run

    @classmethod
    def build(cls, initial: Mapping[str, Any]) -> "WhatIfPanel":
        with gr.Accordion("What if: other γ and EGAG settings on this prompt, replayed from AR", open=True,
                          elem_id="sd-whatif"):
            status = gr.Markdown(IDLE, elem_id="sd-whatif-status")
            sliders = {}
            with gr.Row():
                for knob in KNOBS:
                    value = initial.get(knob.name, PARAMS[knob.name].default)
                    sliders[knob.key] = gr.Slider(knob.low, knob.high, value=min(max(value, knob.low), knob.high),
                                                  step=knob.step, label=knob.label,
                                                  elem_id=f"sd-whatif-{knob.method}-{knob.name}".replace("_", "-"))
            reading = gr.Markdown("", elem_id="sd-whatif-figures")
            chart = gr.Plot(label="whatif_chart", show_label=False, elem_id="sd-whatif-chart")
            # Where a slider's event shows its progress: nowhere a visitor looks (the answer takes milliseconds).
            quiet = gr.Markdown("", visible=False)
        return cls(status, sliders, reading, chart, quiet)

    def remember_run(self, session: str | None, prompt: str, params: DecodeParams,
                     results: Sequence[GenerationResult], load_pair: Callable[[], Any]) -> None:
        """Keep what the visitor's Run decoded (and how to get its pair) for the panel's next preparation."""
        self.ran.set(session, (prompt, params, list(results), load_pair))

    def outputs(self) -> list[Any]:
        return [self.status, self.reading, self.chart]

    def wire(self, after: Any, queue_id: str, gpu: Callable[[Callable], Callable] = lambda fn: fn) -> None:
        """Prepare the panel once the Run's event `after` ends (it decodes AR again: in the page's decoding
        queue, under `gpu`), and read the sliders on each change (bookkeeping: outside the queue)."""
        sliders = list(self.sliders.values())

        def in_order(values: dict) -> list[float]:  # a set of inputs arrives as {component: value}
            return [values[slider] for slider in sliders]

        def prepare_panel(values: dict, request: gr.Request):
            if self.ran.get(session_id(request)) is not None:
                yield RECORDING, gr.skip(), gr.skip()
            yield self.prepared(session_id(request), in_order(values), gpu)

        def move(values: dict, request: gr.Request):
            return self.read(session_id(request), in_order(values))

        after.then(prepare_panel, inputs=set(sliders), outputs=self.outputs(), api_visibility="private",
                   show_progress="hidden", show_progress_on=[self.status], concurrency_id=queue_id)
        def tab_closed(request: gr.Request) -> None:  # a visitor's recording and replays go with their tab
            self.kept.pop(session_id(request))
            self.ran.pop(session_id(request))

        Context.root_block.unload(tab_closed)  # the Blocks being built: the page
        for slider in sliders:  # a change comes with every value a drag passes and with the release
            slider.change(move, inputs=set(sliders), outputs=self.outputs()[1:], api_visibility="private",
                          show_progress="hidden", show_progress_on=[self.quiet], queue=False,
                          trigger_mode="always_last")

    def prepared(self, session: str | None, values: Sequence[float],
                 gpu: Callable[[Callable], Callable] = lambda fn: fn) -> tuple:
        ran = self.ran.pop(session)
        if ran is None:
            return gr.skip(), gr.skip(), gr.skip()
        prompt, params, results, load_pair = ran
        refused = sampling_refusal(params)
        try:
            if refused:
                raise ValueError(refused)
            pair = load_pair()
            whatif = gpu(prepare_on_decoding_thread)(pair, prompt, params, results)
        except ValueError as error:
            self.kept.pop(session)
            return f"⚠️ The What-if panel cannot replay this Run: {error}", "", None
        self.kept.set(session, whatif)
        return (ready_line(whatif), *self.reading_of(whatif, values))

    def read(self, session: str | None, values: Sequence[float]) -> tuple:
        whatif = self.kept.get(session)
        if whatif is None:
            return gr.skip(), gr.skip()
        return self.reading_of(whatif, values)

    def reading_of(self, whatif: WhatIf, values: Sequence[float]) -> tuple:
        shown = slider_figures(whatif, values)
        return figures_markdown(whatif, shown), curve_figure(whatif, whatif.curve, shown)


def slider_figures(whatif: WhatIf, values: Sequence[float]) -> list[Figures]:
    """Each method's figures at the sliders' values (in KNOBS order)."""
    by_method: dict[str, dict[str, Any]] = {}
    for knob, value in zip(KNOBS, values):
        kind = PARAMS[knob.name].kind
        by_method.setdefault(knob.method, {})[knob.name] = kind(value)
    return [figures(whatif, method, **params) for method, params in by_method.items()]


def prepare_on_decoding_thread(pair, prompt: str, params: DecodeParams,
                               results: Sequence[GenerationResult]) -> WhatIf:
    """`prepare` on the page's decoding thread, where the Run's rounds ran (torch's threads belong to it)."""
    return decoding_thread().submit(prepare, pair, prompt, params, results).result()
