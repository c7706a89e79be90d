"""The Gradio page: an intro and three tabs, Playground, Benchmark and Sweep.

`build_demo()` composes the tabs and returns the Blocks (queue already set up); each tab's
layout and events live in its own module beside its handlers (`playgroundtab` with
`handlers`, `benchtab`, `sweeptab`), and what they share is a `page.TabContext`.
`launch()` adds the page's theme and CSS, which Gradio 6 takes at launch time.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import time
from typing import Any, Mapping, Sequence

import gradio as gr
import torch
from starlette.middleware import Middleware

from . import benchtab, playgroundtab, sweeptab, viz
from .quiet import EarlyHeadScript, slow_queue_polling
from .examples import DEFAULT_PROMPT
from .handlers import (  # noqa: F401  (the page's handlers, re-exported for callers of `ui`)
    PARAM_NAMES, Request, RunUpdate, fit_chat, make_request, readable_failure, resolve_models, write_csvs,
)
from .engine_controls import compile_setting, page_engine_defaults, warming_status
from .limits import Limits
from .page import (  # noqa: F401  (what the tabs share, re-exported for callers of `ui`)
    GPU_QUEUE, PairCache, PairLoader, RunningSessions, TabContext, ThreadPlan, export_dir,
    forget_replaced_components, gpu, on_zero_gpu,
)
from ..models.loading import PRESETS, Preset, load_pair
from ..models.precision import served_precisions
from ..engine.runtimes import AUTO, ONNX, runtime_named
from ..engine.runtimes.onnx_export import onnx_runtime_missing, resolve_runtime, served_runtimes
from ..models.tokens import default_device
from ..engine.methods import DEFAULT_METHODS, METHODS
from ..engine.params import DecodeParams

log = logging.getLogger(__name__)

DEFAULTS = DecodeParams()
THREADS_ENV = "SPECDEMO_THREADS"
# Measured with the page benchmark (docs/benchmark.md) on a 2-core machine that also runs the
# visitor's browser, once the page kept quiet while decoding (`quiet`): the drafting methods decode
# 1.3–1.45 times faster on both cores than on one, while AR gains nothing from the second core, which
# it leaves to the browser. So "auto" (AR one thread, drafting methods every core). A machine with more
# cores keeps torch's choice.
SMALL_MACHINE_CORES = 2
SMALL_MACHINE_THREADS = "auto"
def intro_text(methods: Mapping[str, Any] | None = None, ticked: Sequence[str] = DEFAULT_METHODS) -> str:
    """The page's intro, two sentences from the method registry: what the page does, and which methods are
    ticked by default (each with its registry description), out of how many the Methods box offers."""
    methods = METHODS if methods is None else methods
    named = "; ".join(f"**{methods[name].label}**: {methods[name].description}" for name in ticked if name in methods)
    more = len(methods) - len([name for name in ticked if name in methods])
    return ("# Speculative decoding playground\n"
            "The page decodes your prompt with each ticked method in turn on the same target model, then shows every "
            "token each one kept or refused, its speed against AR's and whether its text is AR's (hover a token "
            "for what decided it). "
            f"Ticked by default — {named}; {more} more methods and baselines wait in the Methods box, where the "
            "chosen pair can run them.")


INTRO = intro_text()


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
    preload: bool = False,
    threads: ThreadPlan | None = None,
    compile: str | None = None,
    runtime: str | None = None,
) -> gr.Blocks:
    """The page's Blocks, queued so GPU work runs one request at a time.

    pair_loader: loader(target, draft, device=..., dtype=...) (default `load_pair`), plus target_dtype, draft_dtype and
    runtime where a visitor chose other than auto; tests pass presets with a tiny local pair. public: public mode (also
    on for a Space or with SPECDEMO_PUBLIC=1); limits: the deployment's, else from the environment. preload: load and
    warm the default pair in the background from the start, so the first Run is timed like the second. threads: torch's
    threads per method (`serving_threads`; None leaves them). defaults: the inputs' initial values by parameter name
    (e.g. a shorter run for a slow machine). compile: auto, on or off (`engine_controls.compile_setting`). runtime: the target's.
    """
    limits = limits or Limits.from_env(public=True if public else None)
    served = served_presets(limits, presets if presets is not None else PRESETS)
    limit = cache_limit if cache_limit is not None else int(os.environ.get("SPECDEMO_MAX_PAIRS", "1"))
    engine_defaults = functools.partial(page_engine_defaults, device or default_device(),
                                        setting=compile_setting(compile), zero_gpu=on_zero_gpu())
    cache = PairCache(pair_loader or load_pair, limit=limit, engine_defaults=engine_defaults)

    with gr.Blocks(title="specdemo — speculative decoding playground", delete_cache=(3600, 3600)) as demo:
        demo.specdemo_cache, demo.specdemo_limits, demo.specdemo_presets = cache, limits, served  # type: ignore[attr-defined]
        runs = RunningSessions(tidy=functools.partial(forget_replaced_components, demo))
        runs.watch(demo)
        default = default_preset if default_preset in served else next(iter(served))
        runtimes = page_runtimes(device or default_device(), runtime)
        auto = resolve_runtime(AUTO, str(device or default_device()), "float32")  # before any target is loaded
        ready = (preload_pair(cache, served[default], device=device, dtype=dtype, runtime=runtimes[0], threads=threads)
                 if preload else None)
        ctx = TabContext(
            presets=served, default_preset=default,
            load=functools.partial(cache.get, device=device, dtype=dtype),
            limits=limits, gpu=gpu, export=export_dir, queue_id=GPU_QUEUE, follow=runs.follow, ready=ready,
            threads=threads, precisions=served_precisions(device or default_device()), runtimes=runtimes,
            warming=warming_status(default, engine_defaults(served[default].encoder_decoder),
                                   fast_start(runtimes[0], auto.runtime, served[default])), auto_runtime=auto.runtime,
            engine_defaults=engine_defaults,
        )
        gr.Markdown(INTRO, elem_id="sd-intro")
        with gr.Tab("Playground", elem_id="sd-playground-tab"):
            playgroundtab.build_tab(ctx, initial_values(limits, defaults))
        with gr.Tab("Benchmark", elem_id="sd-benchmark-tab"):
            benchtab.build_tab(ctx)
        with gr.Tab("Sweep", elem_id="sd-sweep-tab"):
            sweeptab.build_tab(ctx)

    demo.queue(default_concurrency_limit=1, max_size=limits.queue_size)
    slow_queue_polling(demo)
    return demo


def fast_start(runtime: str, auto: str, preset: Preset) -> bool:
    """Whether the page's default pair starts by preparing the fast target (its export for ONNX Runtime)."""
    return (runtime == ONNX or (runtime == AUTO and auto == ONNX)) and not preset.encoder_decoder


