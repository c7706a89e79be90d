"""Where an output leaves the reference's (AR's), and how close the reference's own choice was there.

`first_divergence` is the index of the first new token that differs from the reference's, None where the
two outputs are equal. `divergence_margin` is the reference target's top-1 minus top-2 logit at that index,
from the margins its run recorded (`GenerationResult.top2_margins`, one topk(2) per token on the logits the
run computed anyway). A margin under NEAR_TIE_MARGIN is a near-tie: the two best tokens were so close that a
verification forward computing its rows in another order (a quantized kernel, a batched product, bfloat16)
can pick the other one, which is what "up to near-ties" promises (`models.precision`); a larger margin at a
divergence points at a fault rather than at rounding.

Pure functions of token ids and floats: the benchmark, the comparison table and the page all read them.
"""

from __future__ import annotations

import math
from typing import Sequence

# Logits, not probabilities: a top-1 ahead of the top-2 by less than this is a near-tie. Half a logit is
# e^0.5 ≈ 1.65 times as likely, far beyond what rounding moves (float32 rows differ by ~1e-5 logits,
# bfloat16 rows by ~0.01–0.1 on a 100-wide logit range), yet small enough that an ordinary confident
# choice (margins of several logits) never counts as one.
NEAR_TIE_MARGIN = 0.5


def first_divergence(tokens: Sequence[int], reference: Sequence[int]) -> int | None:
    """The index of the first new token that differs from the reference's; where one output is the other's
    prefix, the length of the shorter (one ran on, the other stopped); None where they are equal."""
    for index, (mine, theirs) in enumerate(zip(tokens, reference)):
        if mine != theirs:
            return index
    if len(tokens) != len(reference):
        return min(len(tokens), len(reference))
    return None


def margin_at(margins: Sequence[float], index: int | None) -> float:
    """The reference's top-1 minus top-2 logit at `index`; NaN where there is no divergence or no margin."""
    if index is None or index >= len(margins):
        return math.nan
    return float(margins[index])


def divergence(tokens: Sequence[int], reference: Sequence[int], margins: Sequence[float]) -> tuple[int | None, float]:
    """(first_divergence, divergence_margin) of an output against the reference's tokens and margins."""
    index = first_divergence(tokens, reference)
    return index, margin_at(margins, index)


def divergence_where_compared(matches: bool | None, tokens: Sequence[int], reference: Sequence[int],
                              margins: Sequence[float]) -> tuple[int | None, float]:
    """`divergence` for a row compared with the reference and found to differ (matches False); (None, NaN)
    where it matched (a capped run that is AR's prefix included) or was not compared."""
    if matches is None or bool(matches):  # NaN (not compared, in a frame) is truthy too
        return None, math.nan
    return divergence(tokens, reference, margins)


DIVERGENCE_COLUMNS = ("first_divergence", "divergence_margin")


def is_near_tie(margin: float) -> bool:
    """Whether a reference margin is a near-tie (under NEAR_TIE_MARGIN); False for NaN (no margin known)."""
    return not math.isnan(margin) and margin < NEAR_TIE_MARGIN


def describe_margin(margin: float) -> str:
    """How a divergence reads to a person: "near-tie (margin 0.12)", "not a near-tie (margin 3.4)", or
    "margin unknown" where the reference recorded none."""
    if margin is None or math.isnan(margin):
        return "margin unknown"
    return f"{'near-tie' if is_near_tie(margin) else 'not a near-tie'} (margin {margin:.3g})"
