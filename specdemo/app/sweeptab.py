"""The page's Sweep tab and the /sweep endpoint: `specdemo sweep` run from the browser.

The handlers are plain functions: `make_sweep_request` validates a form into a
`SweepRequest`, `stream_sweep` yields `SweepUpdate`s (progress, the charts redrawn as
points finish, then the verdict, the summary and the files) and `sweep_outcome` runs one
to the end for the API. Axes around the grid (the models' precisions, the KV caches and their
budget, as `specdemo sweep --target-dtype … --draft-kv … --kv-budget …` takes them) run the
whole grid once per combination, AR included, and the table then sets the combinations side by
side (`bench.sweep.axes.axes_table`). `build_tab` lays the tab out and maps those onto components.
The sweep itself is `bench.sweep`, the same code the command line runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Mapping, Sequence

import gradio as gr
import pandas as pd

from . import forms, handlers
from .benchtab import timed_another_runtime
from ..bench import sweep
from ..bench.sweep.axes import CACHE_AXES, PRECISION_AXES, SAMPLING_AXES, axes_table, combinations, label, parse_axis, stacked
from ..bench.sweep.charts import temperature_figure
from ..bench.suite import DEFAULT_SUITE, SUITE_CATEGORIES, SuitePrompt, load_suite, select_prompts
from ..engine.methods import BASELINES, ENTROPY_GAMMA, FIXED_GAMMA, METHODS, REFERENCE
from ..engine.params import PARAMS, DecodeParams
from ..models.loading import ModelPair, Preset
from ..engine.runtimes import TORCH, runtime_named
from ..models.precision import resolve_precision
from .limits import Limits
from .page import TabContext, session_id, shown_choices, wire_stop
from .playgroundtab import runtime_control
from .streams import StatusThenDraw, in_worker, wire_status_then_draw
from .suite_runtime import (chosen_runtime, offer_runtime, pair_runtimes, refuse_unavailable, suite_threads,
                            unavailable_methods)

GRID = tuple(sweep.SETTING_COLUMNS)  # gamma, gamma_max, ema, ngram_n, copy_n, node_budget: comma-separated lists here
SHARED_PARAMS = tuple(name for name in PARAMS if name not in GRID)  # one value for every grid point
# The form's names of the axes: comma-separated lists. The temperature's comes after the runtime, so that the
# parameters before it keep their places.
AXIS_FIELDS = {name: f"{name}_axis" for name in (*PRECISION_AXES, *CACHE_AXES)}
TEMPERATURE_AXIS = "temperature_axis"
AXIS_LABELS = {"target_dtype": "Target precisions", "draft_dtype": "Draft precisions",
               "draft_kv": "Draft KV caches (full, streaming, l2, head)", "target_kv": "Target KV caches",
               "kv_budget": "KV budgets (positions per head)"}
FORM = ("preset", "methods", *GRID, "categories", "prompts_per_category", "repeats",
        *AXIS_FIELDS.values())  # before SHARED_PARAMS
FORM_AFTER = ("runtime", TEMPERATURE_AXIS)  # after SHARED_PARAMS, so that the parameters before them keep their places
REPLAY = "replay"  # the page's switch to the replayed sweep, after FORM_AFTER (the page's own event takes it, /sweep not)
REPLAY_LABEL = "replay (greedy, exact; times predicted)"
REPLAY_INFO = ("record greedy AR once per prompt and replay every setting from it over the draft's shared chains: "
               "rounds and τ are a real run's, tokens/s and speedups are predicted by this machine's cost table "
               "(calibrated once, a few seconds, then cached); one combination, no repeats")
# What the form's names outside the shared schema parameters mean, as /sweep's docstring says it.
FORM_HELP = {
    "preset": "the model pair (target + draft) by its preset's name",
    "methods": "the methods to sweep, by their names (AR always runs, as every point's reference)",
    **{name: f"comma-separated values of {name} for the grid: {forms.schema_help(PARAMS[name])} "
             "(read only by the methods that take it)" for name in GRID},
    "categories": "the suite's categories to take prompts from",
    "prompts_per_category": "how many of each category's prompts every point runs",
    "repeats": "how many times every point runs each prompt",
    **{field_name: f"comma-separated values of {name} as an axis: the grid runs once per value, AR included "
                   "(empty: not an axis)" for name, field_name in AXIS_FIELDS.items()},
    "runtime": "what runs the target's forwards: torch, or onnx where the page offers it",
    TEMPERATURE_AXIS: "comma-separated temperatures, e.g. 0,0.7,1.0: the grid runs at each, AR included as that "
                      "temperature's reference (empty: the shared temperature)",
}
RUNTIME_INFO = ("onnx: the target on ONNX Runtime (the CPU), exported on first use (about 30 s); trees, beam "
                "search and AR without a cache run on its torch copy, set against AR on that copy; compressing "
                "target KV caches and target precisions other than float32, int8 and int4 run on torch only")
# Each grid field and the methods swept over it (their `Sweep.axes`): a field is read when one of them is chosen.
SWEPT_OVER = {name: tuple(m for m in sweep.SWEEP_METHODS if name in METHODS[m].sweep.axes) for name in GRID}
# What a grid field's values are, after the methods it is for.
GRID_VALUES = {"gamma": "γ values", "gamma_max": "γ_max values", "ema": "EMA β values", "ngram_n": "n values",
               "copy_n": "copy_n values (0 = off; empty = the default)", "node_budget": "node budgets",
               "adaedl_lambda": "λ values", "entropy_stop": "entropy thresholds", "specdecpp_threshold": "thresholds"}


def grid_label(name: str) -> str:
    """A grid field's label: the methods swept over it by default (where none is, every one), then its values."""
    methods = [m for m in SWEPT_OVER[name] if METHODS[m].sweep.by_default] or SWEPT_OVER[name]
    return f"{' / '.join(METHODS[m].label for m in methods)}: {GRID_VALUES.get(name, f'{name} values')}"


