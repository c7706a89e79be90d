"""Run several methods on one prompt, one after another, and tabulate them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd
import torch

from ...models.torch_copy import generate, needs_torch_copy_ar, torch_copy_ar
from ...engine.params import DecodeParams
from .runners import quiet_gc
from .tables import rounds_frame, summary_frame, target_perplexity, tokens_frame
from ...engine.trace import GenerationResult
from .vs_float32 import Float32Reference, reference_for
from ...engine.methods import REFERENCE


@dataclass
class Comparison:
    results: list[GenerationResult]
    summary: pd.DataFrame
    rounds: pd.DataFrame
    tokens: pd.DataFrame  # one row per drafted token (tables.TOKEN_COLUMNS)
    # AR on the target's weights at float32, where a model ran below float32 (the rows' vs-fp32 columns);
    # the run's own AR when its target is float32, else a run that no row's time counts.
    float32_ar: GenerationResult | None = None


def tabulate(pair, results: Sequence[GenerationResult], float32_ar: GenerationResult | None = None) -> Comparison:
    """Summary (with the pair's precisions, and against `float32_ar` when given), per-round and
    per-token tables; sampled runs are scored by the target's perplexity."""
    sampled = [r for r in results if r.params.get("temperature", 0.0) > 0]
    perplexities = {r.method: target_perplexity(pair, r) for r in sampled}
    return Comparison(list(results), summary_frame(results, perplexities, pair, float32_ar), rounds_frame(results),
                      tokens_frame(results), float32_ar)


def run_comparison(pair, prompt, methods: Sequence[str], limits=None, decode: DecodeParams | None = None, *,
                   cache: str | None = None, compile: bool = False,
                   threads_for: Callable[[str], int] | None = None,
                   vs_float32: Float32Reference | None = None, **params) -> Comparison:
    """Each method in turn on the same prompt (a method the target's runtime cannot run on its torch copy,
    with AR on that copy timed after them as their reference: `models.torch_copy`); decode (a DecodeParams), params and the engine
    options (cache, compile) as for `generate`; threads_for(method), when given, sets torch's
    threads for each method's decode. With `vs_float32`, where either model runs below float32,
    every row is also set against float32 AR on the same prompt (`bench.vs_float32`): the run's own
    AR when the target is float32, else a run of `vs_float32` after the methods, timed in no row."""
    decode = DecodeParams.resolve(decode, **params)
    results, before = [], torch.get_num_threads()
    try:
        for method in methods:
            if threads_for is not None:
                torch.set_num_threads(threads_for(method))
            with quiet_gc():
                results.append(generate(pair, prompt, method=method, limits=limits, decode=decode, cache=cache,
                                        compile=compile))
        if needs_torch_copy_ar(results):  # the reference of the methods that ran on the torch copy
            if threads_for is not None:
                torch.set_num_threads(threads_for(REFERENCE))
            with quiet_gc():
                results.append(torch_copy_ar(pair, prompt, decode, limits, cache=cache))
    finally:
        torch.set_num_threads(before)
    float32_ar = reference_for(pair, results, decode, vs_float32, cache=cache) if vs_float32 is not None else None
    return tabulate(pair, results, float32_ar)
