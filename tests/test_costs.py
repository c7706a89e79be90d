"""The machine's cost table: calibrated from real runs, kept on disk, and the tokens/s it predicts
from a run's rounds. No wall-clock thresholds: only the arithmetic and the bookkeeping are checked."""

from __future__ import annotations

import math

import pytest

import specdemo
from specdemo.bench.measure.costs import (
    CostTable, calibrate, cost_table, ensure_drafter, machine_key, predict_seconds,
    predict_tokens_per_s, prediction_errors, round_seconds,
)
from specdemo.engine.methods import REFERENCE
from specdemo.engine.trace import COPIED, DRAFTED, GenerationResult, Round

PROMPT = "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8"
DRAFTER = "a drafter"


def _round(index: int, drafted: int, source: str = DRAFTED, new: int = 1) -> Round:
    return Round(index, drafted, None, list(range(drafted)), 0, 1, [], 0.0, 0.0, 0.0, new_tokens=[7] * new,
                 source=source if drafted else "")


def _table() -> CostTable:
    return CostTable("k", target_rows={1: 0.010, 3: 0.014, 5: 0.020}, draft_step={DRAFTER: 0.002, "none": 0.0},
                     copy_round={DRAFTER: 0.0005}, setup={DRAFTER: 0.1, "none": 0.05}, round_overhead=0.001,
                     step_overhead=0.0002, reference_prefill=0.04)


def test_a_verification_between_measured_rows_is_on_the_line_through_them_and_beyond_them_on_the_last_slope():
    costs = _table()
    assert costs.target_seconds(3) == 0.014
    assert costs.target_seconds(2) == pytest.approx(0.012)
    assert costs.target_seconds(4) == pytest.approx(0.017)
    assert costs.target_seconds(7) == pytest.approx(0.026)


def test_a_round_costs_its_verification_its_drafting_and_its_overhead():
    costs = _table()
    assert round_seconds(costs, DRAFTER, _round(1, 4)) == pytest.approx(0.020 + 4 * 0.002 + 0.001)
    assert round_seconds(costs, DRAFTER, _round(1, 2, COPIED)) == pytest.approx(0.014 + 0.0005 + 0.001)
    assert round_seconds(costs, "none", _round(1, 0)) == pytest.approx(0.010 + 0.0002)


def test_tokens_per_s_are_the_new_tokens_over_the_setup_and_every_round():
    result = GenerationResult("m", {}, [1, 2], rounds=[_round(0, 2, new=3), _round(1, 4, new=2)], drafter=DRAFTER)
    seconds = 0.1 + (0.014 + 0.004 + 0.001) + (0.020 + 0.008 + 0.001)
    assert predict_seconds(result, _table()) == pytest.approx(seconds)
    assert predict_tokens_per_s(result, _table()) == pytest.approx(5 / seconds)
    # A prompt whose AR prefill took longer than the calibration prompt's costs the difference more.
    assert predict_seconds(result, _table(), prefill_seconds=0.07) == pytest.approx(seconds + 0.03)


def test_a_drafter_the_table_never_timed_is_refused_by_name():
    result = GenerationResult("m", {}, [1], rounds=[_round(0, 1)], drafter="another drafter")
    with pytest.raises(KeyError, match="another drafter"):
        predict_seconds(result, _table())


def test_the_error_table_sets_predicted_beside_measured():
    errors = prediction_errors([("a", 11.0, 10.0), ("b", 9.0, 10.0), ("c", 10.5, 10.0)])
    assert list(errors["error_pct"]) == pytest.approx([10.0, -10.0, 5.0])


def test_calibration_times_every_row_count_it_ran_and_the_drafter_it_drafted_with(tiny_pair, one_thread):
    ids = tiny_pair.encode(PROMPT, chat=False)
    costs = calibrate(tiny_pair, ids, max_new_tokens=16, gammas=(1, 3))
    assert {1, 2, 4} <= set(costs.target_rows)
    assert all(seconds > 0 for seconds in costs.target_rows.values())
    sd = specdemo.generate(tiny_pair, ids, "sd", max_new_tokens=16, gamma=3)
    assert sd.drafter in costs.draft_step and costs.draft_step[sd.drafter] >= 0
    ar = specdemo.generate(tiny_pair, ids, REFERENCE, max_new_tokens=16)
    assert predict_tokens_per_s(ar, costs) > 0


def test_a_new_drafter_is_timed_once_and_the_table_is_kept_on_disk(tiny_pair, one_thread, tmp_path):
    ids = tiny_pair.encode(PROMPT, chat=False)
    costs = calibrate(tiny_pair, ids, max_new_tokens=12, gammas=(2,))
    nasd = specdemo.generate(tiny_pair, ids, "nasd", max_new_tokens=12, ngram_n=2)
    assert not costs.knows(nasd.drafter)
    assert ensure_drafter(costs, tiny_pair, nasd, ids, max_new_tokens=12)
    assert not ensure_drafter(costs, tiny_pair, nasd, ids, max_new_tokens=12)
    assert math.isfinite(predict_tokens_per_s(nasd, costs))
    costs.save(tmp_path)
    assert CostTable.load(machine_key(tiny_pair), tmp_path) == costs
    assert cost_table(tiny_pair, tmp_path) == costs  # read back, not calibrated again
