"""The stages that measure speed: random-weight pairs of real shapes (with forced acceptance)
and the embedded pair, each compiled + static and eager + dynamic.

May import torch, pandas, ``engine``, ``models`` and the other bench modules.
"""

from __future__ import annotations

import math
import tempfile

import torch

from ...models.loading import load_pair
from .. import synthetic
from ..overhead import spread_over_categories
from ..suite import DEFAULT_SUITE, load_suite
from .forced import ForcedAcceptance
from .measure import bench, decode_params, headline, overhead, prompt_ids
from .stages import MODES, Mode, StageContext

# (label, target size, draft size) from `synthetic.SIZES`.
SHAPES = (("pythia-1.4b/70m", "1.4b", "70m"), ("qwen2.5-1.5b/0.5b", "qwen2.5-1.5b", "qwen2.5-0.5b"))
TINY_SHAPES = (("pythia-tiny", "tiny", "tiny"), ("qwen2.5-tiny", "qwen2.5-tiny", "qwen2.5-tiny"))
TINY_VOCAB = 512
SYNTHETIC_METHODS = ["ar", "sd", "hf-generate-static", "hf-assisted"]
HEAD_METHODS = ["ar", "sd", "egag", "nasd", "hf-generate", "hf-generate-static"]
LM_METHODS = ["ar", "sd", "hf-assisted"]


def suite_prompts(count: int):
    """`count` prompts of the benchmark's suite, one category after another."""
    return spread_over_categories(load_suite(DEFAULT_SUITE), count)


def run_synthetic(ctx: StageContext) -> None:
    s = ctx.settings
    ctx.note(f"Random weights with forced acceptance: both models follow one planted text, the draft at "
             f"{s.rate:.0%} of positions (seed {s.seed}), so SD's rounds accept as a trained draft's would.")
    for label, target_size, draft_size in (TINY_SHAPES if s.tiny else SHAPES):
        ctx.check_time(label)
        with tempfile.TemporaryDirectory(prefix="gpu-suite-") as folder:
            ctx.log(f"{label}: writing random weights")
            target, draft = synthetic.build(folder, target_size, draft_size, vocab=TINY_VOCAB if s.tiny else None,
                                            dtype=s.dtype, device=s.device)
            pair = load_pair(str(target), str(draft), device=s.device, dtype=s.dtype)
            try:
                _synthetic_pair(ctx, pair, label)
            finally:
                pair.close()


def _synthetic_pair(ctx: StageContext, pair, label: str) -> None:
    s = ctx.settings
    forced = ForcedAcceptance.on_pair(pair, s.rate, s.seed)  # every greedy method writes the planted text
    prompts = suite_prompts(1)
    decode = decode_params(ctx, chat=False, copy_n=0)  # copying from the context would hide the draft's rounds
    encoded = prompt_ids(pair, prompts, chat=False)
    stem = label.replace("/", "-")
    for mode in MODES:
        ctx.check_time(f"{label} {mode.name}")
        result = bench(ctx, pair, prompts, SYNTHETIC_METHODS, mode, decode, f"synthetic-{stem}-{mode.name}")
        ratio = overhead(ctx, pair, encoded, mode, f"synthetic-{stem}-{mode.name}")
        ctx.headline.append(headline(label, mode, result, round_overhead=ratio))
    forced.remove()


def run_embedded(ctx: StageContext) -> None:
    s = ctx.settings
    prompts = suite_prompts(s.prompts)
    decode = decode_params(ctx, chat=True)
    for mode in MODES[:1] if s.tiny else MODES:  # the synthetic stage rehearses both modes
        ctx.check_time(f"embedded {mode.name}")
        results = {}
        for pair_name, methods in (("embedded", HEAD_METHODS), ("embedded-lm", LM_METHODS)):
            pair = load_pair(pair_name, device=s.device, dtype=s.dtype)
            try:
                results[pair_name] = bench(ctx, pair, prompts, methods, mode, decode, f"{pair_name}-{mode.name}")
                if pair_name == "embedded":
                    ratio = overhead(ctx, pair, prompt_ids(pair, prompts[:1], True), mode, f"embedded-{mode.name}")
            finally:
                pair.close()
        # transformers' assisted generation runs a draft LM, never the head: its ratio is the LM pair's row.
        ctx.headline.append(headline("embedded (head)", mode, results["embedded"], round_overhead=ratio))
        ctx.headline.append(headline("embedded-lm", mode, results["embedded-lm"]))
        ctx.note(_verdict(ctx.headline[-2], mode))


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
    x = torch.randn(1024, 1024, device=device, dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    y = x @ x
    end.record()
    end.synchronize()
    ctx.note(f"- CUDA events: a 1024² bf16 product took {start.elapsed_time(end):.3f} ms")
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
