"""The page's Benchmark tab: the `specdemo bench` suite run from the browser.

Same prompts, same interleaved runs and the same summary as the command line; the tab
adds a progress bar, the summary table, the report's charts and the CSV/HTML downloads.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator, Mapping

import gradio as gr
import pandas as pd

from .. import bench
from ..engine.params import PARAMS
from .forms import param_control
from .limits import Limits
from ..models.loading import ModelPair, Preset

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


def build_tab(
    presets: Mapping[str, Preset],
    default_preset: str,
    load: Callable[[str, str | None], ModelPair],
    limits: Limits,
    gpu: Callable[[Callable], Callable],
    export: Callable[[], Any],
    queue_id: str,
    follow: Callable[[gr.Request, Iterator], Iterator] = lambda request, updates: updates,
) -> None:
    """Lay the tab out inside the current Blocks and wire its events.

    load(target, draft) returns a cached pair; gpu decorates the GPU work (ZeroGPU);
    export() gives a fresh folder for this run's files; queue_id is the concurrency group
    the page's other decoding events share; follow(request, updates) relays a run's updates,
    stopping it when the visitor's tab closes and tidying the visitor's session after it.
    """
    gr.Markdown(
        "Runs the project's prompt suite (chat, translation, summarisation, RAG, maths, code) through each "
        "method, interleaving methods so machine drift hits all alike, and compares our decoders with "
        "transformers' `generate`, assisted generation and prompt lookup. Speedups are geometric means over "
        "prompts. The same run from a terminal: `python -m specdemo bench --pair embedded`."
    )
    with gr.Row():
        preset = gr.Dropdown(label="Model pair", value=default_preset, interactive=True,
                             choices=list(presets), elem_id="bench-preset")
        category = gr.Dropdown(label="Category", value=bench.ALL, choices=[bench.ALL, *bench.SUITE_CATEGORIES],
                               elem_id="bench-category")
        prompts = gr.Number(value=1, precision=0, label="Prompts per category")
        repeats = gr.Number(value=1, precision=0, label="Repeats")
        max_new_tokens = gr.Number(value=min(64, limits.max_new_tokens), precision=0,
                                   label="Max new tokens")
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
    with gr.Row():
        run_btn = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
        stop_btn = gr.Button("Stop", variant="stop", elem_id="bench-stop")
    status = gr.Markdown("", elem_id="bench-status")
    summary_table = gr.Dataframe(interactive=False, show_label=False, elem_id="bench-table", wrap=True)
    with gr.Row(equal_height=True):
        plots = [gr.Plot(show_label=False) for _ in CHARTS[:2]]
    with gr.Row(equal_height=True):
        plots += [gr.Plot(show_label=False) for _ in CHARTS[2:]]
    with gr.Row():
        rows_file = gr.DownloadButton("Runs (CSV)", interactive=False, elem_id="bench-rows-csv")
        summary_file = gr.DownloadButton("Summary (CSV)", interactive=False, elem_id="bench-summary-csv")
        report_file = gr.DownloadButton("Report (HTML)", interactive=False, elem_id="bench-report")

    def run(preset_name, category_name, prompts_per_category, repeats_, tokens, chosen, temperature_, gamma_,
            ngram_n_, seed_, request: gr.Request, progress=gr.Progress()):
        yield from follow(request, benchmark(preset_name, category_name, prompts_per_category, repeats_, tokens,
                                             chosen, temperature_, gamma_, ngram_n_, seed_, progress))

    def benchmark(preset_name, category_name, prompts_per_category, repeats_, tokens, chosen, temperature_, gamma_,
                  ngram_n_, seed_, progress):
        unchanged = [gr.skip()] * (len(outputs) - 1)
        try:
            limits.check_models(preset_name, known=presets)
            size, times, new_tokens = check_size(limits, prompts_per_category, repeats_, tokens)
            names = bench.parse_bench_methods(chosen or [])
            chosen_preset = presets[preset_name]
            yield ("Loading the model pair …", *unchanged)
            pair = load(chosen_preset.target, chosen_preset.draft)
            names = bench.parse_bench_methods(names, pair)
            result = None
            for item in gpu(measure)(
                pair, methods=names, repeats=times, categories=None if category_name == bench.ALL else category_name,
                limit=size, max_new_tokens=new_tokens, temperature=temperature_, gamma=gamma_, ngram_n=ngram_n_,
                seed=seed_, chat=bool(getattr(pair.tokenizer, "chat_template", None)),
            ):
                if isinstance(item, bench.BenchResult):
                    result = item
                    break
                done, total, message = item
                progress((done, total), desc=message)
                yield (f"Running: {done}/{total} — {message}", *unchanged)
        except ValueError as error:
            raise gr.Error(str(error), print_exception=False) from None
        folder = export()
        rows_path, summary_path, report_path = (folder / "bench-runs.csv", folder / "bench-summary.csv",
                                                folder / "bench-report.html")
        bench.write_outputs(result, csv=rows_path, summary_csv=summary_path, report=report_path)
        runs = int(result.rows.shape[0])
        failed = int((result.rows["error"].astype(str) != "").sum())
        message = (f"Done: {runs} runs on {result.meta.get('prompts')} prompts, {result.meta.get('device')} "
                   f"({result.meta.get('device_name')})." + (f" ⚠️ {failed} runs failed (see the CSV)." if failed else ""))
        yield (
            message,
            table(result.summary),
            *(result.figures[name] for name in CHARTS),
            gr.update(value=str(rows_path), interactive=True),
            gr.update(value=str(summary_path), interactive=True),
            gr.update(value=str(report_path), interactive=True),
        )

    outputs = [status, summary_table, *plots, rows_file, summary_file, report_file]
    event = run_btn.click(
        run,
        inputs=[preset, category, prompts, repeats, max_new_tokens, methods, temperature, gamma, ngram_n, seed],
        outputs=outputs,
        api_name="benchmark",
        concurrency_id=queue_id,
    )
    stop_btn.click(lambda: "⏹ Stopped.", outputs=[status], cancels=[event], queue=False, api_visibility="private")
