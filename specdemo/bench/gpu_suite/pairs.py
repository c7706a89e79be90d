"""The stages that measure speed, cut into units of (shape or pair) × mode: random-weight pairs of
real shapes (with forced acceptance) and the embedded pair. Compiled + static, the path users meet
on a GPU, runs first and whole; eager + dynamic is short (our AR and SD, half the new tokens).

May import torch, pandas, ``engine``, ``models`` and the other bench modules.
"""

from __future__ import annotations

import math
import tempfile
from contextlib import closing, contextmanager
from functools import partial

import torch

from ...engine.methods import ENTROPY_GAMMA, FIXED_GAMMA, REFERENCE, TABLE_DRAFTING
from ...models.loading import load_pair
from .. import synthetic
from ..overhead import spread_over_categories
from ..suite import DEFAULT_SUITE, load_suite
from .forced import ForcedAcceptance
from .measure import bench, decode_params, headline, overhead, prompt_ids
from .plan import Cost, Workload, default_cost
from .stages import MODES, Mode, Settings, StageContext, Unit

# (label, target size, draft size) from `synthetic.SIZES`.
SHAPES = (("pythia-1.4b/70m", "1.4b", "70m"), ("qwen2.5-1.5b/0.5b", "qwen2.5-1.5b", "qwen2.5-0.5b"))
TINY_SHAPES = (("pythia-tiny", "tiny", "tiny"), ("qwen2.5-tiny", "qwen2.5-tiny", "qwen2.5-tiny"))
TINY_VOCAB = 512
# Ours that the headline reads (AR, and SD at a fixed γ), the only ones the short eager units run.
EAGER_METHODS = (REFERENCE, FIXED_GAMMA)
# transformers' eager generate beside its compiled static one; its assisted generation refuses a
# static cache, so it always runs a dynamic one.
SYNTHETIC_METHODS = [*EAGER_METHODS, "hf-generate", "hf-generate-static", "hf-assisted"]
HEAD_METHODS = [*EAGER_METHODS, ENTROPY_GAMMA, TABLE_DRAFTING, "hf-generate", "hf-generate-static"]
LM_METHODS = [*EAGER_METHODS, "hf-assisted"]


def suite_prompts(count: int):
    """`count` prompts of the benchmark's suite, one category after another."""
    return spread_over_categories(load_suite(DEFAULT_SUITE), count)


def unit_methods(methods: list[str], mode: Mode) -> list[str]:
    return methods if mode.compile else [m for m in methods if m in EAGER_METHODS]


