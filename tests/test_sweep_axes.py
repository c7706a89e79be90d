"""The axes around a sweep's grid: each axis's values checked with a message naming the axis,
and the side-by-side table's per-combination columns (speed, speedup with its interval and
verdict, acceptance, peak KV bytes)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specdemo.bench.sweep import SweepResult
from specdemo.bench.sweep.axes import axes_table, check_axis, parse_axis
from specdemo.bench.sweep.rows import rows_frame


@pytest.mark.parametrize("name, text, expected", [
    ("kv_budget", "64, 256", [64, 256]),
    ("draft_kv", "full,streaming,l2,head", ["full", "streaming", "l2", "head"]),
    ("target_kv", "head", ["head"]),
    ("target_dtype", "float32,int8", ["float32", "int8"]),
    ("draft_dtype", "bfloat16", ["bfloat16"]),
    ("kv_budget", " ", []),
])
def test_good_axis_values_are_parsed(name, text, expected):
    assert parse_axis(name, text) == expected


@pytest.mark.parametrize("name, text, message", [
    ("kv_budget", "64,0", "kv_budget must be whole numbers of positions ≥ 1.*got '0'"),
    ("kv_budget", "-8", "kv_budget must be whole numbers of positions ≥ 1.*got '-8'"),
    ("kv_budget", "1.5", "kv_budget must be whole numbers.*got '1.5'"),
    ("draft_kv", "full,window", "draft_kv must be one of full, streaming, l2, head, got 'window'"),
    ("target_kv", "H2O", "target_kv must be one of full, streaming, l2, head, got 'H2O'"),
    ("target_dtype", "float32,fp8", "target_dtype: dtype must be one of .*got 'fp8'"),
    ("draft_dtype", "int3", "draft_dtype: dtype must be one of .*got 'int3'"),
    ("gamma", "1,2", "unknown axis 'gamma'"),
])
def test_bad_axis_values_are_refused_naming_the_axis_and_the_value(name, text, message):
    with pytest.raises(ValueError, match=message):
        parse_axis(name, text)
    with pytest.raises(ValueError, match=message):
        check_axis(name, text.split(","))


def _rows(speedups: list[float], draft_peak: int, acceptance: tuple[int, int]) -> pd.DataFrame:
    """AR and SD γ=2 on one prompt per speedup, SD's peak draft cache `draft_peak` bytes."""
    rows = []
    for i, speedup in enumerate(speedups):
        common = {"prompt_id": f"p{i}", "category": "chat", "repeat": 0, "new_tokens": 10, "target_kv_bytes_peak": 1000}
        rows.append({**common, "method": "ar", "setting": "ar", "label": "AR", "speedup_vs_ar": 1.0, "seconds": 1.0,
                     "rounds": 10, "drafted": 0, "accepted": 0, "rejected_rounds": 0, "draft_kv_bytes_peak": 0})
        rows.append({**common, "method": "sd", "setting": "sd:gamma=2", "label": "SD γ=2", "gamma": 2,
                     "speedup_vs_ar": speedup, "seconds": 1.0 / speedup, "rounds": 5, "drafted": acceptance[1],
                     "accepted": acceptance[0], "rejected_rounds": 3, "draft_kv_bytes_peak": draft_peak,
                     "matches_ar": True})
    return rows_frame(rows)


def test_the_axes_table_gives_each_combination_its_speed_interval_verdict_acceptance_and_peak_kv():
    runs = [({"draft_kv": "full"}, SweepResult(_rows([1.5, 1.6, 1.7, 1.55], 4096, (8, 10)), [])),
            ({"draft_kv": "head"}, SweepResult(_rows([0.8, 0.9, 0.85, 0.95], 1024, (6, 10)), [])),
            ({"draft_kv": "streaming"}, SweepResult(_rows([1.1, 0.9], 1024, (5, 10)), []))]
    table = axes_table(runs).set_index("draft_kv")
    full, head, streaming = table.loc["full"], table.loc["head"], table.loc["streaming"]
    assert full.best == "SD γ=2" and full.best_tokens_per_s == pytest.approx(40 / sum(1 / s for s in [1.5, 1.6, 1.7, 1.55]))  # pooled: tokens / seconds
    assert 1.5 <= full.best_speedup_low <= full.best_speedup_vs_ar <= full.best_speedup_high <= 1.7
    assert (full.best_vs_ar, head.best_vs_ar) == ("beats", "loses")
    assert head.best_speedup_high < 1.0
    assert math.isnan(streaming.best_speedup_low) and streaming.best_vs_ar.startswith("under 3 prompts")
    assert (full.best_acceptance_rate, head.best_acceptance_rate) == (0.8, 0.6)
    assert (full.draft_kv_bytes_peak, head.draft_kv_bytes_peak, full.target_kv_bytes_peak) == (4096, 1024, 1000)
    assert full.exact_match_pct == 100.0
