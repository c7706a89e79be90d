"""The page's Benchmark tab: the `specdemo bench` suite run from the browser.

Same prompts, same interleaved runs and the same summary as the command line; the tab
adds a progress bar, the summary table, the report's charts and the CSV/HTML downloads.
`check_size` and `measure` are the handlers; `build_tab` lays the tab out and wires them.
"""

from __future__ import annotations

import html
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import gradio as gr
import pandas as pd

from .. import bench
from ..bench.measure.batch_charts import batch_figures
from ..bench.measure.batching import batch_verdict, parse_batch_sizes
from ..bench.measure.runners import HF_METHODS, ONNX_GENERATE
from ..engine.params import PARAMS
from ..models.loading import Preset
from ..engine.runtimes import TORCH
from . import forms, handlers
from .forms import param_control
from .limits import Limits
from .page import TabContext, session_id, shown_choices, wire_stop
from .playgroundtab import runtime_control
from .streams import StatusThenDraw, wire_status_then_draw
from .suite_runtime import (chosen_runtime, offer_runtime, pair_runtimes, refuse_unavailable, suite_threads,
                            unavailable_methods)

# The columns a reader compares first; the CSV download keeps all of them.
TABLE_COLUMNS = [
    "category", "label", "runs", "tokens_per_s_mean", "tokens_per_s_std", "speedup_vs_ar", "speedup_vs_hf",
    "acceptance_rate", "mean_accepted_tokens", "copied_share", "target_forwards_per_token", "mean_gamma",
    "exact_match_pct", "perplexity", "predicted_speedup", "errors",
]
CHARTS = ("speedup_vs_ar", "speedup_vs_hf", "acceptance_by_category", "predicted_vs_measured",
          "entropy_acceptance", "position_acceptance", "break_even")  # in rows of two
BATCH_CHARTS = ("batch_ratio", "batch_throughput")
PLACEHOLDER = "*Run the benchmark to fill these charts and the table.*"
RUNTIME_INFO = ("onnx: the target on ONNX Runtime (the CPU), exported on first use (about 30 s); the runtime's own "
                "decoders and AR on torch's copy of the target join the methods")
# A public deployment shares one machine among visitors: keep a benchmark to minutes.
PUBLIC_MAX_PROMPTS = 2
PUBLIC_MAX_REPEATS = 1
PUBLIC_MAX_BATCH = 4
BATCH_HELP = ("Batch sizes, e.g. 1,2,4: the prompts cut into batches of each size, every batch run by every method "
              "in turn through one target forward a round; the charts set each method's throughput against AR's")


class Stopped(Exception):
    """Raised inside a benchmark run whose page request was stopped or closed."""


# Shown when the suite has references (BLEU and chrF from sacrebleu, ROUGE-L from rouge-score).
REFERENCE_COLUMNS = ["bleu", "chrf", "rougeL"]


def table(summary: pd.DataFrame) -> pd.DataFrame:
    columns = TABLE_COLUMNS + [c for c in REFERENCE_COLUMNS if c in summary.columns and summary[c].notna().any()]
    if timed_another_runtime(summary):  # which target each row timed: the runtime's, or torch's copy of it
        columns.insert(columns.index("label") + 1, "runtime")
    shown = summary[[c for c in columns if c in summary.columns]].copy()
    numeric = shown.select_dtypes("number").columns
    shown[numeric] = shown[numeric].round(3)
    return shown.rename(columns={"label": "method"})


def timed_another_runtime(summary: pd.DataFrame) -> bool:
    """Whether a row of the run timed a target on another runtime than torch."""
    if "runtime" not in summary.columns:
        return False
    runtimes = summary["runtime"].dropna().astype(str)
    return bool((runtimes.ne("") & runtimes.ne(TORCH)).any())


