"""Run several methods on one prompt, one after another, and tabulate them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pandas as pd

from ..engine.decoding import generate
from ..engine.params import DecodeParams
from .tables import rounds_frame, summary_frame, target_perplexity, tokens_frame
from ..engine.trace import GenerationResult


@dataclass
class Comparison:
    results: list[GenerationResult]
    summary: pd.DataFrame
    rounds: pd.DataFrame
    tokens: pd.DataFrame  # one row per drafted token (tables.TOKEN_COLUMNS)


def tabulate(pair, results: Sequence[GenerationResult]) -> Comparison:
    """Summary, per-round and per-token tables; sampled runs are scored by the target's perplexity."""
    sampled = [r for r in results if r.params.get("temperature", 0.0) > 0]
    perplexities = {r.method: target_perplexity(pair, r) for r in sampled}
    return Comparison(list(results), summary_frame(results, perplexities), rounds_frame(results), tokens_frame(results))


def run_comparison(pair, prompt, methods: Sequence[str], limits=None, decode: DecodeParams | None = None, *,
                   cache: str | None = None, compile: bool = False, **params) -> Comparison:
    """Each method in turn on the same prompt; decode (a DecodeParams), params and the engine
    options (cache, compile) as for `generate`."""
    decode = DecodeParams.resolve(decode, **params)
    results = [generate(pair, prompt, method=method, limits=limits, decode=decode, cache=cache, compile=compile)
               for method in methods]
    return tabulate(pair, results)