def page_runtimes(device, runtime: str | None = None) -> tuple[str, ...]:
    """The target runtimes the page offers on `device`, its default first: `runtime` (SPECDEMO_RUNTIME when
    None, else auto: onnx where it runs the target, torch otherwise) where it is served here (ValueError
    otherwise). auto and torch are served everywhere, onnx where `served_runtimes` says."""
    served = (AUTO, *served_runtimes(str(device)))
    runtime = runtime or os.environ.get("SPECDEMO_RUNTIME") or AUTO
    if runtime not in served:
        why = runtime_named(runtime).refusal(device=str(device)) or onnx_runtime_missing()
        raise ValueError(f"runtime {runtime!r} is not served here (runtimes: {', '.join(served)}): {why}")
    return (runtime, *(r for r in served if r != runtime))


def ready_line(preset: Preset, pair, seconds: float, threads: ThreadPlan | None = None) -> str:
    """The server log's line once the default pair is loaded and warmed: what is ready, on what, in what time,
    and on how many torch threads its Runs decode (the status line's words, `threads_sentence`)."""
    runtime = getattr(pair, "runtime", "torch")
    device = next(pair.target.parameters()).device.type if hasattr(pair.target, "parameters") else "cpu"
    line = f"ready: {preset.name} on {runtime}/{device}, loaded and warmed in {seconds:.0f} s"
    if threads is not None:
        line += f"; Runs decode on {threads.for_runtime(runtime).describe()}"
    return line + "; a Run now decodes at once"


