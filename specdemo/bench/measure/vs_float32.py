"""Each run against float32 AR, where a model runs below float32.

A target loaded in bfloat16, float16, int8 or int4 is another model than the float32 one: greedy SD
with an int8 target equals AR with that int8 target, not AR with the float32 target. So a table
where either model runs below float32 gives each row, beside its speed over AR at its own
precision, its speed over AR of the same target weights at float32 on the same prompt, and how far
its output is from that run's:

  speedup_vs_fp32_ar    float32 AR's seconds per new token ÷ the row's (each call timed alike)
  token_match_vs_fp32   the share of positions that hold float32 AR's token, over the longer of the
                        two outputs (1.0: the same tokens; two outputs that part at the first token and
                        meet again by chance still score the positions where they meet)
  prefix_match_vs_fp32  the tokens before the first position where the two differ ÷ the longer
                        output's length (1.0: the same tokens; it never credits a late chance meeting)
  chrf_vs_fp32, bleu_vs_fp32  sacrebleu's sentence chrF and BLEU of the row's text with float32 AR's
                        text as the reference, 0–100

The reference run: where the target is already float32 (a draft below float32), the run's own AR is
the reference and costs nothing more. Otherwise the target's weights are loaded again at float32
beside the pair (`Float32Reference`, one float32 target held at a time) and AR runs on them after
the row's methods; that run is counted in no row's time, and its seconds are reported apart.

May import torch, pandas, sacrebleu, ``specdemo.engine`` and ``specdemo.models``; never gradio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ...engine.decoding import generate
from ...engine.params import DecodeParams
from ...engine.trace import GenerationResult
from ...models.loading import EMBEDDED, ModelPair, load_model
from ...models.precision import resolve_precision
from .runners import quiet_gc
from ...engine.methods import REFERENCE

FLOAT32 = "float32"
VS_FLOAT32_COLUMNS = ["speedup_vs_fp32_ar", "token_match_vs_fp32", "prefix_match_vs_fp32", "chrf_vs_fp32",
                      "bleu_vs_fp32"]
AGREEMENT_COLUMNS = VS_FLOAT32_COLUMNS[1:]
_BELOW_FLOAT32 = (torch.bfloat16, torch.float16)


def below_float32(precision) -> bool:
    """Whether a `Precision` computes with less than float32: a quantized one, bfloat16 or float16
    (float64, a test's precision, is above it; None, a precision not recorded, is not below)."""
    return precision is not None and (precision.quantized or precision.float_dtype in _BELOW_FLOAT32)


def runs_below_float32(pair) -> bool:
    """Whether either model of the pair runs below float32, so its rows owe a float32 AR reference."""
    return below_float32(getattr(pair, "target_precision", None)) or below_float32(getattr(pair, "draft_precision", None))


def target_is_float32(pair) -> bool:
    precision = getattr(pair, "target_precision", None)
    return precision is not None and precision.name == FLOAT32 and not precision.quantized


def token_match(ids: Sequence[int], reference: Sequence[int]) -> float:
    """The share of positions where two outputs hold the same token, over the longer one."""
    longest = max(len(ids), len(reference))
    return sum(a == b for a, b in zip(ids, reference)) / longest if longest else 1.0


def prefix_match(ids: Sequence[int], reference: Sequence[int]) -> float:
    """The tokens before the first position where two outputs differ, over the longer one."""
    longest = max(len(ids), len(reference))
    if not longest:
        return 1.0
    same = next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b), min(len(ids), len(reference)))
    return same / longest


def agreement(ids: Sequence[int], text: str, reference_ids: Sequence[int], reference_text: str) -> dict[str, float]:
    """An output's token match, prefix match, chrF and BLEU against the float32 AR output."""
    import sacrebleu

    return {"token_match_vs_fp32": token_match(ids, reference_ids),
            "prefix_match_vs_fp32": prefix_match(ids, reference_ids),
            "chrf_vs_fp32": sacrebleu.sentence_chrf(text, [reference_text]).score,
            "bleu_vs_fp32": sacrebleu.sentence_bleu(text, [reference_text]).score}


def vs_float32(result: GenerationResult, reference: GenerationResult | None) -> dict[str, float]:
    """The VS_FLOAT32_COLUMNS of one run against the float32 AR run (NaN each without one)."""
    if reference is None:
        return {name: math.nan for name in VS_FLOAT32_COLUMNS}
    speed, reference_speed = result.stats.get("tokens_per_s"), reference.stats.get("tokens_per_s")
    return {"speedup_vs_fp32_ar": speed / reference_speed if speed and reference_speed else math.nan,
            **agreement(result.token_ids, result.text, reference.token_ids, reference.text)}


def load_float32_target(pair: ModelPair) -> ModelPair:
    """The pair's target alone, its weights loaded again at float32 (no draft): float32 AR's model."""
    device = str(pair.device)
    if pair.target_ref == EMBEDDED:
        from ...models.embedded import load_embedded_target

        model, tokenizer = load_embedded_target(device=device, dtype=torch.float32)
    else:
        model, tokenizer = load_model(pair.target_ref, device, torch.float32), pair.tokenizer
    return ModelPair(model, tokenizer, name=f"{pair.target_ref} (float32)", target_ref=pair.target_ref,
                     vocab_size=pair.vocab_size, target_precision=resolve_precision(FLOAT32, device))


@dataclass
class Float32Reference:
    """float32 AR runs for pairs that run below float32. A pair whose target is float32 is its own
    reference model; any other gets its target's weights loaded at float32 once and kept (one at a
    time, so that a second target's reference frees the first's memory). `seconds` adds up the
    reference runs' wall time, which no row counts."""

    loader: Callable[[ModelPair], ModelPair] = load_float32_target
    seconds: float = 0.0
    runs: int = 0
    _held: tuple[tuple, ModelPair] | None = field(default=None, repr=False)

    def model_for(self, pair: ModelPair) -> ModelPair:
        if target_is_float32(pair):
            return pair
        key = (pair.target_ref, str(pair.device))
        if self._held is None or self._held[0] != key:
            if self._held is not None:
                self._held[1].close()
            self._held = (key, self.loader(pair))
        return self._held[1]

    def loaded_beside(self, pair: ModelPair) -> bool:
        """Whether `pair`'s reference is a second copy of the target (not the pair itself)."""
        return not target_is_float32(pair)

    def run(self, pair: ModelPair, prompt_ids: Sequence[int], decode: DecodeParams, *,
            cache: str | None = None) -> GenerationResult:
        """AR on the float32 target over the same prompt ids with the same decoding parameters."""
        with quiet_gc():
            result = generate(self.model_for(pair), list(prompt_ids), method=REFERENCE, decode=decode, cache=cache)
        self.seconds += result.seconds
        self.runs += 1
        return result

    def close(self) -> None:
        if self._held is not None:
            self._held[1].close()
            self._held = None


def reference_for(pair: ModelPair, results: Sequence[GenerationResult], decode: DecodeParams,
                  reference: Float32Reference, *, cache: str | None = None) -> GenerationResult | None:
    """The float32 AR run that `results` (one prompt's) are compared with: the run's own AR where
    the target is float32, else a run of `reference`; None when no model runs below float32."""
    if not results or not runs_below_float32(pair):
        return None
    own = next((r for r in results if r.method == REFERENCE), None)
    if own is not None and target_is_float32(pair):
        return own
    seed = results[0].params.get("seed")  # a sampled reference draws as the rows drew
    return reference.run(pair, results[0].prompt_ids, decode.replace(seed=seed) if seed is not None else decode,
                         cache=cache)