GRID_LABELS = {name: grid_label(name) for name in GRID}
# Empty when the tab opens: the fields that every method swept over them may leave without values
# (`Sweep.optional`; a per-token rule's threshold runs at its parameter's default).
UNSET_BY_DEFAULT = tuple(name for name in GRID if all(
    name in METHODS[m].sweep.optional or not METHODS[m].sweep.needs_values for m in SWEPT_OVER[name]))
# The methods the tab offers: every one a sweep grids, in its grid's order, then the baselines.
METHOD_CHOICES = [*((METHODS[m].sweep.choice or METHODS[m].label, m) for m in sweep.SWEEP_METHODS),
                  *((METHODS[m].label, m) for m in BASELINES)]
DEFAULT_CATEGORIES = ("chat", "code")
TABLE_COLUMNS = ["label", "runs", "speedup_vs_ar", "speedup_vs_ar_std", "tokens_per_s", "acceptance_rate",
                 "mean_accepted_tokens", "mean_gamma", "wasted_drafts_per_token", "target_forwards_per_token",
                 "draft_flops_per_token", "target_flops_per_token", "predicted_speedup", "exact_match_pct"]
CHARTS = tuple(sweep.FIGURES)  # in rows of two
PLACEHOLDER = "*Run the sweep to fill these charts and the table.*"


def _csv(values: Sequence[float]) -> str:
    return ",".join(f"{v:g}" for v in values)


def default_form(limits: Limits) -> dict[str, Any]:
    """The tab's initial values: the sweep's default grid, or a smaller one within a public deployment's caps."""
    capped = limits.sweep_caps()["settings"] is not None
    grid = ({"gamma": "1,2,3,4", "gamma_max": "3,4", "ema": "0.9"} if capped else
            {"gamma": _csv(sweep.DEFAULT_GAMMAS), "gamma_max": _csv(sweep.DEFAULT_GAMMA_MAXES),
             "ema": _csv(sweep.DEFAULT_EMAS)})
    return {"methods": [FIXED_GAMMA, ENTROPY_GAMMA], **grid, "ngram_n": _csv(sweep.DEFAULT_NGRAM_NS),
            "node_budget": "3,8", **{name: "" for name in UNSET_BY_DEFAULT},
            "categories": list(DEFAULT_CATEGORIES), "prompts_per_category": 1, "repeats": 1,
            "max_new_tokens": min(64, limits.max_new_tokens), "seed": 0, "chat": True}


REPLAY_TABLE_COLUMNS = ["label", "replayed", "runs", "predicted_speedup_vs_ar", "predicted_tokens_per_s",
                        "acceptance_rate", "mean_accepted_tokens", "mean_gamma", "wasted_drafts_per_token",
                        "target_forwards_per_token", "exact_match_pct"]