def check_size(limits: Limits, prompts_per_category: Any, repeats: Any, max_new_tokens: Any) -> tuple[int, int, int]:
    """The run's size as integers, within what this deployment allows; ValueError names the field."""
    sizes = {}
    for name, value in (("prompts per category", prompts_per_category), ("repeats", repeats),
                        ("max new tokens", max_new_tokens)):
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be a whole number, got {value!r}") from None
        if number != value:  # 2.0 == 2, but 1.5 and "3" are not whole numbers
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        if number < 1:
            raise ValueError(f"{name} must be at least 1, got {number}")
        sizes[name] = number
    prompts, repeats_, tokens = sizes.values()
    if limits.public:
        if prompts > PUBLIC_MAX_PROMPTS:
            raise ValueError(f"prompts per category must be at most {PUBLIC_MAX_PROMPTS} on this public demo")
        if repeats_ > PUBLIC_MAX_REPEATS:
            raise ValueError(f"repeats must be at most {PUBLIC_MAX_REPEATS} on this public demo")
    limits.check_new_tokens(tokens)
    return prompts, repeats_, tokens


def measure(pair, **kwargs) -> Iterator[tuple[int, int, str] | bench.BenchResult]:
    """Progress triples (done, total, message) while the suite runs, then the `BenchResult`.

    The suite runs in a worker thread so that closing this generator (Stop, a closed tab)
    ends it after the current run; closing returns only once the worker has really stopped,
    so the caller keeps the device queue, and the pair, until nothing decodes on it any more.
    """
    updates: queue.Queue = queue.Queue()
    stop = threading.Event()

    def report(done: int, total: int, message: str) -> None:
        if stop.is_set():
            raise Stopped()
        updates.put((done, total, message))

    def work() -> None:
        try:
            updates.put(bench.run_benchmark(pair, progress=report, **kwargs))
        except BaseException as error:  # handed to the page's thread, which reports it
            updates.put(error)

    worker = threading.Thread(target=work, name="specdemo-bench", daemon=True)
    worker.start()
    try:
        while True:
            item = updates.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, bench.BenchResult):
                return
    finally:
        stop.set()
        worker.join()


INTRO = (
    "Runs the project's prompt suite (chat, translation, summarisation, RAG, maths, code) through each "
    "method, interleaving methods so machine drift hits all alike, and compares our decoders with "
    "transformers' `generate`, assisted generation and prompt lookup (with the target on the onnx runtime, with "
    "the runtime's own search and n-gram decoding instead). Speedups are geometric means over prompts. The same "
    "run from a terminal: `python -m specdemo bench --pair embedded` (`--runtime onnx`)."
)


def build_tab(ctx: TabContext) -> None:
    """Lay the tab out inside the current Blocks and wire its events: the page's run (progress in the
    status line, the results drawn by the event after it, see `streams`) and /benchmark, which
    streams the same run as one event with every output."""
    gr.Markdown(INTRO)
    inputs = _inputs(ctx)
    with gr.Row():
        run_btn = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="bench-stop")
    outputs = _outputs()
    streams = StatusThenDraw(len(outputs))

    def updates(args: tuple, request: gr.Request | None, progress: Callable) -> Iterator[str | tuple]:
        return ctx.follow(request, benchmark(ctx, BenchForm.from_inputs(*args), progress))

    # The parameter names are the /benchmark endpoint's, as gradio_client shows them.
    # runtime, then batch_sizes last, so that the parameters before them keep their places.
    def run(preset, category, prompts_per_category, repeats, max_new_tokens, methods, temperature, gamma,
            ngram_n, seed, suite_file=None, group_mt_bench=False, runtime=None, batch_sizes="1",
            request: gr.Request = None, progress=gr.Progress()):
        args = (preset, category, prompts_per_category, repeats, max_new_tokens, methods, temperature, gamma,
                ngram_n, seed, suite_file, group_mt_bench, runtime, batch_sizes)
        yield from streams.every_output(updates(args, request, progress))

    run.__doc__ = forms.api_docstring(API_SUMMARY, API_PARAMETERS, API_HELP)

    def run_on_page(values: dict, request: gr.Request, progress=gr.Progress()):
        args = tuple(values[component] for component in inputs)
        yield from streams.status_lines(updates(args, request, progress), session_id(request))

    # The progress bar rides on the status line alone: each output tracked as pending would run an
    # animation timer and an overlay in the browser, on the cores the suite is timed on.
    event = run_btn.click(run_on_page, inputs=set(inputs), outputs=[outputs[0]], api_visibility="private",
                          concurrency_id=ctx.queue_id, show_progress_on=[outputs[0]])
    wire_status_then_draw(streams, event, outputs)
    wire_stop(stop_btn, outputs[0], event)
    with gr.Column(visible=False):
        api_btn = gr.Button("benchmark")
    api_btn.click(run, inputs=inputs, outputs=outputs, api_name="benchmark", concurrency_id=ctx.queue_id,
                  show_progress="hidden")
    forms.describe_inputs(run, inputs)


