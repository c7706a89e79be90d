"""The target runtime of the page's suites (the Benchmark and Sweep tabs): the control, offered where
the Playground offers it, the runtime a run asks for checked against its pair, the thread plan on that
runtime, and the methods the runtime refuses, each with the reason the page gives before loading."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import gradio as gr

from .. import bench
from ..bench.measure.runners import HF_METHODS, RUNTIME_PEERS
from ..bench.measure.threads import ThreadPlan
from ..engine.methods import METHODS
from ..engine.runtimes import AUTO, ONNX, TORCH, refusal, runtime_reason
from ..engine.runtimes.onnx_export import resolve_runtime
from . import handlers
from .page import TabContext
from .playgroundtab import runtime_offered


def offer_runtime(ctx: TabContext, preset: gr.Dropdown, runtime: gr.Dropdown) -> None:
    """Another pair offers its runtimes (`runtime_offered`); a name the page does not know leaves the control."""
    preset.change(lambda name: runtime_offered(ctx, name, hidden=TORCH) if name in ctx.presets else gr.skip(), inputs=[preset],
                  outputs=[runtime], queue=False, api_visibility="private")


def suite_runtimes(ctx: TabContext) -> tuple[str, ...]:
    """The runtimes the suites' tabs offer: the page's concrete ones (a suite's methods and peers depend on
    the runtime, so a tab shows what auto gives a pair rather than auto)."""
    return tuple(runtime for runtime in ctx.runtimes if runtime != AUTO)


def auto_for(ctx: TabContext, preset_name: str) -> str:
    """What auto gives a preset's target before it loads (`onnx_export.resolve_runtime`): the page's answer
    for any target, checked against a local folder's config.json where the preset names one."""
    auto = getattr(ctx, "auto_runtime", TORCH)
    preset = ctx.presets.get(preset_name)
    if auto != ONNX or preset is None or not Path(preset.target).is_dir():
        return auto
    return resolve_runtime(AUTO, "cpu", "float32", Path(preset.target)).runtime


def pair_runtimes(ctx: TabContext, preset_name: str) -> tuple[str, ...]:
    """The runtimes a tab offers a preset's target, its default first: what the page's default gives it (auto
    resolved for it), then the others, where the dropdown shows; else torch alone."""
    if not runtime_offered(ctx, preset_name)["visible"]:
        return (TORCH,)
    default = auto_for(ctx, preset_name) if ctx.runtimes[0] == AUTO else ctx.runtimes[0]
    return (default, *(runtime for runtime in suite_runtimes(ctx) if runtime != default))


def chosen_runtime(ctx: TabContext, preset_name: str, value: Any) -> str:
    """The target's runtime from the page or the API (empty or auto: the first the tab offers the pair);
    ValueError for one the page serves but not for this pair's target, or one it does not serve."""
    offered = pair_runtimes(ctx, preset_name)
    if isinstance(value, str) and value.strip() == AUTO:
        value = None
    if isinstance(value, str) and value.strip() in ctx.runtimes and value.strip() not in offered:
        raise ValueError(f"runtime {value.strip()} cannot run the {preset_name} pair's target, which cannot be "
                         f"exported for it: choose {TORCH}")
    return handlers.chosen_runtime(value, offered)


def suite_threads(ctx: TabContext, runtime: str) -> ThreadPlan | None:
    """The page's plan for a suite with its target on `runtime`: on torch auto runs every method on one thread
    (`ThreadPlan.for_suites`); on the runtime auto gives every method every core first, as the Playground does,
    since its AR gains from them (`ThreadPlan.for_runtime`). A count stays a count."""
    return ctx.threads.for_runtime(runtime).for_suites() if ctx.threads is not None else None


# Why a method does not run beside the chosen runtime, as the page says it.
BESIDE_RUNTIME = "run beside a target on another runtime: choose the onnx target runtime"
NOT_OFFERED = "run beside a target on another runtime, which this page does not offer for this pair"
# transformers' peers call generate on the torch copy a runtime pair keeps: their speed is torch's, and the
# runtime's own decoders are the yardstick there, AR (torch copy) the torch one. The benchmark runs them there
# beside that AR; a sweep, which sets every setting against one AR, refuses them.
TRANSFORMERS_ON_RUNTIME = ("run transformers on the torch copy of the target, not on {runtime} (AR (torch copy) "
                           "times that copy here): choose the torch target runtime")


def unavailable_methods(draft_kind: str | None, runtime: str = TORCH,
                        runtimes: Sequence[str] = (TORCH,), torch_copy: bool = False) -> dict[str, str]:
    """The methods a pair drafting with `draft_kind` cannot run with its target on `runtime`, each with the
    reason the page gives (runtimes: those the tab offers the pair, which decide what the reason suggests).
    torch_copy: the suite runs a method the runtime cannot run on the pair's torch copy, beside that copy's
    AR (the benchmark does, transformers' peers too); a sweep sets every setting against one AR, so it refuses
    them instead."""
    missing = dict(bench.unavailable_bench_methods(draft_kind))
    if runtime == TORCH:
        reason = BESIDE_RUNTIME if ONNX in runtimes else NOT_OFFERED
        return {**missing, **{name: reason for name in RUNTIME_PEERS if name not in missing}}
    # The pair as far as the page knows it before loading: its draft's kind, its target on `runtime`.
    before_loading = SimpleNamespace(runtime=runtime, target_runtime=runtime, target=None,
                                     draft=object() if draft_kind else None, draft_kind=draft_kind)
    for name in () if torch_copy else METHODS:
        if runtime_reason(before_loading, name) is not None:
            missing.setdefault(name, refusal(before_loading, name))
    for name in () if torch_copy else HF_METHODS:
        missing.setdefault(name, TRANSFORMERS_ON_RUNTIME.format(runtime=runtime))
    return missing


def refuse_unavailable(names: Sequence[str], missing: dict[str, str]) -> None:
    """ValueError naming the chosen methods `missing` holds, with their reasons (before any model loads)."""
    by_reason: dict[str, list[str]] = {}
    for name in names:
        if name in missing:
            by_reason.setdefault(missing[name], []).append(name)
    if by_reason:
        raise ValueError("; ".join(f"{', '.join(chosen)}: {reason}" for reason, chosen in by_reason.items()))
