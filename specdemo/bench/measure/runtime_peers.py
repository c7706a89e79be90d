"""The target runtime's own decoders as benchmark peers, beside ours on the same exported target.

Our methods on a runtime target (runtime="onnx") drive its forwards from Python; the runtime also
decodes by itself. Its own loops are the fair yardstick for ours on the same weights, the same
session and the same thread count:

  onnx-generate  onnxruntime-genai's own search: `Generator.generate_next_token` to the end,
                 greedy or sampling with the run's temperature, top-k, top-p and seed;
  onnx-ngram     its own n-gram speculative decoding (prompt lookup): up to γ drafted tokens a
                 round, looked up by the last n−1 tokens (at least 2, the runtime's minimum).

The runtime stops at the pair's EOS ids (`OnnxTarget` sets them on its models), and the output is
cut at the first one as every runner's is. Its speculative statistics are totals per call, so a
row of onnx-ngram has rounds, drafted and accepted counts but no per-round histogram.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from ...engine.params import DecodeParams
from ...engine.tokens import cut_at_eos
from .runners import ONNX_NGRAM, RUNTIME_PEERS, Run, quiet_gc

# The runtime refuses an n-gram shorter than this.
RUNTIME_MIN_NGRAM = 2


def search_options(params: DecodeParams, max_length: int, seed: int, vocab_size: int) -> dict[str, Any]:
    """onnxruntime-genai's search options for the run's sampling settings (top_k 0 is ours for no filter)."""
    options: dict[str, Any] = {"max_length": max_length, "num_beams": 1, "min_length": 0, "repetition_penalty": 1.0}
    if params.sampling.greedy:
        return {**options, "do_sample": False}
    return {**options, "do_sample": True, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k or vocab_size, "random_seed": seed}


class RuntimeRunner:
    """Runs the runtime's own decoders on `pair.target_runtime`, fed exactly what ours are fed."""

    def __init__(self, pair, params: DecodeParams):
        if getattr(pair, "target_runtime", None) is None:
            raise ValueError(f"{', '.join(RUNTIME_PEERS)} run beside a target on another runtime; this pair's target "
                             "runs on torch")
        self.pair = pair
        self.params = params

    def run(self, method: str, prompt_ids: list[int], seed: int, max_new_tokens: int | None = None) -> Run:
        import onnxruntime_genai as og

        budget = max_new_tokens or self.params.max_new_tokens
        model = self.pair.target_runtime.model(torch.get_num_threads())
        settings = og.GeneratorParams(model)
        vocab = self.pair.vocab_size or self.pair.target.config.vocab_size
        settings.set_search_options(**search_options(self.params, len(prompt_ids) + budget, seed, vocab))
        if method == ONNX_NGRAM:
            settings.set_speculative_options(ngram_size=max(RUNTIME_MIN_NGRAM, self.params.ngram_n - 1),
                                             max_draft_tokens=self.params.gamma)
        with quiet_gc():
            start = time.perf_counter()
            generator = og.Generator(model, settings)
            generator.append_tokens(np.asarray([prompt_ids], dtype=np.int32))
            while not generator.is_done():
                generator.generate_next_token()
            seconds = time.perf_counter() - start
        new_ids = [int(t) for t in generator.get_sequence(0)[len(prompt_ids):]]
        # The runtime's search ends at an EOS id without writing it into the sequence; our runs keep it as
        # their last token, and so do these.
        last = int(generator.get_next_tokens()[0])
        if len(new_ids) < budget and last in self.pair.eos_ids and (not new_ids or new_ids[-1] != last):
            new_ids.append(last)
        new_ids = cut_at_eos(new_ids[:budget], self.pair.eos_ids)
        speculative = generator.get_speculative_stats() if method == ONNX_NGRAM else None
        stats, rounds = _stats(new_ids, speculative, self.params.gamma if speculative else 0)
        stats["runtime"] = f"{self.pair.runtime} {self.pair.target_runtime.precision}"
        stats["stop_reason"] = "eos" if new_ids and new_ids[-1] in self.pair.eos_ids else "max_new_tokens"
        return Run(new_ids, seconds, stats, rounds)


def _stats(new_ids: list[int], speculative: dict | None, gamma: int) -> tuple[dict[str, Any], list]:
    """A row's round statistics: one step a token for the runtime's plain loop; the runtime's own
    totals for its speculative loop (its plain steps between rounds count as rounds of no draft)."""
    blank = dict(engine_seconds=math.nan, ttft_s=math.nan, prefill_s=math.nan, draft_seconds=math.nan,
                 verify_seconds=math.nan, mean_entropy=math.nan, cache="runtime", compile_seconds=math.nan,
                 draft_forwards=0)
    n = len(new_ids)
    if speculative is None:
        rounds = [(0, 0)] * n
        return {**blank, "new_tokens": n, "rounds": n, "drafted": 0, "accepted": 0, "acceptance_rate": math.nan,
                "mean_accepted_tokens": 1.0 if n else math.nan, "target_forwards": n,
                "target_forwards_per_token": 1.0 if n else math.nan, "mean_gamma": 0.0, "mean_drafted": 0.0}, rounds
    drafted, accepted = int(speculative["draft_tokens_proposed"]), int(speculative["draft_tokens_accepted"])
    count = int(speculative["completed_rounds"]) + int(speculative["standard_fallback_steps"])
    forwards = sum(int(speculative[k]) for k in ("target_verify_forward_passes", "target_reanchor_forward_passes",
                                                  "target_reconciliation_forward_passes", "standard_fallback_steps"))
    rejected = int(speculative["partial_accept_rounds"]) + int(speculative["zero_accept_rounds"])
    stats = {**blank, "new_tokens": n, "rounds": count, "drafted": drafted, "accepted": accepted,
             "acceptance_rate": accepted / drafted if drafted else math.nan,
             "mean_accepted_tokens": n / count if count else math.nan, "target_forwards": forwards,
             "target_forwards_per_token": forwards / n if n else math.nan, "mean_gamma": float(gamma),
             "mean_drafted": drafted / count if count else math.nan, "rejected_rounds": rejected}
    return stats, []