def table(summary: pd.DataFrame) -> pd.DataFrame:
    """The tab's columns of a summary; a replayed sweep's shows its predicted time columns, named so, and
    which rows were replayed, instead of the measured ones (NaN on a replayed row)."""
    columns = list(REPLAY_TABLE_COLUMNS if "replayed" in summary else TABLE_COLUMNS)
    if timed_another_runtime(summary):  # which target each setting timed, as the Benchmark tab shows it
        columns.insert(columns.index("label") + 1, "runtime")
    shown = summary[columns].copy()
    numeric = shown.select_dtypes("number").columns
    shown[numeric] = shown[numeric].round(3)
    return shown.rename(columns={"label": "setting"})


# --------------------------------------------------------------------------- form → request


@dataclass
class SweepRequest:
    target: str
    draft: str | None
    settings: list[sweep.Setting]  # AR first
    prompts: list[SuitePrompt]
    repeats: int
    params: DecodeParams  # the shared parameters; each setting overrides its own
    # Each combination of the axes with its checked parameters; empty: one sweep with `params`.
    combinations: list[tuple[dict[str, Any], DecodeParams]] = field(default_factory=list)
    runtime: str = TORCH  # what runs the target's forwards
    replay: bool = False  # record greedy AR once per prompt and replay the grid from it (`bench.sweep.replay`)


