"""The page's handlers as plain functions: a request in, plain data out.

Nothing here knows a Gradio component. `stream_run` yields `RunUpdate`s (panel HTML by
slot, figures, the comparison table, file paths) and `compare` returns a `CompareOutcome`;
`playgroundtab` only maps those onto its components. So the streaming logic is tested by
iterating the generator (tests/test_handlers.py), without a server.

What every tab shares (the pair cache, the decoding thread, export folders, the ZeroGPU decorator)
lives in `page`.
May import engine, models, bench and the page's own viz/limits/page; never gradio.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Generator, Iterator, Mapping, Sequence

import pandas as pd
import torch

from . import charts, viz
from ..bench.measure.compare import run_comparison, tabulate
from ..bench.measure.vs_float32 import Float32Reference, reference_for, runs_below_float32
from ..bench.measure.runners import quiet_gc
from ..bench.measure.threads import drafts, threads_sentence
from ..models.torch_copy import TORCH_COPY, TORCH_COPY_AR, iter_generate, needs_torch_copy_ar, torch_copy_ar
from ..engine.methods import REFERENCE, parse_methods
from ..engine.params import PARAMS, DecodeParams, EngineOptions
from ..engine.trace import GenerationResult
from ..models.loading import ModelPair, Preset, draft_kind_of
from ..engine.runtimes import AUTO as AUTO_RUNTIME, ONNX, TORCH, available_methods, runtime_reason
from ..engine.runtimes.onnx_export import resolve_runtime
from ..models.tokens import default_device
from ..models.precision import PRECISIONS, exactness_sentence, is_exact
from .engine_controls import engine_options, first_round_status
from .limits import Limits
from .page import AUTO, ThreadPlan, decoding_thread, export_dir, gpu

log = logging.getLogger(__name__)

# While a method decodes the page gets a one-line status at most this often, and nothing else:
# on a small machine the browser and the server's rendering share the cores the decode runs on,
# so drawing during a run would slow the very speeds the page reports. A method's panel is sent
# once, when it ends; the charts once, when every method has ended.
STATUS_INTERVAL_S = 1.0
PARAM_NAMES = tuple(PARAMS)  # the decoding parameters every decoding endpoint takes, in the schema's order
PRECISION_NAMES = ("target_dtype", "draft_dtype")  # the models' precisions the Playground and its endpoints take
# The fields that name a model in the preset's place, each beside its precision's field.
MODEL_NAMES = TARGET_FIELD, DRAFT_FIELD = tuple(name.removesuffix("_dtype") for name in PRECISION_NAMES)
RUNTIME = "runtime"  # what runs the target's forwards (auto, torch, or onnx where the page offers it)


def write_csvs(summary: pd.DataFrame, rounds: pd.DataFrame, tokens: pd.DataFrame) -> tuple[str, str, str]:
    """The comparison, per-round and per-token CSVs in a fresh export folder."""
    folder = export_dir()
    paths = []
    for name, frame in (("summary", summary), ("rounds", rounds), ("tokens", tokens)):
        path = folder / f"specdemo-{name}.csv"
        frame.to_csv(path, index=False)
        paths.append(str(path))
    return tuple(paths)


# ---------------------------------------------------------------------------------------
# Form values → a request

@dataclass
class Request:
    prompt: str
    target: str
    draft: str | None
    params: DecodeParams  # validated once, here; the loop takes it as it is
    note: str = ""
    methods: list[str] = field(default_factory=list)  # validated names, as given
    engine: EngineOptions = field(default_factory=EngineOptions)  # how tokens are computed, never which
    target_dtype: str = AUTO  # each model's precision, as offered (AUTO: the loader's default for the device)
    draft_dtype: str = AUTO
    runtime: str = AUTO_RUNTIME  # what runs the target's forwards: auto, torch, or onnx where the page offers it


def resolve_models(preset: str | None, target: str | None, draft: str | None,
                   presets: Mapping[str, Preset]) -> tuple[str, str | None]:
    """A custom target (and draft) overrides the preset, which `Limits.check_models` has
    already checked."""
    target = (target or "").strip()
    draft = (draft or "").strip() or None
    if target:
        return target, draft
    chosen = presets[preset]
    return chosen.target, chosen.draft


def offered_methods(draft: str | None) -> list[str]:
    """The methods the page offers for a pair with this draft reference, decided without loading
    it: those the pair could run (the draft alone is hidden for a feature head, which cannot
    write by itself)."""
    kind = draft_kind_of(draft)
    return available_methods(SimpleNamespace(draft=object() if kind else None, draft_kind=kind))


def chosen_precision(name: str, value: Any, offered: Sequence[str]) -> str:
    """A model's precision from the page or the API: AUTO when empty, else one of `offered`
    (ValueError naming the field and the choices)."""
    if value in (None, ""):
        return AUTO
    if not isinstance(value, str) or value.strip() not in (AUTO, *offered):
        raise ValueError(f"{name} must be {AUTO} or one of {', '.join(offered)} on this device, got {value!r}")
    return value.strip()


def chosen_runtime(value: Any, offered: Sequence[str]) -> str:
    """The target's runtime from the page or the API: one of `offered`, the page's default (the first) when empty."""
    if value in (None, ""):
        return offered[0]
    if not isinstance(value, str) or value.strip() not in offered:
        raise ValueError(f"{RUNTIME} must be one of {', '.join(offered)} here, got {value!r}")
    return value.strip()


def make_request(prompt, preset, target, draft, values: Mapping[str, Any], presets: Mapping[str, Preset],
                 limits: Limits | None = None, methods: Any = None, precisions: Sequence[str] = PRECISIONS,
                 runtimes: Sequence[str] = (AUTO_RUNTIME, TORCH)) -> Request:
    """Validate everything that can be checked before loading a model; ValueError otherwise.

    values: the decoding parameters by schema name (missing ones take the schema's default), and
    target_dtype and draft_dtype (AUTO when missing); methods: a comma-separated string or a list
    (None: the default methods); precisions: the ones the page offers besides AUTO; runtimes: the
    target runtimes it offers (`values["runtime"]`, the first when missing).
    """
    if methods is not None and not isinstance(methods, (str, list, tuple)):
        raise ValueError("methods must be a comma-separated string or a list of names")
    names = parse_methods(methods)
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt is empty: type some text to continue")
    decode = DecodeParams.from_values(**{name: values[name] for name in PARAM_NAMES if name in values})
    engine = engine_options(values)
    target_dtype, draft_dtype = (chosen_precision(name, values.get(name), precisions) for name in PRECISION_NAMES)
    runtime = chosen_runtime(values.get(RUNTIME), runtimes)
    limits = limits or Limits()
    limits.check_models(preset, target, draft, known=presets)
    limits.check_new_tokens(decode.max_new_tokens)
    target, draft = resolve_models(preset, target, draft, presets)
    return Request(prompt, target, draft, decode, methods=names, engine=engine, target_dtype=target_dtype,
                   draft_dtype=draft_dtype, runtime=runtime)


def readable_failure(error: BaseException) -> str:
    """What a visitor reads when a run fails inside the library; out-of-memory also hands
    the cached blocks back so the next request starts from a clean device."""
    if isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower():
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return ("out of memory: this run did not fit on the device; try fewer new tokens, a shorter prompt "
                "or a smaller model pair")
    return f"{type(error).__name__}: {error}"


def fit_chat(request: Request, pair: ModelPair) -> None:
    """Chat is on by default; a tokenizer without a chat template, or an encoder-decoder
    model, gets the plain prompt rather than an error, and the status line says so."""
    if request.params.chat and getattr(pair, "is_encoder_decoder", False):
        request.params = request.params.replace(chat=False)
        request.note = " (an encoder-decoder model reads the prompt as it is, without a chat template)"
    elif request.params.chat and not getattr(pair.tokenizer, "chat_template", None):
        request.params = request.params.replace(chat=False)
        request.note = " (this tokenizer has no chat template, so the prompt went in as plain text)"


def fit_engine(request: Request, pair: ModelPair) -> None:
    """Compile is on by default where a GPU serves a decoder-only pair; an encoder-decoder model
    (a typed one, which the page could not know before loading it) runs eagerly rather than fail,
    and the status line says so."""
    if request.engine.compile and getattr(pair, "is_encoder_decoder", False):
        request.engine = EngineOptions(cache=request.engine.cache)
        request.note += " (an encoder-decoder model decodes without compile: graph capture runs decoder-only models)"


def wait_for_warm_up(ready: threading.Event | None, warming: str,
                     interval_s: float = STATUS_INTERVAL_S) -> Iterator[RunUpdate]:
    """A Run pressed while the page warms up (and compiles) its default pair waits for it, saying so,
    instead of decoding beside it: the warm-up would slow the Run's timed rounds, and the pair's cache
    is held until it ends. After the first status, an empty update every interval_s, so that a
    closed tab is noticed."""
    if ready is None or ready.is_set():
        return
    yield RunUpdate(status=warming)
    while not ready.wait(interval_s):
        yield RunUpdate()


# ---------------------------------------------------------------------------------------
# The streaming run


@dataclass
class RunUpdate:
    """One step of a streaming run, as data. Fields left None (or empty) leave their part
    of the page as it is."""

    status: str | None = None
    panels: dict[int, str] = field(default_factory=dict)  # slot (index in request.methods) → panel HTML
    shown: int | None = None  # how many panel slots are visible (set with the last update of a run)
    figures: dict[str, Any] | None = None  # charts.all_charts, by name (sent once, at the end of a run; a chart left out stays)
    charts_shown: bool | None = None  # the chart sections instead of their placeholder
    trees_shown: bool | None = None  # the tree charts' section (tree methods only)
    table: pd.DataFrame | None = None  # viz.display_table of the run's summary (with its last update)
    why: str | None = None  # viz.explain of that summary
    files: tuple[str | None, ...] | None = None  # (summary, rounds, tokens CSV); all None clears
    warning: str | None = None  # a message worth a toast as well as the status line
    results: list[GenerationResult] | None = None  # the finished methods (with the run's last update)

    def only_status(self) -> bool:
        """Whether this update changes the status line alone (a warning may come with it)."""
        return (not self.panels and self.shown is None and self.figures is None and self.charts_shown is None
                and self.trees_shown is None and self.table is None and self.why is None and self.files is None)


def stream_run(request: Request, load: Callable[[Request], ModelPair], limits: Limits | None = None,
               gpu: Callable[[Callable], Callable] = gpu, threads: ThreadPlan | None = None) -> Iterator[RunUpdate]:
    """Load the pair, then decode with each of request.methods in turn (AR first); panel slot k
    shows the k-th method in that order.

    Until the last method ends, only the status line changes: the previous run's panels, charts and
    table stay as they are, so that the browser draws nothing on the cores the decoders are timed on.
    Closing the generator (Stop, a closed tab) closes the method's round iterator, so
    decoding ends with the round in flight.
    """
    yield RunUpdate(status=f"Loading **{request.target}**" + (f" + **{request.draft}**" if request.draft else "")
                    + f"{loading_note(request)} …" + STALE_NOTE)
    try:
        pair = load(request)
    except ValueError as error:  # ModelLoadError and tokenizer mismatches are ValueErrors
        yield RunUpdate(status=f"⚠️ {error}", warning=str(error))
        return
    except Exception as error:
        log.exception("loading %s failed", request.target)
        message = readable_failure(error)
        yield RunUpdate(status=f"⚠️ {message}", warning=message)
        return
    fit_chat(request, pair)
    fit_engine(request, pair)
    yield from gpu(decode_methods)(pair, request, limits, threads=threads)


def loading_note(request: Request) -> str:
    """What a first load costs beyond reading the weights, for the status line."""
    if request.runtime != TORCH:
        return runtime_loading_note(request.runtime)
    return " (a pair new to the page also compiles its decode steps, first time only)" if request.engine.compile else ""


def runtime_loading_note(runtime: str) -> str:
    """The status line's words for a pair loaded with its target on `runtime` ("" on torch): the Playground's
    and the Benchmark tab's first load on onnx (and on auto, where it gives onnx) exports the target."""
    if runtime == ONNX:
        return (" on the onnx runtime (its first use exports the target for ONNX Runtime, about 30 s for the "
                "embedded one; afterwards it is read from disk)")
    if runtime == AUTO_RUNTIME and resolve_runtime(AUTO_RUNTIME, str(default_device()), "float32").runtime == ONNX:
        return (" (on ONNX Runtime where it runs the target: preparing the fast target, first time only, about 30 s "
                "for the embedded one, never counted in tokens/s)")
    return ""


STALE_NOTE = " The panels, charts and table below are redrawn when every method has ended."


def decode_methods(pair: ModelPair, request: Request, limits: Limits | None = None,
                   status_interval_s: float = STATUS_INTERVAL_S, threads: ThreadPlan | None = None) -> Iterator[RunUpdate]:
    """The decoding half of `stream_run`, on a loaded pair (the part ZeroGPU runs on the GPU)."""
    names = viz.method_order(request.methods)
    progress = RunProgress(names, request.params.max_new_tokens)
    started = time.perf_counter()
    plan = threads
    threads = threads.for_runtime(getattr(pair, "runtime", TORCH)) if threads is not None else None
    for k, name in enumerate(names):
        if request.engine.first_round_note:
            yield RunUpdate(status=progress.line(k, first_round_status(request.engine)))
        # A method the runtime cannot run runs on the torch copy, on torch's thread plan.
        on_copy = runtime_reason(pair, name, request.params, compile=request.engine.compile) is not None
        count = (plan.for_runtime(TORCH) if on_copy else threads).for_method(name) if threads is not None else None
        try:
            result = yield from decode_one(pair, request, limits, k, progress, status_interval_s, count)
        except _MethodFailed as failure:
            progress.failed(k, str(failure), failure.panel)
            continue
        if result is not None:
            progress.finished(k, result)
    if needs_torch_copy_ar(list(progress.results.values())):
        yield RunUpdate(status=progress.line(len(names) - 1, "timing AR on the torch copy of the target, the "
                                                             "reference of the methods that ran there …"))
        count = plan.for_runtime(TORCH).for_method(REFERENCE) if plan is not None else None
        progress.reference = reference_run(pair, request, limits, count)
    yield final_update(pair, request, progress, time.perf_counter() - started)


def reference_run(pair: ModelPair, request: Request, limits: Limits | None, threads: int | None) -> GenerationResult:
    """AR on the torch copy of the target (`torch_copy.TORCH_COPY_AR`), timed on the decoding thread as a
    method is: the speed the rows that ran on the torch copy are set against."""
    def run() -> GenerationResult:
        if threads is not None:
            torch.set_num_threads(threads)
        with quiet_gc():
            return torch_copy_ar(pair, request.prompt, request.params, limits, cache=request.engine.cache)
    return decoding_thread().submit(run).result()


def final_update(pair: ModelPair, request: Request, progress: "RunProgress", elapsed: float) -> RunUpdate:
    """Everything the page draws, in one update once every method has ended: the panels, the charts,
    the table, the explanation and the CSVs."""
    results = list(progress.results.values()) + ([progress.reference] if progress.reference is not None else [])
    if not results:
        panels = {k: progress.failed_panels.get(k, "") for k in range(len(progress.names))}
        return RunUpdate(status="⚠️ nothing ran: " + "; ".join(progress.errors), shown=len(progress.names),
                         panels=panels)
    float32_ar, reference_note = float32_reference(pair, request, results)
    comparison = tabulate(pair, results, float32_ar)
    # A panel outlines where its output first left AR's, its tooltip saying whether AR's choice was a near-tie.
    diverged = viz.divergences(comparison.summary)
    panels = {k: viz.render_panel(name, progress.results[k], pair.tokenizer,
                                  divergence=diverged.get(progress.results[k].method))
              if k in progress.results else progress.failed_panels.get(k, "") for k, name in enumerate(progress.names)}
    # Without a tree method the trees' charts stay hidden: neither built nor sent to the browser.
    trees = any(r.tree is not None for result in results for r in result.rounds)
    return RunUpdate(status=done_status(request, results, progress.errors, elapsed) + reference_note,
                     shown=len(progress.names),
                     panels=panels, figures=charts.all_charts(results, pair.tokenizer, trees), charts_shown=True,
                     trees_shown=trees,
                     table=viz.display_table(comparison.summary), why=viz.explain(comparison.summary),
                     files=write_csvs(comparison.summary, comparison.rounds, comparison.tokens), results=results)


# The float32 copy of a target that the Playground's runs below float32 are set against, kept between runs.
FLOAT32_REFERENCE = Float32Reference()


def chose_below_float32(request: Request, pair: ModelPair) -> bool:
    """Whether the visitor chose a precision and either model runs below float32: only then do the
    table's vs-fp32 columns appear (the page's default precision costs nothing more)."""
    return (request.target_dtype != AUTO or request.draft_dtype != AUTO) and runs_below_float32(pair)


def float32_reference(pair: ModelPair, request: Request, results: list[GenerationResult]
                      ) -> tuple[GenerationResult | None, str]:
    """AR on the target's weights at float32 over the run's prompt, where `chose_below_float32`; it
    runs once every method has ended, so no row's time counts it. With the status line's words on it."""
    if not results or not chose_below_float32(request, pair):
        return None, ""
    before = FLOAT32_REFERENCE.seconds
    float32_ar = reference_for(pair, results, request.params, FLOAT32_REFERENCE)
    if float32_ar is None or not FLOAT32_REFERENCE.loaded_beside(pair):
        return float32_ar, " The vs fp32 columns read this run's own AR (its target is float32)."
    return float32_ar, (f" The vs fp32 columns read AR on a float32 copy of the target, run afterwards in "
                        f"{FLOAT32_REFERENCE.seconds - before:.1f} s and counted in no row.")


@dataclass
class RunProgress:
    """What the status line says while a run decodes: the finished methods' speeds, then the one in flight."""

    names: list[str]
    max_new_tokens: int
    results: dict[int, GenerationResult] = field(default_factory=dict)  # slot → finished method
    errors: list[str] = field(default_factory=list)
    failed_panels: dict[int, str] = field(default_factory=dict)  # slot → the failed method's panel
    # AR on the torch copy (TORCH_COPY_AR), where a method ran there: a row of the table, no panel of its own.
    reference: GenerationResult | None = None
    _done: list[str] = field(default_factory=list)

    def label(self, k: int) -> str:
        return viz.method_label(self.names[k])

    def line(self, k: int, doing: str) -> str:
        done = " · ".join(self._done)
        return (f"{done} · " if done else "") + f"**{self.label(k)}** ({k + 1}/{len(self.names)}): {doing}"

    def rounds(self, k: int, result: GenerationResult) -> str:
        return self.line(k, f"round {len(result.rounds)}, {len(result.tokens)}/{self.max_new_tokens} tokens")

    def finished(self, k: int, result: GenerationResult) -> None:
        self.results[k] = result
        self._done.append(f"{self.label(k)} ✓ {result.stats['tokens_per_s']:.1f} tok/s")

    def failed(self, k: int, message: str, panel: str) -> None:
        self.errors.append(f"{self.label(k)}: {message}")
        self.failed_panels[k] = panel
        self._done.append(f"{self.label(k)} ⚠️")


def done_status(request: Request, results: list[GenerationResult], errors: list[str], elapsed: float) -> str:
    """The status line of a finished run: how long it took, on how many threads, and what to do next."""
    decoding = sum(r.seconds for r in results)
    done = (f"Done in {elapsed:.1f} s{request.note} ({decoding:.1f} s decoding, {run_threads(results)}; the charts "
            "and panels were drawn after the timed rounds). "
            "Hover a token for its round and what decided it; download the numbers below.")
    inexact = next((r.exactness for r in results if not is_exact(r.exactness)), None)
    if inexact:
        sentence = exactness_sentence(inexact)
        done += f" ℹ️ {sentence[0].upper()}{sentence[1:]}."
    done += runtime_sentence(results)
    notes = [r.note for r in results if r.note]  # e.g. AR without a cache stopped early
    if notes:
        done += " ℹ️ " + "; ".join(notes) + "."
    if errors:
        done += " ⚠️ " + "; ".join(errors)
    return done


def run_threads(results: list[GenerationResult]) -> str:
    """The run's torch threads in the server log's words (`threads_sentence`): "2 torch threads", or "1 torch
    thread for AR, 2 for the drafting methods" where the plan gave them apart."""
    one_token = sorted({r.threads for r in results if not drafts(r.method)})
    drafting = sorted({r.threads for r in results if drafts(r.method)})
    if len(one_token) <= 1 and len(drafting) <= 1 and (one_token or drafting):
        return threads_sentence((one_token or drafting)[0], (drafting or one_token)[0])
    counts = ", ".join(str(n) for n in sorted({r.threads for r in results}))
    return f"{counts} torch threads"


def runtime_sentence(results: list[GenerationResult]) -> str:
    """The status line's words on what ran the target and why (`GenerationResult.runtime_reason`): the pair's
    runtime once, then each method that ran on the torch copy of a runtime target."""
    pair_reason = next((r.runtime_reason for r in results if r.runtime_reason and r.runtime != TORCH_COPY), "")
    copied = [f"{viz.method_label(r.method)} {r.runtime_reason}" for r in results
              if r.runtime == TORCH_COPY and r.method != TORCH_COPY_AR]
    sentence = f" ⚙️ {pair_reason[0].upper()}{pair_reason[1:]}." if pair_reason else ""
    if copied:
        sentence += (" ⚙️ " + "; ".join(copied) + "; their speedups are over AR on the same torch copy "
                     "(the AR (torch copy) row).")
    return sentence


class _MethodFailed(Exception):
    """One method of a run failed; its panel says why, and the others go on."""

    def __init__(self, message: str, panel: str):
        super().__init__(message)
        self.panel = panel


def decode_one(pair: ModelPair, request: Request, limits: Limits | None, k: int, progress: RunProgress,
               status_interval_s: float = STATUS_INTERVAL_S,
               threads: int | None = None) -> Generator[RunUpdate, None, GenerationResult | None]:
    """The method in slot k decoding, each round on `threads` torch threads (None: as they are);
    returns its last result. While it decodes, only a status line is sent, at most every
    status_interval_s (see STATUS_INTERVAL_S)."""
    name, label = progress.names[k], progress.label(k)
    if threads is not None:  # here too: the result records the count it starts on
        torch.set_num_threads(threads)
    try:
        rounds = iter_generate(pair, request.prompt, name, limits=limits, decode=request.params,
                               **request.engine.as_kwargs())
    except ValueError as error:
        yield RunUpdate(status=progress.line(k, f"⚠️ {error}"), warning=f"{label}: {error}")
        raise _MethodFailed(str(error), viz.render_panel(name, state="error", message=str(error))) from None
    yield RunUpdate(status=progress.line(k, "decoding …"))
    result, last_status = None, time.perf_counter()
    try:
        with quiet_gc():  # as the benchmark times a decode: a collection inside it would count as decoding
            for result in rounds_on_threads(rounds, threads):
                now = time.perf_counter()
                if now - last_status >= status_interval_s and not result.done:
                    last_status = now
                    yield RunUpdate(status=progress.rounds(k, result))
    except Exception as error:  # a failure inside a method must not take the page down
        log.exception("decoding %s failed", name)
        message = readable_failure(error)
        yield RunUpdate(status=progress.line(k, f"⚠️ failed: {message}"), warning=f"{label}: {message}")
        raise _MethodFailed(message, viz.render_panel(name, result, pair.tokenizer, state="error",
                                                      message=message)) from None
    finally:
        rounds.close()
    return result


def rounds_on_threads(rounds: Iterator[GenerationResult], threads: int | None) -> Iterator[GenerationResult]:
    """`rounds`, each computed on the process's decoding thread (`decoding_thread`) on `threads`
    torch threads (None: the count of the thread that asks for the first round).

    Gradio resumes a streaming handler on whichever of its worker threads is free, and its pool
    lets an idle worker end after a few seconds, so a Run that started after a pause decoded on a
    thread new to torch. torch's OpenMP threads belong to the thread that starts them, and on a
    new thread the drafting methods' two-thread rounds ran well below the engine's speed, for the
    whole of some page runs. Rounds on one thread that lives as long as the process decode as the
    engine does on its main thread. The count is still set on that thread before each round
    (0.4 µs): the methods of one run differ in it."""
    count = threads if threads is not None else torch.get_num_threads()

    def next_round() -> GenerationResult | None:
        torch.set_num_threads(count)
        return next(rounds, None)

    decoder = decoding_thread()
    while (result := decoder.submit(next_round).result()) is not None:
        yield result


# ---------------------------------------------------------------------------------------
# The scripted comparison


@dataclass
class CompareOutcome:
    table: pd.DataFrame  # viz.records of the summary (the CLI's columns)
    summary_csv: str
    rounds_csv: str
    texts: dict[str, str]  # method → output text
    tokens_csv: str  # one row per drafted token: what decided it


def compare(request: Request, load: Callable[[Request], ModelPair], limits: Limits | None = None,
            gpu: Callable[[Callable], Callable] = gpu, threads: ThreadPlan | None = None) -> CompareOutcome:
    """Run request.methods one after another on a loaded pair and tabulate them."""
    pair = load(request)
    fit_chat(request, pair)
    fit_engine(request, pair)
    comparison = gpu(run_comparison)(pair, request.prompt, request.methods, limits=limits, decode=request.params,
                                     threads_for=threads.for_method if threads is not None else None,
                                     vs_float32=FLOAT32_REFERENCE if chose_below_float32(request, pair) else None,
                                     **request.engine.as_kwargs())
    summary_path, rounds_path, tokens_path = write_csvs(comparison.summary, comparison.rounds, comparison.tokens)
    return CompareOutcome(viz.records(comparison.summary), summary_path, rounds_path,
                          {r.method: r.text for r in comparison.results}, tokens_path)
