"""The Gradio playground: type a prompt, watch AR, SD, NASD and EGAG decode it round by round.

Handlers only wire inputs to the library and traces to components; everything that draws
lives in `viz`. `build_demo()` returns the Blocks (queue already set up); `launch()` adds the
page's theme and CSS, which Gradio 6 takes at launch time.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import gradio as gr
import torch

from . import benchtab, viz
from ..bench.compare import run_comparison, tabulate
from ..engine.decoding import generate, iter_generate
from .examples import DEFAULT_PROMPT, EXAMPLES
from .limits import Limits
from ..models.loading import PRESETS, ModelPair, Preset, load_pair
from ..engine.methods import DEFAULT_METHODS, METHODS, parse_methods
from ..engine.params import PARAMS, DecodeParams
from ..bench.tables import summary_frame
from ..engine.trace import GenerationResult

log = logging.getLogger(__name__)

PairLoader = Callable[..., ModelPair]

DEFAULTS = DecodeParams()
# Charts are redrawn at most this often while a method runs (and always when it ends):
# serialising four Plotly figures after every round would cost more than the round.
CHART_INTERVAL_S = 0.5
# Every event that decodes joins this one queue, so runs from different visitors (and from
# different tabs) take turns on the device instead of sharing it.
GPU_QUEUE = "gpu"
EXPORT_ROOT = Path(tempfile.gettempdir()) / "specdemo-exports"
EXPORT_TTL_S = 3600


# ---------------------------------------------------------------------------------------
# Model pairs: loaded once, kept in a small LRU cache


class PairCache:
    """Pairs keyed by (target, draft, device, dtype); beyond `limit`, the least recently
    used pair is closed so a new one can take its memory."""

    def __init__(self, loader: PairLoader = load_pair, limit: int = 1, warm_up: bool = True):
        if limit < 1:
            raise ValueError("the pair cache must hold at least one pair")
        self.loader = loader
        self.limit = limit
        self.warm_up = warm_up
        self._pairs: OrderedDict[tuple, ModelPair] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._pairs)

    def get(self, target: str, draft: str | None, device: str | None = None, dtype: str | None = None) -> ModelPair:
        key = (target, draft, device, dtype)
        with self._lock:
            if key in self._pairs:
                self._pairs.move_to_end(key)
                return self._pairs[key]
            # Free memory before loading, not after: two large pairs may not fit together.
            while len(self._pairs) >= self.limit:
                _, old = self._pairs.popitem(last=False)
                old.close()
            pair = self.loader(target, draft, device=device, dtype=dtype)
            if self.warm_up:
                _warm_up(pair)
            self._pairs[key] = pair
            return pair

    def clear(self) -> None:
        with self._lock:
            while self._pairs:
                self._pairs.popitem()[1].close()


def _warm_up(pair: ModelPair) -> None:
    """Run each model once so the first method timed on the page does not pay for
    one-off kernel selection and allocation (which would flatter every later method)."""
    try:
        method = "sd" if pair.draft is not None else "ar"
        generate(pair, [int(next(iter(pair.eos_ids), 1))] * 4, method, max_new_tokens=3, gamma=2, seed=0)
    except Exception:  # a failed warm-up only costs timing accuracy
        log.debug("warm-up failed", exc_info=True)


# ---------------------------------------------------------------------------------------
# ZeroGPU: on a Hugging Face Space with the `spaces` package, GPU work runs under spaces.GPU


def on_zero_gpu() -> bool:
    if not os.environ.get("SPACE_ID"):
        return False
    try:
        import spaces  # noqa: F401
    except ImportError:
        return False
    return True


def gpu(fn: Callable) -> Callable:
    if on_zero_gpu():
        import spaces

        return spaces.GPU(duration=120)(fn)
    return fn


# ---------------------------------------------------------------------------------------
# Exports


def export_dir(root: Path = EXPORT_ROOT, ttl_s: float = EXPORT_TTL_S) -> Path:
    """A fresh folder for one request's CSVs; folders older than ttl_s are removed first.
    (Gradio copies returned files into its own cache, so an old folder is safe to drop.)"""
    root.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in root.iterdir():
        try:
            if old.is_dir() and now - old.stat().st_mtime > ttl_s:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # another request removed it first
    return Path(tempfile.mkdtemp(prefix="run-", dir=root))


def write_csvs(summary, rounds) -> tuple[str, str]:
    folder = export_dir()
    summary_path, rounds_path = folder / "specdemo-summary.csv", folder / "specdemo-rounds.csv"
    summary.to_csv(summary_path, index=False)
    rounds.to_csv(rounds_path, index=False)
    return str(summary_path), str(rounds_path)


# ---------------------------------------------------------------------------------------
# Inputs → library arguments


@dataclass
class Request:
    prompt: str
    target: str
    draft: str | None
    params: DecodeParams  # validated once, here; the loop takes it as it is
    note: str = ""


PARAM_NAMES = tuple(PARAMS)  # the page's parameter inputs, in the schema's order


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


def make_request(prompt, preset, target, draft, values: Mapping[str, Any], presets: Mapping[str, Preset],
                 limits: Limits | None = None) -> Request:
    """Validate everything that can be checked before loading a model; ValueError otherwise."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("prompt is empty: type some text to continue")
    decode = DecodeParams.from_values(**{name: values[name] for name in PARAM_NAMES if name in values})
    limits = limits or Limits()
    limits.check_models(preset, target, draft, known=presets)
    limits.check_new_tokens(decode.max_new_tokens)
    target, draft = resolve_models(preset, target, draft, presets)
    return Request(prompt, target, draft, decode)


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
    """Chat is on by default; a tokenizer without a chat template gets the plain prompt
    rather than an error, and the status line says so."""
    if request.params.chat and not getattr(pair.tokenizer, "chat_template", None):
        request.params = request.params.replace(chat=False)
        request.note = " (this tokenizer has no chat template, so the prompt went in as plain text)"


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
            "proposes γ tokens, the target checks them in one forward), **NASD** (drafts from an n-gram table, "
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
                    max_new_tokens = gr.Slider(1, min(1024, limits.max_new_tokens), value=initial["max_new_tokens"], step=1,
                                               label="Max new tokens")
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
                with gr.Row():
                    temperature = gr.Slider(0.0, 2.0, value=initial["temperature"], step=0.05,
                                            label="Temperature (0 = greedy)")
                    top_k = gr.Number(value=initial["top_k"], precision=0, label="Top-k (0 = off)")
                    top_p = gr.Slider(0.05, 1.0, value=initial["top_p"], step=0.01, label="Top-p (1 = off)")
                    seed = gr.Number(value=initial["seed"], precision=0, label="Seed (empty = random)")
                with gr.Row():
                    gamma = gr.Number(value=initial["gamma"], precision=0, label="SD / NASD: γ (draft length)")
                    gamma_min = gr.Number(value=initial["gamma_min"], precision=0, label="EGAG: γ min")
                    gamma_max = gr.Number(value=initial["gamma_max"], precision=0, label="EGAG: γ max")
                    ema = gr.Slider(0.0, 0.99, value=initial["ema"], step=0.01, label="EGAG: entropy EMA β")
                with gr.Row():
                    ngram_n = gr.Number(value=initial["ngram_n"], precision=0, label="NASD: n of the n-gram table")
                    ngram_storage = gr.Radio(["basic", "onelevel"], value=initial["ngram_storage"],
                                             label="NASD: table kind")
                    top_k_filler = gr.Number(value=initial["top_k_filler"], precision=0,
                                             label="NASD: top-k filler from the target")
                    chat = gr.Checkbox(value=initial["chat"], label="Chat template",
                                       info="wrap the prompt as a user turn (instruct models)")

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

        with gr.Tab("Benchmark", elem_id="sd-benchmark-tab"):
            benchtab.build_tab(presets, default_preset, lambda t, d: cache.get(t, d, device=device, dtype=dtype),
                               limits, gpu, export_dir, GPU_QUEUE,
                               tidy=functools.partial(forget_replaced_components, demo))

        param_inputs = [max_new_tokens, temperature, top_k, top_p, seed, gamma, gamma_min, gamma_max, ema,
                        ngram_n, ngram_storage, top_k_filler, chat]
        charts = [gamma_plot, entropy_plot, accepted_plot, race_plot]

        # -- the streaming run ---------------------------------------------------------
        def run(prompt, preset, methods, max_new_tokens, temperature, top_k, top_p, seed, gamma, gamma_min,
                gamma_max, ema, ngram_n, ngram_storage, top_k_filler, chat, target, draft, request: gr.Request):
            """Decode with each method in turn, yielding after every round."""
            try:
                yield from decode(prompt, preset, methods, max_new_tokens, temperature, top_k, top_p, seed, gamma,
                                  gamma_min, gamma_max, ema, ngram_n, ngram_storage, top_k_filler, chat, target, draft)
            finally:  # also when Stop or a closed tab ends the stream
                forget_replaced_components(demo, request)

        def decode(prompt, preset, methods, max_new_tokens, temperature, top_k, top_p, seed, gamma, gamma_min,
                   gamma_max, ema, ngram_n, ngram_storage, top_k_filler, chat, target, draft):
            values = dict(zip(PARAM_NAMES, (max_new_tokens, temperature, top_k, top_p, seed, gamma, gamma_min,
                                            gamma_max, ema, ngram_n, ngram_storage, top_k_filler, chat)))
            try:
                names = viz.method_order(parse_methods(methods or []))
                request = make_request(prompt, preset, target, draft, values, presets, limits)
            except ValueError as error:
                yield _failed(status, str(error))
                return
            yield {
                status: f"Loading **{request.target}**" + (f" + **{request.draft}**" if request.draft else "") + " …",
                **{panel: gr.update(visible=k < len(names),
                                    value=viz.render_panel(names[k], state="waiting") if k < len(names) else "")
                   for k, panel in enumerate(panels)},
                **{chart: figure for chart, figure in zip(charts, viz.all_figures([]).values())},
                table: viz.display_table(summary_frame([])), why: "",
                summary_file: gr.update(value=None, interactive=False),
                rounds_file: gr.update(value=None, interactive=False),
            }
            try:
                pair = load(request)
            except ValueError as error:  # ModelLoadError and tokenizer mismatches are ValueErrors
                yield _failed(status, str(error))
                return
            except Exception as error:
                log.exception("loading %s failed", request.target)
                yield _failed(status, readable_failure(error))
                return
            fit_chat(request, pair)
            yield from _stream(pair, request, names)

        @gpu
        def _stream(pair: ModelPair, request: Request, names: list[str]) -> Iterator[dict]:
            results: list[GenerationResult] = []
            errors: list[str] = []
            started = time.perf_counter()
            for k, name in enumerate(names):
                label = viz.method_label(name)
                cache_: dict = {}
                try:
                    rounds = iter_generate(pair, request.prompt, name, limits=limits, decode=request.params)
                except ValueError as error:
                    errors.append(f"{label}: {error}")
                    gr.Warning(f"{label}: {error}")
                    yield {panels[k]: viz.render_panel(name, state="error", message=str(error)),
                           status: f"⚠️ {label}: {error}"}
                    continue
                last_chart, chart_cost = 0.0, 0.0
                result = None
                try:
                    for result in rounds:
                        update = {
                            panels[k]: viz.render_panel(name, result, pair.tokenizer, cache=cache_),
                            status: f"**{label}** ({k + 1}/{len(names)}): round {len(result.rounds)}, "
                                    f"{len(result.tokens)}/{request.params.max_new_tokens} tokens",
                        }
                        now = time.perf_counter()
                        # On a slow machine drawing must not crowd out decoding: keep it to ~20%.
                        if result.done or now - last_chart >= max(CHART_INTERVAL_S, 4 * chart_cost):
                            update.update(_chart_updates(charts, results + [result]))
                            last_chart = time.perf_counter()
                            chart_cost = last_chart - now
                        yield update
                except Exception as error:  # a failure inside a method must not take the page down
                    log.exception("decoding %s failed", name)
                    message = readable_failure(error)
                    errors.append(f"{label}: {message}")
                    yield {panels[k]: viz.render_panel(name, result, pair.tokenizer, state="error", message=message),
                           status: f"⚠️ {label} failed: {message}"}
                    continue
                finally:
                    rounds.close()
                if result is not None:
                    results.append(result)
                    partial = summary_frame(results)
                    yield {table: viz.display_table(partial), why: viz.explain(partial)}
            if not results:
                yield {status: "⚠️ nothing ran: " + "; ".join(errors)}
                return
            comparison = tabulate(pair, results)
            summary_path, rounds_path = write_csvs(comparison.summary, comparison.rounds)
            elapsed = time.perf_counter() - started
            done = f"Done in {elapsed:.1f} s{request.note}. Hover a token for its round; download the numbers below."
            if errors:
                done += " ⚠️ " + "; ".join(errors)
            yield {
                status: done,
                **_chart_updates(charts, results),
                table: viz.display_table(comparison.summary),
                why: viz.explain(comparison.summary),
                summary_file: gr.update(value=summary_path, interactive=True),
                rounds_file: gr.update(value=rounds_path, interactive=True),
            }

        run_outputs = [status, *panels, *charts, table, why, summary_file, rounds_file]
        run_event = run_btn.click(
            run,
            inputs=[prompt, preset, methods, *param_inputs, target, draft],
            outputs=run_outputs,
            api_name="run",
            show_progress="hidden",
            concurrency_id=GPU_QUEUE,
        )
        stop_btn.click(lambda: "⏹ Stopped.", outputs=[status], cancels=[run_event], queue=False, api_visibility="private")

        # -- the scripted comparison ---------------------------------------------------
        def compare(prompt, preset, methods, max_new_tokens, temperature, top_k, top_p, seed, gamma, gamma_min,
                    gamma_max, ema, ngram_n, ngram_storage, top_k_filler, chat, target, draft):
            """Run the methods one after another; returns the summary table, the summary and
            per-round CSVs (the CLI's columns) and each method's output text."""
            values = dict(zip(PARAM_NAMES, (max_new_tokens, temperature, top_k, top_p, seed, gamma, gamma_min,
                                            gamma_max, ema, ngram_n, ngram_storage, top_k_filler, chat)))
            try:
                if methods is not None and not isinstance(methods, (str, list)):
                    raise ValueError("methods must be a comma-separated string or a list of names")
                names = parse_methods(methods)
                request = make_request(prompt, preset, target, draft, values, presets, limits)
                pair = load(request)
                fit_chat(request, pair)
                comparison = _compare(pair, request, names)
            except ValueError as error:
                raise gr.Error(str(error), print_exception=False) from None
            except Exception as error:
                log.exception("comparison failed")
                raise gr.Error(readable_failure(error), print_exception=False) from None
            summary_path, rounds_path = write_csvs(comparison.summary, comparison.rounds)
            texts = {r.method: r.text for r in comparison.results}
            return viz.records(comparison.summary), summary_path, rounds_path, texts

        @gpu
        def _compare(pair, request, names):
            return run_comparison(pair, request.prompt, names, limits=limits, decode=request.params)

        compare_btn.click(
            compare,
            inputs=[prompt, preset, api_methods, *param_inputs, target, draft],
            outputs=[api_table, api_summary, api_rounds, api_texts],
            api_name="compare",
            concurrency_id=GPU_QUEUE,
        )

    demo.queue(default_concurrency_limit=1, max_size=limits.queue_size)
    return demo


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
    if preset.name == "embedded":
        return "embedded — SmolLM2-135M-Instruct + trained draft (offline)"
    draft = preset.draft.split("/")[-1] if preset.draft else "no draft"
    return f"{preset.name} — {preset.target.split('/')[-1]} + {draft}"


def _failed(status: gr.Markdown, message: str) -> dict:
    gr.Warning(message)
    return {status: f"⚠️ {message}"}


def _chart_updates(charts: list, results: list[GenerationResult]) -> dict:
    return {chart: figure for chart, figure in zip(charts, viz.all_figures(results).values())}


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