API_SUMMARY = ("Run the prompt suite through each method, as the Run benchmark button does: streams the status "
               "line, then every output at the end: the summary table, one Plotly figure a chart, the runs, summary, "
               "report and drafted-token files, and the batch sizes' verdict and charts.")
API_PARAMETERS = ("preset", "category", "prompts_per_category", "repeats", "max_new_tokens", "methods", "temperature",
                  "gamma", "ngram_n", "seed", "suite_file", "group_mt_bench", "runtime", "batch_sizes")
API_HELP = {
    "preset": "the model pair (target + draft) by its preset's name",
    "category": "the suite's category to run (all: every category; an uploaded suite may bring its own)",
    "prompts_per_category": "how many of each category's prompts to run",
    "repeats": "how many times each method runs each prompt (the runs are interleaved across methods)",
    "methods": "the methods to time, by their names: our decoders and the peers (hf-generate, hf-assisted, "
               "prompt lookup, the runtime's own); ar is the reference of speedup_vs_ar",
    "gamma": "draft length γ for SD and NASD, and the candidates of HF assisted generation and prompt lookup",
    "ngram_n": "n of NASD's n-gram table and of prompt lookup's match",
    "seed": "random seed of the first run (sampling); the same seed gives the same runs",
    "suite_file": "your own suite instead of the built-in one: JSONL, one {\"prompt\", \"category\"} a line "
                  "(optional \"reference\"), or a Spec-Bench / MT-bench question.jsonl (None: the built-in suite)",
    "group_mt_bench": "read MT-bench's eight categories as one multi_turn category, as Spec-Bench does",
    "runtime": "what runs the target's forwards: torch, or onnx where the page offers it (then the runtime's "
               "own decoders and AR on torch's copy of the target join the methods)",
    "batch_sizes": "comma-separated batch sizes, e.g. 1,2,4: the suite run at each batch size, one target forward "
                   "a round for the whole batch",
}


def _inputs(ctx: TabContext) -> list[Any]:
    """The tab's inputs, in `BenchForm`'s order."""
    with gr.Row():
        preset = gr.Dropdown(label="Model pair", value=ctx.default_preset, interactive=True,
                             choices=list(ctx.presets), elem_id="bench-preset")
        runtime = runtime_control(ctx, "bench-runtime", RUNTIME_INFO, pair_runtimes(ctx, ctx.default_preset))
        # Custom values: an uploaded suite brings its own categories.
        category = gr.Dropdown(label="Category", value=bench.ALL, choices=shown_choices([bench.ALL, *bench.SUITE_CATEGORIES]),
                               elem_id="bench-category", allow_custom_value=True)
        prompts = gr.Number(value=1, precision=0, label="Prompts per category")
        repeats = gr.Number(value=1, precision=0, label="Repeats", elem_id="bench-repeats")
        max_new_tokens = gr.Number(value=min(64, ctx.limits.max_new_tokens), precision=0, label="Max new tokens")
    value, note = method_choices(ctx.presets[ctx.default_preset], runtime=runtime.value,
                                 runtimes=pair_runtimes(ctx, ctx.default_preset))
    with gr.Row():
        methods = gr.CheckboxGroup(label="Methods", value=value, elem_id="bench-methods",
                                   choices=[(label, name) for name, label in bench.bench_methods().items()])
    methods_note = gr.HTML(note, elem_id="bench-methods-note")
    _wire_pair_and_runtime(ctx, preset, runtime, methods, methods_note)
    with gr.Row():
        # The schema's controls (ranges, help); labels name the transformers peers that also read them.
        temperature = param_control(PARAMS["temperature"], PARAMS["temperature"].default)
        gamma = param_control(PARAMS["gamma"], PARAMS["gamma"].default,
                              label="γ (SD, NASD, HF assisted, prompt lookup)")
        ngram_n = param_control(PARAMS["ngram_n"], PARAMS["ngram_n"].default, label="n (NASD, prompt lookup)")
        seed = param_control(PARAMS["seed"], 0, label="Seed")
    with gr.Row():
        suite_file = gr.File(label="Your suite (optional): JSONL, one {\"prompt\", \"category\"} a line (optional "
                                   "\"reference\"), or a Spec-Bench / MT-bench question.jsonl",
                             file_types=[".jsonl", ".json", ".txt"], type="filepath", elem_id="bench-suite")
        group_mt_bench = gr.Checkbox(False, label="Group MT-bench's eight categories as multi_turn (Spec-Bench)",
                                     elem_id="bench-mt-bench")
        batch_sizes = gr.Textbox("1", label="Batch sizes", info=BATCH_HELP, elem_id="bench-batch")
    return [preset, category, prompts, repeats, max_new_tokens, methods, temperature, gamma, ngram_n, seed,
            suite_file, group_mt_bench, runtime, batch_sizes]


