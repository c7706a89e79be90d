"""Run several methods on one prompt, one after another, and tabulate them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import pandas as pd
import torch

from ..engine.decoding import generate
from ..engine.params import DecodeParams
from .runners import quiet_gc
from .tables import rounds_frame, summary_frame, target_perplexity, tokens_frame
from ..engine.trace import GenerationResult


@dataclass
class Comparison:
    results: list[GenerationResult]
    summary: pd.DataFrame
    rounds: pd.DataFrame
    tokens: pd.DataFrame  # one row per drafted token (tables.TOKEN_COLUMNS)


def tabulate(pair, results: Sequence[GenerationResult]) -> Comparison:
    """Summary (with the pair's precisions), per-round and per-token tables; sampled runs are scored by the
    target's perplexity."""
    sampled = [r for r in results if r.params.get("temperature", 0.0) > 0]
    perplexities = {r.method: target_perplexity(pair, r) for r in sampled}
    return Comparison(list(results), summary_frame(results, perplexities, pair), rounds_frame(results), tokens_frame(results))


def run_comparison(pair, prompt, methods: Sequence[str], limits=None, decode: DecodeParams | None = None, *,
                   cache: str | None = None, compile: bool = False,
                   threads_for: Callable[[str], int] | None = None, **params) -> Comparison:
    """Each method in turn on the same prompt; decode (a DecodeParams), params and the engine
    options (cache, compile) as for `generate`; threads_for(method), when given, sets torch's
    threads for each method's decode."""
    decode = DecodeParams.resolve(decode, **params)
    results, before = [], torch.get_num_threads()
    try:
        for method in methods:
            if threads_for is not None:
                torch.set_num_threads(threads_for(method))
            with quiet_gc():
                results.append(generate(pair, prompt, method=method, limits=limits, decode=decode, cache=cache,
                                        compile=compile))
    finally:
        torch.set_num_threads(before)
    return tabulate(pair, results)
