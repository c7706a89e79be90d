"""Axes around the grid: the models' precisions, the KV-cache policies, the temperature and the batch size.

The grid (`grid.py`) varies each method's settings on one loaded pair. What changes the pair
itself (the target's and the draft's precision) or every method's cache (`draft_kv`, `target_kv`,
`kv_budget`) runs the whole grid again, AR included, so that each speedup is over AR under the same
combination. `axes_table` then sets the combinations side by side: AR's speed against the first
combination's (float32 first, say), and each combination's best method. The temperature is a decoding
parameter of every method, so AR at each temperature is that temperature's reference; a batch size runs
every setting on batches of that many prompts (`batched.py`).
"""

from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

import pandas as pd

from ...engine.params import DecodeParams
from ...engine.targets.kv_policy import KV_POLICIES
from ...models.precision import resolve_precision
from .summary import SweepResult
from .verdict import outcome, paired_ratio, prompt_speedups
from ...engine.methods import REFERENCE

PRECISION_AXES = ("target_dtype", "draft_dtype")  # each value loads the pair again
CACHE_AXES = ("draft_kv", "target_kv", "kv_budget")  # decoding parameters of every method
SAMPLING_AXES = ("temperature",)  # a decoding parameter of every method, AR included
BATCH_AXES = ("batch",)  # requests decoded together through one target forward
OUTER_AXES = (*PRECISION_AXES, *CACHE_AXES, *SAMPLING_AXES, *BATCH_AXES)

AXES_TABLE_COLUMNS = ["ar_tokens_per_s", "ar_vs_first", "best", "best_tokens_per_s", "best_speedup_vs_ar",
                      "best_speedup_low", "best_speedup_high", "best_vs_ar", "best_acceptance_rate",
                      "draft_kv_bytes_peak", "target_kv_bytes_peak", "exact_match_pct"]


def parse_axis(name: str, text: str | None) -> list[Any]:
    """A comma-separated axis from the command line or the page, each value checked; [] when not given."""
    if text is None or not str(text).strip():
        return []
    values = [v.strip() for v in str(text).split(",") if v.strip()]
    check_axis(name, values)
    if name == "temperature":
        return list(dict.fromkeys(float(v) for v in values))
    return [int(v) for v in values] if name in ("kv_budget", "batch") else values


def check_axis(name: str, values: Sequence[Any], device: str = "cpu") -> None:
    """ValueError naming the axis and the bad value: an unknown axis, precision or KV policy, or a
    budget that is not a whole number of positions ≥ 1."""
    if name not in OUTER_AXES:
        raise ValueError(f"unknown axis {name!r}: the axes are {', '.join(OUTER_AXES)}")
    for value in values:
        text = str(value).strip()
        if name == "kv_budget":
            if not text.lstrip("-").isdigit() or int(text) < 1:
                raise ValueError(f"kv_budget must be whole numbers of positions ≥ 1, e.g. 128,256; got {text!r}")
        elif name == "batch":
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"batch must be whole numbers of requests ≥ 1, e.g. 1,2,4,8; got {text!r}")
        elif name == "temperature":
            try:
                DecodeParams.from_values(temperature=text)
            except ValueError as error:
                raise ValueError(f"temperature: {error}") from None
        elif name in PRECISION_AXES:
            try:
                resolve_precision(text, device)
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None
        elif name in ("draft_kv", "target_kv") and text not in KV_POLICIES:
            raise ValueError(f"{name} must be one of {', '.join(KV_POLICIES)}, got {text!r}")


def combinations(axes: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes that have values, the first axis slowest; [{}] when none has."""
    given = {name: list(values) for name, values in axes.items() if values}
    return [dict(zip(given, combo)) for combo in itertools.product(*given.values())] or [{}]


def label(combination: Mapping[str, Any]) -> str:
    """e.g. "target_dtype=int8, draft_kv=streaming"; "as loaded" for the empty combination."""
    return ", ".join(f"{name}={value}" for name, value in combination.items()) or "as loaded"


def tagged(frame: pd.DataFrame | None, combination: Mapping[str, Any]) -> pd.DataFrame | None:
    """`frame` with one column per axis of `combination` in front, so runs of several combinations stack."""
    if frame is None:
        return None
    tags = pd.DataFrame({name: [value] * len(frame) for name, value in combination.items()}, index=frame.index)
    return pd.concat([tags, frame.drop(columns=list(combination), errors="ignore")], axis=1)


def stacked(runs: Sequence[tuple[Mapping[str, Any], SweepResult]], part: str) -> pd.DataFrame | None:
    """One of each run's frames ("rows", "summary" or "tokens"), tagged and stacked."""
    frames = [tagged(getattr(result, part), combination) for combination, result in runs]
    frames = [f for f in frames if f is not None]
    return pd.concat(frames, ignore_index=True) if frames else None


def axes_table(runs: Sequence[tuple[Mapping[str, Any], SweepResult]]) -> pd.DataFrame:
    """Per combination: AR's tokens/s and its ratio to the first combination's, and the method
    setting with the best mean speedup over AR there: its speed, its speedup with the interval
    over prompts and the verdict against AR, its acceptance, its peak KV bytes and its exact match."""
    rows = []
    for combination, result in runs:
        summary = result.summary
        ar = summary[summary.method == REFERENCE]
        drafting = summary[(summary.method != REFERENCE) & summary.speedup_vs_ar.notna()]
        best = drafting.loc[drafting.speedup_vs_ar.idxmax()] if not drafting.empty else None
        low = high = float("nan")
        if best is not None:
            per_prompt = prompt_speedups(result.rows).get(best["setting"])
            if per_prompt is not None and len(per_prompt.dropna()):
                ones = pd.Series(1.0, index=per_prompt.dropna().index)
                _, low, high = paired_ratio(per_prompt.dropna(), ones)

        def of_best(column: str) -> float:
            return float(best[column]) if best is not None else float("nan")

        rows.append({
            **combination,
            "ar_tokens_per_s": float(ar.tokens_per_s.iloc[0]) if not ar.empty else float("nan"),
            "best": best["label"] if best is not None else "",
            "best_tokens_per_s": of_best("tokens_per_s"),
            "best_speedup_vs_ar": of_best("speedup_vs_ar"),
            "best_speedup_low": low, "best_speedup_high": high,
            "best_vs_ar": outcome(low, high) if best is not None else "",
            "best_acceptance_rate": of_best("acceptance_rate"),
            "draft_kv_bytes_peak": of_best("draft_kv_bytes_peak"),
            "target_kv_bytes_peak": of_best("target_kv_bytes_peak"),
            "exact_match_pct": of_best("exact_match_pct"),
        })
    table = pd.DataFrame(rows)
    table["ar_vs_first"] = table.ar_tokens_per_s / table.ar_tokens_per_s.iloc[0] if len(table) else []
    axes = [c for c in table.columns if c not in AXES_TABLE_COLUMNS]
    return table[axes + AXES_TABLE_COLUMNS]
