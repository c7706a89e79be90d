"""Does an adaptive draft length beat the best fixed γ? Per category and overall, with a
bootstrap confidence interval over prompts.

Each prompt's speedup over AR is the geometric mean over its repeats. Per category (and over
all prompts) the table names the best fixed γ (SD, the setting with the highest geometric-mean
speedup there, so an oracle tuned per category), the best adaptive setting there, and the
adaptive setting tuned once on all prompts. Each comparison is the geometric mean over the
category's prompts of the paired ratio adaptive / fixed, with a percentile bootstrap interval
(scipy.stats.bootstrap) over those prompts: "beats" when the interval lies above 1, "loses"
when below, "ties" otherwise. Both settings are picked on the same prompts they are judged on,
which favours each of them alike; with few prompts the interval is wide (none under MIN_PROMPTS).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..measure.statistics import geomean
from .grid import ADAPTIVE_METHODS
from ...engine.methods import FIXED_GAMMA, REFERENCE

OVERALL = "all"
CONFIDENCE = 0.95
# Resampling two prompts only ever gives their two ratios and their mean: no interval below three.
MIN_PROMPTS = 3
VERDICT_COLUMNS = ["category", "prompts", "fixed", "fixed_speedup", "adaptive", "adaptive_speedup", "ratio",
                   "ratio_low", "ratio_high", "outcome", "tuned_once", "tuned_once_speedup", "tuned_once_ratio",
                   "tuned_once_low", "tuned_once_high", "tuned_once_outcome"]


def prompt_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """[(category, prompt_id)] × setting: each prompt's speedup over AR, geometric mean over repeats."""
    ok = rows[rows.speedup_vs_ar.notna() & (rows.speedup_vs_ar > 0) & (rows.method != REFERENCE)]
    logs = ok.assign(log=np.log(ok.speedup_vs_ar.astype(float)))
    return np.exp(logs.pivot_table(index=["category", "prompt_id"], columns="setting", values="log", aggfunc="mean"))


def _best(table: pd.DataFrame, settings: list[str]) -> str | None:
    present = [s for s in settings if s in table.columns and table[s].notna().all()]
    if not present:
        return None
    return max(present, key=lambda s: geomean(table[s]))


def paired_ratio(better: pd.Series, base: pd.Series, seed: int = 0) -> tuple[float, float, float]:
    """Geometric mean of better/base over prompts, and its bootstrap interval (NaN below MIN_PROMPTS)."""
    logs = np.log((better / base).to_numpy(dtype=float))
    point = float(np.exp(logs.mean()))
    if len(logs) < MIN_PROMPTS or np.allclose(logs, logs[0]):
        spread = math.nan if len(logs) < MIN_PROMPTS else point
        return point, spread, spread
    from scipy.stats import bootstrap

    result = bootstrap((logs,), np.mean, confidence_level=CONFIDENCE, method="percentile", n_resamples=2000,
                       random_state=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return point, float(np.exp(low)), float(np.exp(high))


def outcome(low: float, high: float) -> str:
    if math.isnan(low):
        return f"under {MIN_PROMPTS} prompts: no interval"
    return "beats" if low > 1.0 else "loses" if high < 1.0 else "ties"


def _compare(part: pd.DataFrame, adaptive: str | None, fixed: str) -> dict:
    if adaptive is None:
        return {"speedup": math.nan, "ratio": math.nan, "low": math.nan, "high": math.nan, "outcome": ""}
    ratio, low, high = paired_ratio(part[adaptive], part[fixed])
    return {"speedup": geomean(part[adaptive]), "ratio": ratio, "low": low, "high": high,
            "outcome": outcome(low, high)}


def policy_verdict(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per category and one for all prompts (VERDICT_COLUMNS); empty without SD and an adaptive run."""
    table = prompt_speedups(rows)
    kinds = rows.drop_duplicates("setting").set_index("setting").method
    fixed_settings = [s for s, m in kinds.items() if m == FIXED_GAMMA]
    adaptive_settings = [s for s, m in kinds.items() if m in ADAPTIVE_METHODS]
    tuned_once = _best(table, adaptive_settings)
    out = []
    present = set(table.index.get_level_values(0))
    groups = [(c, table.xs(c, level="category", drop_level=False)) for c in dict.fromkeys(rows.category) if c in present]
    for category, part in [*groups, (OVERALL, table)]:
        fixed, adaptive = _best(part, fixed_settings), _best(part, adaptive_settings)
        if fixed is None or adaptive is None:
            continue
        best, once = _compare(part, adaptive, fixed), _compare(part, tuned_once, fixed)
        out.append({"category": category, "prompts": len(part), "fixed": fixed, "fixed_speedup": geomean(part[fixed]),
                    "adaptive": adaptive, "adaptive_speedup": best["speedup"], "ratio": best["ratio"],
                    "ratio_low": best["low"], "ratio_high": best["high"], "outcome": best["outcome"],
                    "tuned_once": tuned_once, "tuned_once_speedup": once["speedup"], "tuned_once_ratio": once["ratio"],
                    "tuned_once_low": once["low"], "tuned_once_high": once["high"],
                    "tuned_once_outcome": once["outcome"]})
    labels = dict(zip(rows.setting, rows.label))
    frame = pd.DataFrame(out, columns=VERDICT_COLUMNS)
    for column in ("fixed", "adaptive", "tuned_once"):
        frame[column] = frame[column].map(lambda key: labels.get(key, key))
    return frame


def policy_sentence(frame: pd.DataFrame) -> str:
    """The overall row, and the categories where the policy tuned once loses, in a sentence or two."""
    if frame.empty:
        return ""
    overall = frame[frame.category == OVERALL].iloc[0]
    text = (f"Over all {overall.prompts} prompts the best adaptive setting, {overall.adaptive}, reached "
            f"{overall.adaptive_speedup:.2f}× AR against {overall.fixed_speedup:.2f}× for the best fixed γ "
            f"({overall.fixed}): ratio {overall.ratio:.2f}"
            + (f" ({overall.outcome})." if math.isnan(overall.ratio_low) else
               f" [{overall.ratio_low:.2f}, {overall.ratio_high:.2f}], it {overall.outcome}."))
    categories = frame[frame.category != OVERALL]
    if len(categories):
        losing = categories[categories.tuned_once_ratio < 1.0]
        lost = ", ".join(f"{r.category} ({r.tuned_once_ratio:.2f})" for r in losing.itertuples())
        text += (f" Tuned once, it matches or beats each category's best fixed γ in "
                 f"{len(categories) - len(losing)} of {len(categories)} categories"
                 + (f"; behind in {lost}." if lost else "."))
    return text