def unit_tokens(settings: Settings, mode: Mode) -> int:
    return settings.max_new_tokens if mode.compile else max(4, settings.max_new_tokens // 2)


def unit_cost(key: str, settings: Settings, methods: int, mode: Mode, prompts: int, default_prompts: int) -> Cost:
    """The table's minutes for `key`, scaled from the suite's default workload to this run's."""
    tokens, repeats = (8, 1) if settings.tiny else (128, 3)
    reference = Workload(methods, tokens if mode.compile else max(4, tokens // 2), repeats, default_prompts)
    work = Workload(methods, unit_tokens(settings, mode), settings.repeats, prompts)
    return default_cost(key, settings.rehearsal).for_work(work.size, reference.size)


def synthetic_units(settings: Settings) -> list[Unit]:
    units = []
    for mode in MODES:  # compiled + static of both shapes before any eager unit
        for label, target_size, draft_size in (TINY_SHAPES if settings.tiny else SHAPES):
            cost = unit_cost(f"synthetic {label} {mode.name}", settings, len(unit_methods(SYNTHETIC_METHODS, mode)),
                             mode, 1, 1)
            run = partial(run_synthetic_unit, shape=(label, target_size, draft_size), mode=mode)
            units.append(Unit(f"{label} {mode.name}", run, cost))
    return units


def run_synthetic_unit(ctx: StageContext, shape: tuple[str, str, str], mode: Mode) -> None:
    s, label = ctx.settings, shape[0]
    if not ctx.lines:
        ctx.note(f"Random weights with forced acceptance: both models follow one planted text, the draft at "
                 f"{s.rate:.0%} of positions (seed {s.seed}), so SD's rounds accept as a trained draft's would.")
    prompts = suite_prompts(1)
    decode = decode_params(ctx, chat=False, copy_n=0,  # copying from the context would hide the draft's rounds
                           max_new_tokens=unit_tokens(s, mode))
    stem = f"synthetic-{label.replace('/', '-')}-{mode.name}"
    with forced_pair(ctx, shape) as pair:
        result = bench(ctx, pair, prompts, unit_methods(SYNTHETIC_METHODS, mode), mode, decode, stem)
        ratio = overhead(ctx, pair, prompt_ids(pair, prompts, chat=False), mode, stem)
    ctx.headline.append(headline(label, mode, result, round_overhead=ratio))


@contextmanager
def forced_pair(ctx: StageContext, shape: tuple[str, str, str]):
    """The shape's random-weight pair, loaded with the planted oracle (`forced`): every greedy method
    writes the planted text, and the draft is accepted at the settings' rate."""
    s = ctx.settings
    target, draft = random_weight_folders(ctx, *shape)
    with closing(load_pair(str(target), str(draft), device=s.device, dtype=s.dtype, runtime="torch")) as pair:
        forced = ForcedAcceptance.on_pair(pair, s.rate, s.seed)
        try:
            yield pair
        finally:
            forced.remove()


def random_weight_folders(ctx: StageContext, label: str, target_size: str, draft_size: str):
    """The shape's folders, written once and kept for its other mode until the stage ends."""
    s = ctx.settings
    if label not in ctx.shared:
        folder = ctx.stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu-suite-"))
        ctx.log(f"{label}: writing random weights")
        ctx.shared[label] = synthetic.build(folder, target_size, draft_size, vocab=TINY_VOCAB if s.tiny else None,
                                            dtype=s.dtype, device=s.device)
    return ctx.shared[label]


def embedded_units(settings: Settings) -> list[Unit]:
    units = []
    for mode in MODES[:1] if settings.tiny else MODES:  # the synthetic stage rehearses both modes
        for pair_name, methods in (("embedded", HEAD_METHODS), ("embedded-lm", LM_METHODS)):
            cost = unit_cost(f"embedded {pair_name} {mode.name}", settings, len(unit_methods(methods, mode)), mode,
                             settings.prompts, 1 if settings.tiny else 2)
            run = partial(run_embedded_unit, pair_name=pair_name, methods=methods, mode=mode)
            units.append(Unit(f"{pair_name} {mode.name}", run, cost))
    return units


def run_embedded_unit(ctx: StageContext, pair_name: str, methods: list[str], mode: Mode) -> None:
    s = ctx.settings
    prompts = suite_prompts(s.prompts)
    decode = decode_params(ctx, chat=True, max_new_tokens=unit_tokens(s, mode))
    pair = load_pair(pair_name, device=s.device, dtype=s.dtype, runtime="torch")
    try:
        # The rehearsal's 135 M pair on a CPU: a warm-up would add a call of every method for nothing compiled.
        result = bench(ctx, pair, prompts, unit_methods(methods, mode), mode, decode, f"{pair_name}-{mode.name}",
                       warmup=not s.rehearsal)
        if pair_name == "embedded":
            ratio = overhead(ctx, pair, prompt_ids(pair, prompts[:1], True), mode, f"embedded-{mode.name}")
            row = headline("embedded (head)", mode, result, round_overhead=ratio)
            ctx.headline.append(row)
            ctx.note(_verdict(row, mode))
        else:
            # transformers' assisted generation runs a draft LM, never the head: its ratio is this pair's row.
            ctx.headline.append(headline("embedded-lm", mode, result))
    finally:
        pair.close()


def _verdict(row: dict, mode: Mode) -> str:
    """Is the 135 M target host-bound in this mode, and does SD win there?"""
    pct, sd = row["roofline_pct"], row["sd_vs_ar"]
    if math.isnan(sd):
        return f"- {mode.name}: SD did not run"
    bound = (f"AR reaches {pct:.1f} % of the memory-bandwidth bound, so it is "
             f"{'host-bound' if pct < 50 else 'near the memory bound'}" if not math.isnan(pct)
             else "no bandwidth is known for this device")
    return f"- **{mode.name}**: {bound}; SD runs at {sd:.2f}× AR ({'SD wins' if sd > 1 else 'SD loses'})."


def cuda_probe(ctx: StageContext) -> None:
    """What only a GPU can show, on a toy function before the real stages: CUDA events time a
    product, a CUDA graph replays one, and torch.compile captures one in reduce-overhead mode."""
    device = torch.device(ctx.settings.device)
    x = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    for _ in range(5):  # cuBLAS's handle, workspace and kernel choice come with the first calls, not the product
        y = x @ x
    torch.cuda.synchronize(device)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        y = x @ x
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    median = sorted(times)[len(times) // 2]
    ctx.note(f"- CUDA events: a 4096² bf16 product, after 5 warm-up calls, took {median:.3f} ms (median of 20, "
             f"{min(times):.3f}–{max(times):.3f}): {2 * 4096 ** 3 / median / 1e9:,.0f} TFLOP/s")
    x = x[:1024, :1024].contiguous()  # the graph and compile checks on a smaller product
    y = x @ x
    static_in = x.clone()
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize(device)
    with torch.cuda.graph(graph):
        static_out = static_in @ static_in
    static_in.copy_(x)
    graph.replay()
    torch.cuda.synchronize(device)
    ctx.note(f"- CUDA graph: replay equals eager: {bool(torch.allclose(static_out, y))}")
    compiled = torch.compile(lambda a: torch.nn.functional.gelu(a @ a), mode="reduce-overhead")
    for _ in range(3):  # graph trees record on the second or third call
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(x)
    ctx.note(f"- torch.compile reduce-overhead: output matches eager: "
             f"{bool(torch.allclose(out, torch.nn.functional.gelu(y), atol=1e-1, rtol=1e-2))}")