def _wire_pair_and_runtime(ctx: TabContext, preset: gr.Dropdown, runtime: gr.Dropdown, methods: gr.CheckboxGroup,
                           methods_note: gr.HTML) -> None:
    """Another pair offers its runtimes and its methods; another runtime, the methods it runs."""
    offer = offer_methods(ctx)
    preset.change(offer, inputs=[preset, methods, runtime], outputs=[methods, methods_note], queue=False,
                  api_visibility="private")
    offer_runtime(ctx, preset, runtime)
    runtime.change(offer, inputs=[preset, methods, runtime], outputs=[methods, methods_note], queue=False,
                   api_visibility="private")


def default_methods(runtime: str = TORCH) -> tuple[str, ...]:
    """The methods checked at first: the benchmark's defaults; on another runtime its own search in place of
    transformers' peers, which stay offered there and run on the torch copy beside that copy's AR."""
    if runtime == TORCH:
        return bench.DEFAULT_BENCH_METHODS
    return (*(n for n in bench.DEFAULT_BENCH_METHODS if n not in HF_METHODS), ONNX_GENERATE)


def method_choices(preset: Preset, checked: list[str] | None = None, runtime: str = TORCH,
                   runtimes: Sequence[str] = (TORCH,)) -> tuple[list[str], str]:
    """The Methods box for a pair with its target on `runtime`: which methods are checked (`checked`, by
    default `default_methods`, less those the pair cannot run there) and the note that greys those out,
    with the reason.

    Every method stays a choice, so the /benchmark endpoint accepts any pair's methods; the
    server refuses one the pair cannot run with its reason (`refuse_unavailable`)."""
    missing = unavailable_methods(preset.draft_kind, runtime, runtimes, torch_copy=True)
    wanted = checked if checked is not None else default_methods(runtime)
    return [n for n in wanted if n not in missing], methods_note(missing)


def methods_note(missing: dict[str, str]) -> str:
    """HTML: a rule that greys out and locks the methods this pair cannot run, and one line why."""
    if not missing:
        return ""
    selector = ", ".join(f'#bench-methods label:has(input[name="{name}"])' for name in missing)
    style = f"<style>{selector}{{opacity:.45;pointer-events:none;text-decoration:line-through;}}</style>"
    by_reason: dict[str, list[str]] = {}
    for name, reason in missing.items():
        by_reason.setdefault(reason, []).append(bench.bench_methods()[name])
    lines = " ".join(f"{html.escape(', '.join(labels))}: {html.escape(reason)}." for reason, labels in by_reason.items())
    return f'{style}<span class="bench-methods-note">Not for this pair — {lines}</span>'


