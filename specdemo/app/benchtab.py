"""The page's Benchmark tab: the `specdemo bench` suite run from the browser.

Same prompts, same interleaved runs and the same summary as the command line; the tab
adds a progress bar, the summary table, the report's charts and the CSV/HTML downloads.
`check_size` and `measure` are the handlers; `build_tab` lays the tab out and wires them.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import gradio as gr
import pandas as pd

from .. import bench
from ..engine.params import PARAMS
from .forms import param_control
from .limits import Limits
from .page import TabContext, wire_stop

# The columns a reader compares first; the CSV download keeps all of them.
TABLE_COLUMNS = [
    "category", "label", "runs", "tokens_per_s_mean", "tokens_per_s_std", "speedup_vs_ar", "speedup_vs_hf",
    "acceptance_rate", "mean_accepted_tokens", "copied_share", "target_forwards_per_token", "mean_gamma",
    "exact_match_pct", "perplexity", "predicted_speedup", "errors",
]
CHARTS = ("speedup_vs_ar", "speedup_vs_hf", "acceptance_by_category", "predicted_vs_measured")
# A public deployment shares one machine among visitors: keep a benchmark to minutes.
PUBLIC_MAX_PROMPTS = 2
PUBLIC_MAX_REPEATS = 1


class Stopped(Exception):
    """Raised inside a benchmark run whose page request was stopped or closed."""


def table(summary: pd.DataFrame) -> pd.DataFrame:
    shown = summary[[c for c in TABLE_COLUMNS if c in summary.columns]].copy()
    numeric = shown.select_dtypes("number").columns
    shown[numeric] = shown[numeric].round(3)
    return shown.rename(columns={"label": "method"})


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
    "transformers' `generate`, assisted generation and prompt lookup. Speedups are geometric means over "
    "prompts. The same run from a terminal: `python -m specdemo bench --pair embedded`."
)


def build_tab(ctx: TabContext) -> None:
    """Lay the tab out inside the current Blocks and wire its /benchmark event."""
    gr.Markdown(INTRO)
    inputs = _inputs(ctx)
    with gr.Row():
        run_btn = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="bench-stop")
    outputs = _outputs()

    # The parameter names are the /benchmark endpoint's, as gradio_client shows them.
    def run(preset_name, category_name, prompts_per_category, repeats_, tokens, chosen, temperature_, gamma_,
            ngram_n_, seed_, request: gr.Request, progress=gr.Progress()):
        form = BenchForm(preset_name, category_name, prompts_per_category, repeats_, tokens, chosen or [],
                         temperature_, gamma_, ngram_n_, seed_)
        yield from ctx.follow(request, benchmark(ctx, form, progress, len(outputs)))

    event = run_btn.click(run, inputs=inputs, outputs=outputs, api_name="benchmark", concurrency_id=ctx.queue_id)
    wire_stop(stop_btn, outputs[0], event)


def _inputs(ctx: TabContext) -> list[Any]:
    """The tab's inputs, in `BenchForm`'s order."""
    with gr.Row():
        preset = gr.Dropdown(label="Model pair", value=ctx.default_preset, interactive=True,
                             choices=list(ctx.presets), elem_id="bench-preset")
        category = gr.Dropdown(label="Category", value=bench.ALL, choices=[bench.ALL, *bench.SUITE_CATEGORIES],
                               elem_id="bench-category")
        prompts = gr.Number(value=1, precision=0, label="Prompts per category")
        repeats = gr.Number(value=1, precision=0, label="Repeats")
        max_new_tokens = gr.Number(value=min(64, ctx.limits.max_new_tokens), precision=0, label="Max new tokens")
    with gr.Row():
        methods = gr.CheckboxGroup(label="Methods", value=list(bench.DEFAULT_BENCH_METHODS),
                                   choices=[(label, name) for name, label in bench.bench_methods().items()])
    with gr.Row():
        # The schema's controls (ranges, help); labels name the transformers peers that also read them.
        temperature = param_control(PARAMS["temperature"], PARAMS["temperature"].default)
        gamma = param_control(PARAMS["gamma"], PARAMS["gamma"].default,
                              label="γ (SD, NASD, HF assisted, prompt lookup)")
        ngram_n = param_control(PARAMS["ngram_n"], PARAMS["ngram_n"].default, label="n (NASD, prompt lookup)")
        seed = param_control(PARAMS["seed"], 0, label="Seed")
    return [preset, category, prompts, repeats, max_new_tokens, methods, temperature, gamma, ngram_n, seed]


def _outputs() -> list[Any]:
    """status, the summary table, the charts (`CHARTS` order), then the three downloads."""
    status = gr.Markdown("", elem_id="bench-status")
    summary_table = gr.Dataframe(interactive=False, show_label=False, elem_id="bench-table", wrap=True)
    with gr.Row(equal_height=True):
        plots = [gr.Plot(show_label=False) for _ in CHARTS[:2]]
    with gr.Row(equal_height=True):
        plots += [gr.Plot(show_label=False) for _ in CHARTS[2:]]
    with gr.Row():
        files = [gr.DownloadButton("Runs (CSV)", interactive=False, elem_id="bench-rows-csv"),
                 gr.DownloadButton("Summary (CSV)", interactive=False, elem_id="bench-summary-csv"),
                 gr.DownloadButton("Report (HTML)", interactive=False, elem_id="bench-report")]
    return [status, summary_table, *plots, *files]


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


def benchmark(ctx: TabContext, form: BenchForm, progress: Callable, n_outputs: int) -> Iterator[tuple]:
    """The tab's outputs while the suite runs (status only), then all of them."""
    unchanged = [gr.skip()] * (n_outputs - 1)
    try:
        ctx.limits.check_models(form.preset, known=ctx.presets)
        size, times, new_tokens = check_size(ctx.limits, form.prompts_per_category, form.repeats,
                                             form.max_new_tokens)
        names = bench.parse_bench_methods(form.methods)
        chosen = ctx.presets[form.preset]
        yield ("Loading the model pair …", *unchanged)
        pair = ctx.load(chosen.target, chosen.draft)
        result = None
        for item in ctx.gpu(measure)(
            pair, methods=bench.parse_bench_methods(names, pair), repeats=times, limit=size,
            categories=None if form.category == bench.ALL else form.category, max_new_tokens=new_tokens,
            temperature=form.temperature, gamma=form.gamma, ngram_n=form.ngram_n, seed=form.seed,
            chat=bool(getattr(pair.tokenizer, "chat_template", None)),
        ):
            if isinstance(item, bench.BenchResult):
                result = item
                break
            done, total, message = item
            progress((done, total), desc=message)
            yield (f"Running: {done}/{total} — {message}", *unchanged)
    except ValueError as error:
        raise gr.Error(str(error), print_exception=False) from None
    yield finished(result, ctx.export())


def finished(result: bench.BenchResult, folder: Path) -> tuple:
    """The tab's outputs for a finished run, its files written to folder."""
    paths = folder / "bench-runs.csv", folder / "bench-summary.csv", folder / "bench-report.html"
    figures = bench.make_figures(result)
    bench.write_outputs(result, csv=paths[0], summary_csv=paths[1], report=paths[2], figures=figures)
    runs = int(result.rows.shape[0])
    failed = int((result.rows["error"].astype(str) != "").sum())
    message = (f"Done: {runs} runs on {result.meta.get('prompts')} prompts, {result.meta.get('device')} "
               f"({result.meta.get('device_name')})." + (f" ⚠️ {failed} runs failed (see the CSV)." if failed else ""))
    return (message, table(result.summary), *(figures[name] for name in CHARTS),
            *(gr.update(value=str(path), interactive=True) for path in paths))
