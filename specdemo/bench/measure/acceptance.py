"""Why drafts were kept: acceptance against the drafter's entropy and the draft position, and
the break-even a drafting method must reach to beat AR. Pure functions of a per-token frame
(`tables.tokens_frame`, `tables.TOKEN_COLUMNS`) and of measured costs.

Which tokens count:
  entropy     drafts the target ruled on (`decided`: up to the round's first rejection) that
              came with a q (not a point mass: an n-gram or copied draft has no entropy of
              its own). A draft after a rejection was never judged, so its label says
              nothing about its entropy.
  position    every drafted token: acceptance at position i is the share of rounds that
              drafted at least i tokens whose i-th draft was kept (what serving engines
              report per draft position); it falls with i because a draft is kept only if
              every draft before it was.

Definitions:
  AUC         the area under the ROC curve of −entropy as a score for "this draft is kept":
              the probability that a kept draft had a lower entropy than a refused one (ties
              count half), from the Mann–Whitney U statistic. 0.5: entropy ranks nothing;
              1: every kept draft was more confident than every refused one. EGAG's premise
              is an AUC well above 0.5.
  band        Wilson score interval of a bin's acceptance rate (95 %).
  break-even  a round costs γc + v AR steps (c: drafting time per drafted token, v:
              verification time per round, both ÷ one AR step, measured in the same run) and
              yields `obtained` tokens; the method beats AR when obtained > γc + v, the tokens
              per round it needs. Predicted speedup against Leviathan's α:
              (1 − α^(γ+1)) / ((1 − α)(γc + v)).

May import pandas and scipy (scipy.stats inside the two functions that test with it: it takes about a
second to import, and every process that imports the benchmark, a cluster's workers included, would
pay it); never gradio or plotly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from ...engine.methods import REFERENCE

ENTROPY_BIN_COLUMNS = ["method", "entropy_low", "entropy_high", "entropy_mid", "count", "accepted", "rate",
                       "rate_low", "rate_high"]
POSITION_COLUMNS = ["method", "position", "drafted", "accepted", "rate"]
CONFIDENCE = 0.95


def judged_with_entropy(tokens: pd.DataFrame) -> pd.DataFrame:
    """The drafts the entropy statistics read (see the module's notes)."""
    if tokens.empty:
        return tokens
    keep = tokens.decided.astype(bool) & ~tokens.point_mass.astype(bool) & tokens.entropy.notna()
    return tokens[keep]


def wilson_interval(accepted: int, count: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    if count == 0:
        return math.nan, math.nan
    from scipy.stats import binomtest

    interval = binomtest(int(accepted), int(count)).proportion_ci(confidence_level=confidence, method="wilson")
    return float(interval.low), float(interval.high)


def entropy_bins(tokens: pd.DataFrame, bins: int = 10) -> pd.DataFrame:
    """Acceptance rate, count and Wilson band per method and bin of normalised entropy
    (`bins` equal bins over [0, 1]); empty bins are left out."""
    judged = judged_with_entropy(tokens)
    rows = []
    width = 1.0 / bins
    for method, part in judged.groupby("method", sort=False):
        index = (part.entropy.clip(0.0, 1.0) / width).astype(int).clip(upper=bins - 1)
        for b, cell in part.groupby(index):
            count, kept = len(cell), int(cell.accepted.astype(bool).sum())
            low, high = wilson_interval(kept, count)
            rows.append({"method": method, "entropy_low": b * width, "entropy_high": (b + 1) * width,
                         "entropy_mid": (b + 0.5) * width, "count": count, "accepted": kept,
                         "rate": kept / count, "rate_low": low, "rate_high": high})
    return pd.DataFrame(rows, columns=ENTROPY_BIN_COLUMNS)


def entropy_auc(tokens: pd.DataFrame) -> tuple[float, int]:
    """(AUC of −entropy as a predictor of acceptance, the number of drafts it rests on);
    NaN when the drafts are all kept or all refused."""
    judged = judged_with_entropy(tokens)
    kept = judged.accepted.astype(bool)
    positive, negative = -judged.entropy[kept], -judged.entropy[~kept]
    if positive.empty or negative.empty:
        return math.nan, len(judged)
    from scipy.stats import mannwhitneyu

    u = mannwhitneyu(positive, negative, alternative="two-sided").statistic
    return float(u) / (len(positive) * len(negative)), len(judged)


def describe_auc(auc: float, n: int) -> str:
    """The AUC as a sentence's clause, e.g. 'entropy ranks acceptances with AUC 0.71 (n = 2,310)'."""
    if n == 0:
        return "no draft with an entropy was judged"
    if math.isnan(auc):
        return f"entropy cannot rank acceptances: the {n:,} judged drafts were all kept, or all refused"
    return f"entropy ranks acceptances with AUC {auc:.2f} (n = {n:,})"


def position_acceptance(tokens: pd.DataFrame) -> pd.DataFrame:
    """Per method and draft position (1 … the longest draft): rounds that drafted that far,
    how many of them kept that draft, and the share."""
    if tokens.empty:
        return pd.DataFrame(columns=POSITION_COLUMNS)
    grouped = tokens.assign(accepted=tokens.accepted.astype(bool)).groupby(["method", "position"], sort=False)
    frame = grouped.accepted.agg(drafted="size", accepted="sum").reset_index()
    frame["rate"] = frame.accepted / frame.drafted
    return frame.sort_values(["method", "position"], kind="stable", key=_first_seen(tokens))[POSITION_COLUMNS]


def _first_seen(tokens: pd.DataFrame):
    order = {m: i for i, m in enumerate(dict.fromkeys(tokens.method))}
    return lambda column: column.map(order) if column.name == "method" else column


# ---------------------------------------------------------------------------------------
# Break-even


def expected_tokens(alpha: float, gamma: float) -> float:
    """Tokens a round yields when each draft is kept with probability α independently: (1 − α^(γ+1)) / (1 − α)."""
    return gamma + 1 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


@dataclass(frozen=True)
class BreakEven:
    """A drafting method's round economics, in units of one AR step (see the module's notes)."""

    draft_cost: float  # c: drafting time per drafted token
    verify_cost: float  # v: verification time per round
    gamma: float  # drafted tokens per round (the mean)
    obtained: float  # tokens per round it got
    alpha: float  # Leviathan's α: accepted / (accepted + rounds that ended in a rejection)

    @property
    def needed(self) -> float:
        """Tokens per round needed to match AR: the round's cost in AR steps."""
        return self.gamma * self.draft_cost + self.verify_cost

    @property
    def alpha_needed(self) -> float:
        """The α at which the predicted speedup reaches 1 (NaN if even α = 1 falls short)."""
        if self.needed <= 1.0:  # a round yields one token even when every draft is refused
            return 0.0
        if expected_tokens(1.0, self.gamma) <= self.needed:
            return math.nan
        low, high = 0.0, 1.0
        for _ in range(40):  # bisection: the expected tokens grow with α
            mid = (low + high) / 2
            low, high = (mid, high) if expected_tokens(mid, self.gamma) < self.needed else (low, mid)
        return (low + high) / 2

    def predicted_speedup(self, alpha: float | None = None) -> float:
        a = self.alpha if alpha is None else alpha
        return expected_tokens(a, self.gamma) / self.needed if self.needed > 0 else math.nan

    @classmethod
    def measure(cls, *, draft_seconds: float, verify_seconds: float, rounds: int, drafted: int, new_tokens: int,
                alpha: float, ar_step_seconds: float) -> "BreakEven | None":
        """From one method's timed phases and AR's seconds per step; None when it cannot be priced."""
        if not rounds or not drafted or not ar_step_seconds or not all(
                math.isfinite(x) for x in (draft_seconds, verify_seconds, ar_step_seconds)):
            return None
        return cls(draft_cost=draft_seconds / drafted / ar_step_seconds,
                   verify_cost=verify_seconds / rounds / ar_step_seconds,
                   gamma=drafted / rounds, obtained=new_tokens / rounds, alpha=alpha)

    def sentence(self) -> str:
        """e.g. 'break-even: a round costs 4.0 × 0.20 (drafting, c) + 1.20 (verification, v) = 2.00
        AR steps, so it needs 2.00 tokens per round (α ≥ 0.52) to match AR; it got 2.50'."""
        alpha = self.alpha_needed
        reach = (" (more than γ̄ + 1: no α reaches it)" if alpha != alpha else
                 " (at any α: a round costs less than an AR step)" if alpha == 0.0 else f" (α ≥ {alpha:.2f})")
        return (f"break-even: a round costs {self.gamma:.1f} × {self.draft_cost:.2f} (drafting, c) + "
                f"{self.verify_cost:.2f} (verification, v) = {self.needed:.2f} AR steps, so it needs "
                f"{self.needed:.2f} tokens per round{reach} to match AR; it got {self.obtained:.2f}")


def comparison_break_evens(summary: pd.DataFrame) -> dict[str, tuple[BreakEven, float]]:
    """From a one-prompt comparison's summary (`tables.summary_frame`): each drafting method's
    break-even, its phases priced in AR's steps from the same run, and its measured speedup;
    empty without an AR run to price them by."""
    ar = summary[summary.method == REFERENCE]
    if ar.empty or not ar.iloc[0]["rounds"]:
        return {}
    ar_step = ar.iloc[0]["verify_seconds"] / ar.iloc[0]["rounds"]
    out = {}
    for _, row in summary.iterrows():
        if row["method"] == REFERENCE or not row["rounds"] or pd.isna(row["mean_drafted"]):
            continue
        even = BreakEven.measure(
            draft_seconds=row["draft_seconds"], verify_seconds=row["verify_seconds"], rounds=int(row["rounds"]),
            drafted=round(row["mean_drafted"] * row["rounds"]), new_tokens=int(row["new_tokens"]),
            alpha=row["alpha"], ar_step_seconds=ar_step)
        if even is not None:
            out[row["method"]] = (even, row["speedup_vs_ar"])
    return out