def preload_pair(cache: PairCache, preset: Preset, device: str | None = None, dtype: str | None = None,
                 runtime: str | None = None, threads: ThreadPlan | None = None) -> threading.Event:
    """Load and warm `preset`'s pair in a background thread, under the key a Run with the default
    ("auto") precisions looks up; the event is set when it is done (also when it failed: the first
    Run then loads it and reports the error). Once ready, the server's log says so in one line (`ready_line`)."""
    ready = threading.Event()

    def load() -> None:
        started = time.perf_counter()
        try:
            pair = cache.get(preset.target, preset.draft, device=device, dtype=dtype, runtime=runtime)
            print(ready_line(preset, pair, time.perf_counter() - started, threads), flush=True)
        except Exception:
            log.exception("preloading %s failed", preset.name)
        finally:
            ready.set()

    threading.Thread(target=load, name="specdemo-preload", daemon=True).start()
    return ready


def serving_threads(requested: int | str | None = None, cores: int | None = None) -> ThreadPlan:
    """torch's CPU threads for serving: `requested` (app.py --threads, a count or "auto"), else
    SPECDEMO_THREADS, else SMALL_MACHINE_THREADS on a machine of SMALL_MACHINE_CORES cores or fewer
    and torch's own choice elsewhere. "auto" gives AR one thread and drafting methods every core.
    Sets torch's count for work that is not one method's decode; ValueError for a count below 1."""
    value = requested if requested is not None else os.environ.get(THREADS_ENV) or None
    cores = cores if cores is not None else os.cpu_count() or 1
    if value is None:
        value = SMALL_MACHINE_THREADS if cores <= SMALL_MACHINE_CORES else torch.get_num_threads()
    try:
        plan = ThreadPlan.parse(value, cores)
    except ValueError:
        raise ValueError(f"threads must be an integer ≥ 1 or auto (--threads or {THREADS_ENV}), got {value!r}") from None
    torch.set_num_threads(plan.default)
    return plan


def served_presets(limits: Limits, known: Mapping[str, Preset]) -> dict[str, Preset]:
    """The presets this deployment serves; ValueError when its allow-list leaves none."""
    served = limits.served(dict(known))
    if not served:
        raise ValueError(f"no preset to serve: the allow-list {', '.join(limits.allowed_presets)} "
                         f"names none of {', '.join(known)}")
    return served


def initial_values(limits: Limits, defaults: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Playground's first input values: the schema's defaults, overridden by `defaults`,
    max_new_tokens within the deployment's cap."""
    initial = {**DEFAULTS.as_dict(), "seed": 0, "chat": True, "prompt": DEFAULT_PROMPT,
               "methods": list(DEFAULT_METHODS), **(defaults or {})}
    initial["max_new_tokens"] = min(initial["max_new_tokens"], limits.max_new_tokens)
    return initial


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
/* A pair's name longer than the box ends in an ellipsis before the arrow, never under it. */
#sd-preset input { text-overflow: ellipsis; }
/* A header wraps between its words only ("speedup vs AR", never "speedu p"): Gradio's cells break anywhere. */
.gradio-container th .header, .gradio-container th .header-content {
  word-break: normal !important; overflow-wrap: normal !important; hyphens: none !important; }
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
    """Serve `demo` with the page's look, with the browser's status timers slowed (`quiet`) and
    without Gradio's run history: it rewrites the visitor's whole saved history in the browser's
    storage at every update of a run (20 writes, 1.9 MB in one default run, more with each run
    saved), on the core the decoders share. The page's CSVs are a run's record. (A Gradio 6 without
    the option is launched without it.)"""
    app_kwargs = dict(kwargs.pop("app_kwargs", None) or {})
    app_kwargs["middleware"] = [*app_kwargs.get("middleware", []), Middleware(EarlyHeadScript)]
    quiet = {"run_history": False} if "run_history" in inspect.signature(demo.launch).parameters else {}
    return demo.launch(**{**launch_options(), **quiet, **kwargs, "app_kwargs": app_kwargs})