def offer_methods(ctx: TabContext):
    """The Methods box's event for another pair or runtime: (checked, note) by `method_choices`."""
    def offer(preset_name: str, checked: list[str] | None, runtime: str | None):
        if preset_name not in ctx.presets:
            return gr.skip(), gr.skip()
        runtimes = pair_runtimes(ctx, preset_name)
        # A pair whose target the runtime cannot take goes back to torch (`runtime_offered`), and so do its methods.
        value, note = method_choices(ctx.presets[preset_name], list(checked or []),
                                     runtime if runtime in runtimes else TORCH, runtimes)
        return value, note
    return offer


def _outputs() -> list[Any]:
    """status, the summary table, the charts (`CHARTS` order), the four downloads, the placeholder and
    the results column it stands in for until a run finishes, then the batch sizes' verdict and charts
    (`BATCH_CHARTS` order)."""
    status = gr.Markdown("", label="status_line", elem_id="bench-status")
    placeholder = gr.Markdown(PLACEHOLDER, label="placeholder", elem_id="bench-placeholder")
    with gr.Column(visible=False, elem_id="bench-results") as results:
        summary_table = gr.Dataframe(interactive=False, label="summary", show_label=False, elem_id="bench-table",
                                     wrap=True)
        plots = []
        for i in range(0, len(CHARTS), 2):
            with gr.Row(equal_height=True):
                plots += [gr.Plot(label=f"{name}_chart", show_label=False, elem_id=f"bench-chart-{name}")
                          for name in CHARTS[i : i + 2]]
        batch_verdict = gr.Markdown("", label="batch_verdict", elem_id="bench-batch-verdict")
        with gr.Row(equal_height=True):
            batch_plots = [gr.Plot(label=f"{name}_chart", show_label=False, elem_id=f"bench-chart-{name}")
                           for name in BATCH_CHARTS]
    with gr.Row():
        files = [gr.DownloadButton("Runs (CSV)", interactive=False, elem_id="bench-rows-csv"),
                 gr.DownloadButton("Summary (CSV)", interactive=False, elem_id="bench-summary-csv"),
                 gr.DownloadButton("Report (HTML)", interactive=False, elem_id="bench-report"),
                 gr.DownloadButton("Drafted tokens (CSV)", interactive=False, elem_id="bench-tokens-csv")]
    return [status, summary_table, *plots, *files, placeholder, results, batch_verdict, *batch_plots]


@dataclass(frozen=True)
class BenchForm:
    """What the tab's inputs hold, as the page sent it."""
    preset: str
    category: str
    prompts_per_category: Any
    repeats: Any
    max_new_tokens: Any
    methods: list[str]
    temperature: float
    gamma: int
    ngram_n: int
    seed: int
    suite: str | None = None  # an uploaded suite file; None: the built-in suite
    group_mt_bench: bool = False  # MT-bench's categories read as one multi_turn category
    runtime: str | None = None  # what runs the target's forwards; None: the page's default for the pair
    batch: str = "1"  # batch sizes, comma-separated

    @classmethod
    def from_inputs(cls, preset, category, prompts_per_category, repeats, max_new_tokens, methods, temperature,
                    gamma, ngram_n, seed, suite=None, group_mt_bench=False, runtime=None,
                    batch="1") -> "BenchForm":
        """The form from the tab's inputs in their order (an empty upload is the built-in suite)."""
        return cls(preset, category, prompts_per_category, repeats, max_new_tokens, methods or [], temperature,
                   gamma, ngram_n, seed, suite or None, bool(group_mt_bench), runtime or None, str(batch or "1"))


