"""The torch copy of a runtime pair: where a method and a pair are matched up, a method the target's runtime
cannot run runs on the torch weights the pair keeps, and its trace says so.

A pair whose target runs on ONNX Runtime (`ModelPair.target_runtime`) keeps the same weights in torch
(`ModelPair.target`: a feature head reads them). The runtime verifies a chain of drafts in one forward;
it cannot verify a tree (no attention mask over a list of positions), run transformers' beam search or
AR without a cache (torch's own loops), compress its cache with a KV policy, capture a graph, or hand a
head the intermediate layers' states. Rather than refuse such a method, `iter_generate` runs it on
`on_torch(pair)`: its result's `runtime` reads TORCH_COPY and `runtime_reason` says why, and a
comparison sets its speed against the torch copy's AR (`TORCH_COPY_AR`), never the runtime's.

The decode loop (`engine.decoding`) never falls back by itself: asked directly, it still refuses.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

from ..engine.batch import generate_batch as engine_generate_batch
from ..engine.decoding import iter_generate as engine_iter_generate
from ..engine.methods import FIXED_GAMMA, REFERENCE
from ..engine.params import DecodeParams
from ..engine.trace import GenerationResult
from ..engine.runtimes import TORCH, runtime_reason
from .precision import resolve_precision

TORCH_COPY = "torch copy"  # a result's `runtime` where it ran on the torch copy of a runtime target
# The torch copy's AR as a comparison's reference row, beside a method that ran on the torch copy (the
# benchmark's peer of the same name: AR on the torch copy).
TORCH_COPY_AR = "torch-ar"
TORCH_COPY_AR_REASON = "the torch copy's AR: the reference of the methods that run on the torch copy"


def on_torch(pair):
    """The same pair with every forward on torch: the torch weights a runtime pair keeps in `target`, its
    draft on torch too, at the precision those weights have."""
    if pair.target_runtime is None:
        return pair
    return dataclasses.replace(pair, runtime=TORCH, target_runtime=None, draft_runtime=None,
                               target_precision=resolve_precision(pair.target.dtype, pair.device),
                               runtime_reason=f"the {TORCH_COPY} of a target that runs on {pair.runtime}")


def pair_for(pair, method: str, params: DecodeParams, compile: bool = False, batch: bool = False):
    """(the pair `method` runs on, why it is the torch copy or ""): the pair itself where its runtime runs
    the method, else `on_torch(pair)`."""
    why = runtime_reason(pair, method, params, batch=2 if batch else 1, compile=compile)
    return (on_torch(pair), f"on the torch copy of the target: {why}") if why else (pair, "")


def iter_generate(pair, prompt: str | Sequence[int], method: str = FIXED_GAMMA, limits=None,
                  decode: DecodeParams | None = None, *, cache: str | None = None, compile: bool = False,
                  **params) -> Iterator[GenerationResult]:
    """`engine.decoding.iter_generate` on the pair the method runs on (`pair_for`); each result's
    `runtime_reason` says where it ran and why, `runtime` TORCH_COPY where that was the torch copy. Bad
    input raises here, before the first round, as the loop's own does."""
    decode_params = DecodeParams.resolve(decode, **params)
    runs_on, why = pair_for(pair, method, decode_params, compile)
    rounds = engine_iter_generate(runs_on, prompt, method, limits, decode_params, cache=cache, compile=compile)
    return _labelled(rounds, TORCH_COPY if why else None, why or getattr(pair, "runtime_reason", ""))


def _labelled(rounds: Iterator[GenerationResult], runtime: str | None, reason: str) -> Iterator[GenerationResult]:
    try:
        for result in rounds:
            if runtime is not None:
                result.runtime = runtime
            result.runtime_reason = reason
            yield result
    finally:
        rounds.close()


def generate(pair, prompt: str | Sequence[int], method: str = FIXED_GAMMA, limits=None,
             decode: DecodeParams | None = None, *, cache: str | None = None, compile: bool = False,
             **params) -> GenerationResult:
    """Decode to the end on the pair the method runs on (`iter_generate`) and return the full trace."""
    result = None
    for result in iter_generate(pair, prompt, method, limits, decode, cache=cache, compile=compile, **params):
        pass
    assert result is not None
    return result


def generate_batch(pair, prompts: Sequence[str | Sequence[int]], method: str = FIXED_GAMMA, limits=None,
                   decode: DecodeParams | None = None, **params) -> list[GenerationResult]:
    """`engine.batch.generate_batch` on the pair the batch runs on: one prompt as `generate` runs it; several
    on the torch copy where the target's runtime cannot decode them together (or cannot run the method), each
    row labelled as `iter_generate` labels a result."""
    decode_params = DecodeParams.resolve(decode, **params)
    prompts = list(prompts)
    if len(prompts) == 1:
        return [generate(pair, prompts[0], method, limits, decode_params)]
    runs_on, why = pair_for(pair, method, decode_params, batch=True)
    results = engine_generate_batch(runs_on, prompts, method, limits, decode_params)
    for result in results:
        if why:
            result.runtime = TORCH_COPY
        result.runtime_reason = why or getattr(pair, "runtime_reason", "")
    return results


def torch_copy_ar(pair, prompt, decode: DecodeParams, limits=None, *, cache: str | None = None) -> GenerationResult:
    """AR on the torch copy of a runtime target: the reference row of the methods that ran there."""
    result = generate(on_torch(pair), prompt, REFERENCE, limits, decode, cache=cache)
    result.method, result.runtime = TORCH_COPY_AR, TORCH_COPY
    result.runtime_reason = TORCH_COPY_AR_REASON
    return result


def needs_torch_copy_ar(results: Sequence[GenerationResult]) -> bool:
    """Whether a comparison of these results needs the torch copy's AR: one of them ran on the torch copy and
    no row is that AR yet."""
    return any(r.runtime == TORCH_COPY for r in results) and not any(r.method == TORCH_COPY_AR for r in results)