def _whole(name: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number, got {value!r}") from None
    if number != value:
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if number < 1:
        raise ValueError(f"{name} must be at least 1, got {number}")
    return number


def _grid_values(name: str, text: Any) -> list[float]:
    parts = text if isinstance(text, (list, tuple)) else str(text or "").replace(";", ",").split(",")
    values = []
    for part in parts:
        if str(part).strip() == "":
            continue
        try:
            values.append(float(part))
        except (TypeError, ValueError):
            raise ValueError(f"{name}: {str(part).strip()!r} is not a number; write values like 1,2,4") from None
    return values


def make_sweep_request(form: Mapping[str, Any], presets: Mapping[str, Preset], limits: Limits,
                       suite: Sequence[SuitePrompt] | None = None, runtimes: Sequence[str] = (TORCH,),
                       auto_runtime: str = TORCH) -> SweepRequest:
    """Validate a sweep form (FORM's and FORM_AFTER's names and the shared decoding parameters) before
    loading anything; ValueError names the field. runtimes: the target runtimes the page serves, its
    default first (`TabContext.runtimes`); auto_runtime: what auto gives a target here."""
    limits.check_models(form.get("preset"), known=presets)
    methods = form.get("methods")
    methods = methods.split(",") if isinstance(methods, str) else list(methods or [])
    methods = [m.strip().lower() for m in methods if m and m.strip() and m.strip().lower() != REFERENCE]
    if not methods:
        raise ValueError(f"methods: choose at least one of {', '.join(sweep.SWEEP_METHODS)} (AR always runs)")
    grid = {name: _grid_values(name, form.get(name)) if set(SWEPT_OVER[name]) & set(methods) else None
            for name in GRID}
    params = DecodeParams.from_values(**{name: form.get(name) for name in SHARED_PARAMS})
    planned = axis_combinations(form, params)
    settings = sweep.expand_grid(**grid, methods=methods, gamma_min=params.gamma_min, nasd_gamma=params.gamma)
    categories = form.get("categories")
    categories = categories.split(",") if isinstance(categories, str) else list(categories or [])
    if not [c for c in categories if c.strip()]:
        raise ValueError("categories: choose at least one")
    per_category = _whole("prompts per category", form.get("prompts_per_category"))
    repeats = _whole("repeats", form.get("repeats"))
    prompts = select_prompts(list(suite) if suite is not None else load_suite(DEFAULT_SUITE), categories,
                             per_category)
    limits.check_sweep((len(settings) - 1) * max(len(planned), 1), len(prompts), repeats)
    limits.check_new_tokens(params.max_new_tokens)
    chosen = presets[form["preset"]]
    # What the runtime's offer reads of a page.
    page = SimpleNamespace(presets=presets, runtimes=tuple(runtimes), auto_runtime=auto_runtime)
    runtime = chosen_runtime(page, form["preset"], form.get("runtime"))
    # A tree the runtime cannot verify runs on the torch copy, beside that copy's AR (`bench.sweep.sweep_runs`).
    refuse_unavailable(methods, unavailable_methods(chosen.draft_kind, runtime, pair_runtimes(page, form["preset"]),
                                                    torch_copy=True))
    refuse_on_runtime(runtime, planned or [({}, params)])
    replay = bool(form.get(REPLAY))
    if replay:
        refuse_replay(planned or [({}, params)])
    return SweepRequest(chosen.target, chosen.draft, settings, prompts, repeats, params, planned, runtime,
                        replay=replay)


def refuse_replay(planned: Sequence[tuple[dict[str, Any], DecodeParams]]) -> None:
    """ValueError where a replayed sweep cannot stand in for the real one: several combinations of the axes,
    or a sampled one (a sampled run leaves greedy AR's path, where nothing was recorded)."""
    if len(planned) > 1:
        raise ValueError(f"{REPLAY_LABEL}: a replay sweeps one pair on one precision, cache and temperature; "
                         "give each axis one value at most, or untick replay")
    params = planned[0][1]
    if not params.sampling.greedy:
        raise ValueError(f"{REPLAY_LABEL}: temperature {params.temperature} samples, and a sampled run leaves "
                         "greedy AR's path, where nothing was recorded; set the temperature to 0, or untick replay")


def refuse_on_runtime(runtime: str, planned: Sequence[tuple[dict[str, Any], DecodeParams]]) -> None:
    """ValueError naming the first setting of the axes or the shared parameters that the target's runtime
    refuses (`Runtime.refusal`): a compressing target cache or a target precision it has no export for. The
    draft runs at any precision beside it."""
    rules = runtime_named(runtime)
    for combination, params in planned:
        precision = resolve_precision(combination.get("target_dtype"), "cpu").name
        for setting, refused in ((f"target_kv={params.target_kv}", rules.refusal(target_kv=params.target_kv)),
                                 (f"target_dtype={precision}", rules.refusal(precision=precision))):
            if refused:
                raise ValueError(f"{setting}: {refused}")


def axis_combinations(form: Mapping[str, Any], params: DecodeParams) -> list[tuple[dict[str, Any], DecodeParams]]:
    """Each combination of the form's axes with the shared parameters it runs under, checked (a
    ValueError names the axis, or the combination that cannot run); [] when no axis has values."""
    axes = {name: parse_axis(name, form.get(field_name)) for name, field_name in AXIS_FIELDS.items()}
    axes["temperature"] = parse_axis("temperature", form.get(TEMPERATURE_AXIS))
    if not any(axes.values()):
        return []
    planned = []
    for combination in combinations(axes):
        caches = {name: value for name, value in combination.items() if name in (*CACHE_AXES, *SAMPLING_AXES)}
        try:
            planned.append((combination, DecodeParams.from_values(**{**params.as_dict(), **caches})))
        except ValueError as error:
            raise ValueError(f"{label(combination)}: {error}") from None
    return planned


# --------------------------------------------------------------------------- the run


@dataclass
class SweepFiles:
    rows_csv: str
    summary_csv: str
    report: str


@dataclass
class SweepUpdate:
    """One step of a sweep as data: progress, and whatever changed since the last step."""

    done: int
    total: int
    message: str
    figures: dict[str, Any] | None = None  # sweep.FIGURES by name, when new points finished
    table: pd.DataFrame | None = None  # the summary so far (the tab's columns)
    verdict: str | None = None
    files: SweepFiles | None = None  # at the end
    result: sweep.SweepResult | None = None  # at the end
    finished: bool = False


def sweep_events(pair: ModelPair, request: SweepRequest, warmup: bool = True,
                 threads: int | None = None) -> Iterator[tuple[sweep.SweepEvent, list]]:
    """`iter_sweep` run in a worker thread on `threads` torch threads (None: the count a new thread
    starts with, the last one set anywhere): (event, rows so far) pairs.

    Closing this generator (Stop, a closed tab) asks the sweep to stop and returns only once
    the worker has finished its current run, so the caller holds the device queue, and the
    pair, until nothing decodes on it any more (the pattern of the Benchmark tab's `measure`).
    """
    stop = threading.Event()

    def produce(put) -> None:
        for event in sweep.iter_sweep(pair, request.prompts, request.settings, repeats=request.repeats,
                                      warmup=warmup, should_stop=stop.is_set, **request.params.as_dict()):
            put((event, list(event.rows)))

    return in_worker(produce, "specdemo-sweep", threads, on_close=stop.set)


def replay_events(pair: ModelPair, request: SweepRequest,
                  threads: int | None = None) -> Iterator[tuple[int, int, str, sweep.SweepResult | None]]:
    """`replay_sweep` run in a worker thread on `threads` torch threads: (done, total, message, None) after
    each prompt's recording and replays, then (done, total, "done", the result). Closing it waits for the
    worker (a replay holds the pair until its prompt ends, as a sweep's run does)."""
    from ..bench.sweep.replay import replay_sweep

    def produce(put) -> None:
        result = replay_sweep(pair, request.prompts, request.settings,
                              progress=lambda done, total, message: put((done, total, message, None)),
                              **request.params.as_dict())
        put((1, 1, "done", result))

    return in_worker(produce, "specdemo-sweep-replay", threads)


def stream_sweep(request: SweepRequest, load: Callable[..., ModelPair],
                 export: Callable[[], Path], gpu: Callable[[Callable], Callable] = lambda fn: fn,
                 warmup: bool = True, threads: int | None = None) -> Iterator[SweepUpdate]:
    """Load the pair (its target on the request's runtime) and sweep (on `threads` torch threads), once per
    combination of the axes: progress while it runs, then the charts, table and verdict once.

    Nothing is summarised or drawn while runs are timed: on a small machine the server's and the
    browser's drawing would take the cores the timed runs need."""
    planned = request.combinations or [({}, request.params)]
    runs: list[tuple[dict[str, Any], sweep.SweepResult]] = []
    done = total = 0
    for i, (combination, params) in enumerate(planned):
        where = f"{label(combination)}: " if combination else ""
        loading = f"Loading the model pair{handlers.runtime_loading_note(request.runtime)} …"
        yield SweepUpdate(done, total, where + loading)
        precisions = {name: combination[name] for name in PRECISION_AXES if name in combination}
        pair = load(request.target, request.draft, runtime=request.runtime, **precisions)
        one = dataclasses.replace(request, params=params, combinations=[])
        if request.replay:
            for done, total, message, result in gpu(replay_events)(pair, one, threads):
                if result is None:
                    yield SweepUpdate(done, total, message)
            runs.append((combination, result))
            break
        rows: list[dict] = []
        event = None
        for event, rows in gpu(sweep_events)(pair, one, warmup, threads):
            total = event.total * len(planned)
            done = i * event.total + event.done
            yield SweepUpdate(done, total, where + event.message)
        runs.append((combination, sweep.sweep_result(
            pair, rows, request.settings, repeats=request.repeats, warmup=warmup, stopped=bool(event and event.stopped),
            tokens=event.tokens if event else None, **params.as_dict())))
        del pair  # one pair in memory at a time
        if event is not None and event.stopped:
            break
    yield _finished(runs, export(), done)


def _finished(runs: list[tuple[dict[str, Any], sweep.SweepResult]], folder: Path, done: int) -> SweepUpdate:
    """The last update: one sweep's charts, summary and verdict; over axes, the combinations side
    by side (`axes_table`), each one's verdict, the stacked CSVs and the first one's charts."""
    files = SweepFiles(str(folder / "sweep.csv"), str(folder / "sweep.summary.csv"), str(folder / "sweep-report.html"))
    combination, first = runs[0]
    if len(runs) == 1 and not combination:
        sweep.write_outputs(first, files.rows_csv, files.summary_csv, files.report)
        summary = first.summary
        return SweepUpdate(done, done, "done", sweep.sweep_figures(predicted_as_measured(summary)), table(summary),
                           first.verdict, files, first, finished=True)
    rows, summary = stacked(runs, "rows"), stacked(runs, "summary")
    rows.to_csv(files.rows_csv, index=False)
    summary.to_csv(files.summary_csv, index=False)
    side_by_side = axes_table(runs)
    verdict = "\n\n".join(f"**{label(c)}**: {r.verdict}" for c, r in runs)
    Path(files.report).write_text(
        f"<!doctype html><meta charset='utf-8'><title>Speculative decoding sweep over axes</title>"
        f"<h1>Speculative decoding sweep over {html.escape(', '.join(c for c in combination))}</h1>"
        f"{side_by_side.to_html(index=False, float_format='{:.3f}'.format)}"
        + "".join(f"<p><b>{html.escape(label(c))}</b>: {html.escape(r.verdict)}</p>" for c, r in runs),
        encoding="utf-8")
    shown = side_by_side.copy()
    numeric = shown.select_dtypes("number").columns
    shown[numeric] = shown[numeric].round(3)
    result = sweep.SweepResult(rows, first.settings, {**first.meta, "combinations": len(runs)},
                               stopped=runs[-1][1].stopped, _summary=summary)
    figures = sweep.sweep_figures(first.summary)
    if "temperature" in combination:
        figures["temperature"] = temperature_figure(summary)
    return SweepUpdate(done, done, "done", figures, shown, verdict, files, result, finished=True)


def predicted_as_measured(summary: pd.DataFrame) -> pd.DataFrame:
    """A replayed sweep's summary as the charts read one: a replayed row's predicted speedup and tokens/s in
    the measured columns (NaN there otherwise); a real sweep's summary as it is."""
    if "replayed" not in summary:
        return summary
    shown = summary.copy()
    replayed = shown.replayed.astype(bool)
    for measured, predicted in (("speedup_vs_ar", "predicted_speedup_vs_ar"), ("tokens_per_s", "predicted_tokens_per_s")):
        shown.loc[replayed, measured] = shown.loc[replayed, predicted]
    return shown


def sweep_outcome(request: SweepRequest, load, export, gpu=lambda fn: fn, threads: int | None = None) -> SweepUpdate:
    """The last update of `stream_sweep`: the whole sweep, for the API."""
    last = None
    for last in stream_sweep(request, load, export, gpu, threads=threads):
        pass
    assert last is not None and last.finished
    return last


# --------------------------------------------------------------------------- the tab


def build_tab(ctx: TabContext) -> None:
    """Lay the tab out inside the current Blocks and wire the page's run and /sweep."""
    initial = default_form(ctx.limits)
    caps = ctx.limits.sweep_caps()
    capped = ", ".join(f"{v} {k}" for k, v in caps.items() if v is not None)
    gr.Markdown(
        "Where does fixed-γ SD peak, and does EGAG reach that peak without tuning? A sweep runs SD at each γ, "
        "EGAG at each (γ_max, EMA) and NASD at each n on the same prompts, with AR interleaved so every speedup "
        "is a ratio from the same run. The charts appear when the sweep ends: nothing is drawn while runs are "
        "timed. The same run from a terminal: `python -m specdemo sweep --pair embedded` (`--runtime onnx`)."
        + (f" This demo allows at most {capped}." if capped else "")
    )
    form = _inputs(ctx, initial)
    with gr.Row():
        run_btn = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
    outputs = _outputs()
    _wire_page(ctx, form, run_btn, stop_btn, outputs)
    _wire_api(ctx, form, initial)


@dataclass
class SweepForm:
    """The tab's input components: FORM's names, then the shared parameters' controls."""
    preset: Any
    methods: Any
    grid: dict[str, Any]  # GRID's names
    categories: Any
    prompts: Any
    repeats: Any
    axes: dict[str, Any]  # AXIS_FIELDS' names
    controls: dict[str, Any]  # SHARED_PARAMS' names
    runtime: Any  # FORM_AFTER
    temperature_axis: Any  # FORM_AFTER
    replay: Any = None  # REPLAY: the page's event alone takes it

    def inputs(self, methods: Any = None, categories: Any = None) -> list[Any]:
        """The event's inputs in `forms.endpoint(…, FORM, FORM_AFTER, params=SHARED_PARAMS)` order;
        methods and categories replace the page's own (the API's, with every choice offered)."""
        return [self.preset, self.methods if methods is None else methods, *self.grid.values(),
                self.categories if categories is None else categories,
                self.prompts, self.repeats, *self.axes.values(),
                *forms.inputs(self.controls, params=SHARED_PARAMS, after=[self.runtime, self.temperature_axis])]


def _inputs(ctx: TabContext, initial: Mapping[str, Any]) -> SweepForm:
    with gr.Row():
        preset = gr.Dropdown(label="Model pair", value=ctx.default_preset, interactive=True,
                             choices=list(ctx.presets), elem_id="sweep-preset")
        runtime = runtime_control(ctx, "sweep-runtime", RUNTIME_INFO, pair_runtimes(ctx, ctx.default_preset))
        methods = gr.CheckboxGroup(label="Methods (AR always runs)", value=initial["methods"],
                                   choices=METHOD_CHOICES, elem_id="sweep-methods")
    offer_runtime(ctx, preset, runtime)
    with gr.Row():
        grid = {name: gr.Textbox(initial[name], label=GRID_LABELS[name], elem_id=f"sweep-{name.replace('_', '-')}",
                                 info="comma-separated") for name in GRID}
    with gr.Row():
        categories = gr.CheckboxGroup(label="Categories", value=initial["categories"], choices=shown_choices(SUITE_CATEGORIES),
                                      elem_id="sweep-categories")
        prompts = gr.Number(value=initial["prompts_per_category"], precision=0, label="Prompts per category")
        repeats = gr.Number(value=initial["repeats"], precision=0, label="Repeats")
    with gr.Accordion("Axes: precisions, KV caches and temperature (each combination runs the whole grid again, "
                      "AR included)", open=False):
        with gr.Row():
            axes = {field_name: gr.Textbox("", label=AXIS_LABELS[name], info="comma-separated; empty = not an axis",
                                           elem_id=f"sweep-{name.replace('_', '-')}-axis")
                    for name, field_name in AXIS_FIELDS.items()}
            temperature_axis = gr.Textbox("", label="Temperatures (e.g. 0,0.7,1.0)", elem_id="sweep-temperature-axis",
                                          info="comma-separated; AR at each is that temperature's reference; "
                                               "empty = the shared temperature")
    with gr.Row():
        controls = forms.param_controls(("max_new_tokens",), initial,
                                        maxima={"max_new_tokens": ctx.limits.max_new_tokens})
        replay = gr.Checkbox(False, label=REPLAY_LABEL, info=REPLAY_INFO, elem_id="sweep-replay")
    with gr.Accordion("Decoding settings shared by every point", open=False):
        controls.update(forms.param_controls([n for n in SHARED_PARAMS if n != "max_new_tokens"], initial,
                                             row_width=forms.ROW_WIDTH))
    return SweepForm(preset, methods, grid, categories, prompts, repeats, axes, controls, runtime, temperature_axis,
                     replay)


def _outputs() -> list[Any]:
    """status, verdict, the summary table, the charts (`CHARTS` order), the three downloads, the
    placeholder and the results column it stands in for until a sweep starts, then acceptance and
    speedup against temperature (empty without a temperature axis)."""
    status = gr.Markdown("", elem_id="sweep-status")
    verdict = gr.Markdown("", elem_id="sweep-verdict")
    placeholder = gr.Markdown(PLACEHOLDER, elem_id="sweep-placeholder")
    chart_id = "sweep-{}-chart".format
    with gr.Column(visible=False, elem_id="sweep-results") as results:
        plots = []
        for i in range(0, len(CHARTS), 2):
            with gr.Row(equal_height=True):
                plots += [gr.Plot(show_label=False, elem_id=chart_id(name.replace("_", "-")))
                          for name in CHARTS[i : i + 2]]
        summary_table = gr.Dataframe(interactive=False, show_label=False, elem_id="sweep-table", wrap=True)
        temperature_plot = gr.Plot(show_label=False, elem_id="sweep-temperature-chart")
    with gr.Row():
        files = [gr.DownloadButton("Runs (CSV)", interactive=False, elem_id="sweep-rows-csv"),
                 gr.DownloadButton("Summary (CSV)", interactive=False, elem_id="sweep-summary-csv"),
                 gr.DownloadButton("Report (HTML)", interactive=False, elem_id="sweep-report")]
    return [status, verdict, summary_table, *plots, *files, placeholder, results, temperature_plot]


def page_values(update: SweepUpdate) -> str | tuple:
    """A `SweepUpdate` as the page takes it: the status line while the sweep runs, then the values of
    `_outputs`' components (the placeholder giving way to the results)."""
    if not update.finished:
        return f"Running: {update.done}/{update.total} — {update.message}" if update.total else update.message
    result, files = update.result, update.files
    over = result.meta.get("combinations")
    runtime = result.meta.get("runtime") or TORCH
    status = (f"Done: {len(result.rows)} runs, {len(result.settings)} settings on {result.meta.get('prompts')} "
              f"prompts × {result.meta.get('repeats')} repeats" + (f" × {over} combinations of the axes (the charts: "
              "the first one's)" if over else "") + f", {result.meta.get('device')}"
              + ("" if runtime == TORCH else f", the target on {runtime}") + "."
              + (" Replayed from one recorded greedy AR run per prompt: rounds, τ and acceptance are exact, "
                 "tokens/s and speedups are predicted by this machine's cost table (the charts' speedups too)."
                 if result.meta.get("replayed") else ""))
    figures = update.figures or {}
    return (status, update.verdict or "", update.table, *(figures.get(name) for name in CHARTS),
            *(gr.update(value=path, interactive=True) for path in (files.rows_csv, files.summary_csv, files.report)),
            gr.update(visible=False), gr.update(visible=True), figures.get("temperature"))


def sweep_threads(ctx: TabContext, runtime: str) -> int | None:
    """The count a sweep decodes on: the page's plan for a suite on `runtime` (`suite_threads`), one count for
    the whole sweep (None: the count the worker starts with)."""
    plan = suite_threads(ctx, runtime)
    return plan.count if plan is not None else None


def page_sweep(ctx: TabContext, values: Mapping[str, Any], progress: Callable) -> Iterator[str | tuple]:
    """The page's run of a form (FORM's, SHARED_PARAMS' and FORM_AFTER's names): checked against the page (its
    limits, its runtimes) before loading, then swept on the runtime's thread plan, each update as `page_values`
    gives it; a ValueError reads as the page's error."""
    try:
        req = make_sweep_request(values, ctx.presets, ctx.limits, runtimes=ctx.runtimes, auto_runtime=ctx.auto_runtime)
    except ValueError as error:
        raise gr.Error(str(error), print_exception=False) from None
    try:
        with contextlib.closing(stream_sweep(req, ctx.load, ctx.export, ctx.gpu,
                                               threads=sweep_threads(ctx, req.runtime))) as updates:
            for update in updates:
                if update.total and not update.finished:
                    progress((update.done, update.total), desc=update.message)
                yield page_values(update)
    except ValueError as error:
        raise gr.Error(str(error), print_exception=False) from None


def _wire_page(ctx: TabContext, form: SweepForm, run_btn: Any, stop_btn: Any, outputs: list[Any]) -> None:
    """The page's run (private: scripts use /sweep): progress in the status line, the charts, table
    and files drawn by the event after it (see `streams`)."""
    streams = StatusThenDraw(len(outputs))

    def run(values: dict, request: gr.Request, progress: gr.Progress):
        yield from streams.status_lines(ctx.follow(request, page_sweep(ctx, values, progress)), session_id(request))

    event = run_btn.click(
        forms.endpoint(run, FORM, (*FORM_AFTER, REPLAY), params=SHARED_PARAMS, name="sweep_page", generator=True,
                       progress=True, helps={**FORM_HELP, REPLAY: REPLAY_INFO}),
        inputs=[*form.inputs(), form.replay], outputs=[outputs[0]], api_visibility="private", concurrency_id=ctx.queue_id,
        show_progress_on=[outputs[0]],  # the status line alone, as on the Benchmark tab
    )
    wire_status_then_draw(streams, event, outputs)
    wire_stop(stop_btn, outputs[0], event)


def _wire_api(ctx: TabContext, form: SweepForm, initial: Mapping[str, Any]) -> None:
    """The scripted /sweep: its outputs are components never shown on the page."""
    with gr.Column(visible=False):
        api_methods = gr.CheckboxGroup([value for _, value in form.methods.choices], value=initial["methods"],
                                       label="methods")
        api_categories = gr.CheckboxGroup(shown_choices(SUITE_CATEGORIES), value=initial["categories"], label="categories")
        api_outputs = [gr.Dataframe(label="summary"), gr.File(label="csv"), gr.Textbox(label="verdict")]
        api_btn = gr.Button("sweep")

    def sweep_api(values: dict, request: gr.Request):
        """Run a sweep to the end; returns the summary table, the rows CSV and the verdict."""
        try:
            req = make_sweep_request(values, ctx.presets, ctx.limits, runtimes=ctx.runtimes, auto_runtime=ctx.auto_runtime)
            last = sweep_outcome(req, ctx.load, ctx.export, ctx.gpu, threads=sweep_threads(ctx, req.runtime))
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        summary = last.result.summary
        return summary.astype(object).where(summary.notna(), None), last.files.rows_csv, last.verdict

    api_sweep = forms.endpoint(sweep_api, FORM, FORM_AFTER, params=SHARED_PARAMS, name="sweep", helps=FORM_HELP)
    api_inputs = form.inputs(api_methods, api_categories)
    forms.describe_inputs(api_sweep, api_inputs)
    api_btn.click(api_sweep, inputs=api_inputs, outputs=api_outputs, api_name="sweep",
                  concurrency_id=ctx.queue_id)