def benchmark(ctx: TabContext, form: BenchForm, progress: Callable) -> Iterator[str | tuple]:
    """The status line while the suite runs, then every output's value (`_outputs`' order)."""
    try:
        ctx.limits.check_models(form.preset, known=ctx.presets)
        size, times, new_tokens = check_size(ctx.limits, form.prompts_per_category, form.repeats,
                                             form.max_new_tokens)
        names = bench.parse_bench_methods(form.methods)
        sizes = check_batch_sizes(ctx.limits, form.batch)
        suite = read_suite(form)
        chosen = ctx.presets[form.preset]
        runtime = chosen_runtime(ctx, form.preset, form.runtime)
        refuse_unavailable(names, unavailable_methods(chosen.draft_kind, runtime, pair_runtimes(ctx, form.preset),
                                                       torch_copy=True))
        yield f"Loading the model pair{handlers.runtime_loading_note(runtime)} …"
        pair = ctx.load(chosen.target, chosen.draft, runtime=runtime)
        result = None
        for item in ctx.gpu(measure)(
            pair, suite=suite, methods=bench.parse_bench_methods(names, pair), repeats=times, limit=size,
            categories=None if form.category == bench.ALL else form.category, max_new_tokens=new_tokens,
            temperature=form.temperature, gamma=form.gamma, ngram_n=form.ngram_n, seed=form.seed,
            chat=bool(getattr(pair.tokenizer, "chat_template", None)), threads=suite_threads(ctx, runtime), batch=sizes,
        ):
            if isinstance(item, bench.BenchResult):
                result = item
                break
            done, total, message = item
            progress((done, total), desc=message)
            yield f"Running: {done}/{total} — {message}"
    except ValueError as error:
        raise gr.Error(str(error), print_exception=False) from None
    yield finished(result, ctx.export(), runtime)


def check_batch_sizes(limits: Limits, text: str) -> list[int]:
    """The batch sizes asked for, within what this deployment allows; ValueError says why."""
    sizes = parse_batch_sizes(text)
    if limits.public and max(sizes) > PUBLIC_MAX_BATCH:
        raise ValueError(f"batch sizes must be at most {PUBLIC_MAX_BATCH} on this public demo")
    return sizes


def batch_outputs(result: bench.BenchResult) -> tuple:
    """The batch sizes' verdict (with the peers that ran at batch 1 only) and charts, for `finished`."""
    sizes = result.meta.get("batch_sizes", [1])
    if sizes == [1]:
        text = ("Batch size 1 only: give several, e.g. 1,2,4, in **Batch sizes** to see up to which batch size "
                "drafting still pays.")
    else:
        text = batch_verdict(result.batches) + "".join(
            f"\n\n{bench.bench_methods().get(m, m)}: {reason}." for m, reason in result.meta.get("batch_one_only", {}).items())
    figures = batch_figures(result.batches)
    return (text, *(figures[name] for name in BATCH_CHARTS))


def read_suite(form: BenchForm) -> list[bench.SuitePrompt] | None:
    """The uploaded suite, its categories grouped if asked (None: the built-in suite); the
    category asked for must be one of the suite's."""
    if form.suite is None:
        if form.group_mt_bench:
            raise ValueError("grouping MT-bench's categories needs an uploaded question.jsonl")
        return None
    suite = bench.load_suite(form.suite, category_map=bench.MT_BENCH if form.group_mt_bench else None)
    present = list(dict.fromkeys(p.category for p in suite))
    if form.category != bench.ALL and form.category not in present:
        raise ValueError(f"the uploaded suite has no category {form.category!r}; it has {', '.join(present)} "
                         f"(or choose {bench.ALL})")
    return suite


def finished(result: bench.BenchResult, folder: Path, runtime: str = TORCH) -> tuple:
    """The tab's outputs for a finished run (its target on `runtime`), its files written to folder."""
    paths = (folder / "bench-runs.csv", folder / "bench-summary.csv", folder / "bench-report.html",
             folder / "bench-runs.tokens.csv")  # the last written beside the runs
    figures = bench.make_figures(result)
    bench.write_outputs(result, csv=paths[0], summary_csv=paths[1], report=paths[2], figures=figures)
    runs = int(result.rows.shape[0])
    failed = int((result.rows["error"].astype(str) != "").sum())
    on = "" if runtime == TORCH else f", the target on {result.meta.get('target_dtype') or runtime}"
    message = (f"Done: {runs} runs on {result.meta.get('prompts')} prompts, {result.meta.get('device')} "
               f"({result.meta.get('device_name')}){on}." + (f" ⚠️ {failed} runs failed (see the CSV)." if failed else ""))
    return (message, table(result.summary), *(figures[name] for name in CHARTS),
            *(gr.update(value=str(path), interactive=True) for path in paths),
            gr.update(visible=False), gr.update(visible=True), *batch_outputs(result))
