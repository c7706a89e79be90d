"""The Sweep tab's replay switch: the grid replayed from one recorded greedy AR run per prompt, its rows
saying so, its times predicted and named so; a sampled or multi-combination replay refused before loading."""

from __future__ import annotations

import pandas as pd
import pytest

from specdemo.app import sweeptab
from specdemo.app.limits import Limits
from specdemo.bench import sweep
from tests.test_sweeptab import PRESETS, SUITE, form


def test_the_switch_reaches_the_request_and_refuses_what_a_replay_cannot_stand_in_for():
    assert sweeptab.make_sweep_request(form(replay=True), PRESETS, Limits(), SUITE).replay
    assert not sweeptab.make_sweep_request(form(), PRESETS, Limits(), SUITE).replay
    with pytest.raises(ValueError, match="temperature 0.7 samples"):
        sweeptab.make_sweep_request(form(replay=True, temperature=0.7), PRESETS, Limits(), SUITE)
    with pytest.raises(ValueError, match="one pair on one precision"):
        sweeptab.make_sweep_request(form(replay=True, draft_kv_axis="full,streaming"), PRESETS, Limits(), SUITE)


def test_a_replayed_sweep_streams_progress_then_its_predicted_table_and_charts(tiny_pair, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "costs"))
    req = sweeptab.make_sweep_request(form(replay=True, categories=["chat"], prompts_per_category=2), PRESETS,
                                      Limits(), SUITE)
    folder = tmp_path / "export"
    folder.mkdir()
    updates = list(sweeptab.stream_sweep(req, lambda t, d, **loading: tiny_pair, lambda: folder))
    running, last = updates[1:-1], updates[-1]
    assert [u.message.split(" ")[-1] for u in running[:2]] == ["recorded", "settings)"]
    assert all(u.figures is None and u.table is None for u in running)
    assert last.finished and last.result.meta["replayed"]
    shown = last.table
    assert {"replayed", "predicted_speedup_vs_ar", "predicted_tokens_per_s"} <= set(shown.columns)
    assert "speedup_vs_ar" not in shown.columns  # the measured column is NaN on a replayed row: not shown
    assert shown.set_index("setting").replayed.drop("AR").all() and len(shown) == 5
    assert set(last.figures) == set(sweep.FIGURES)
    rows = pd.read_csv(last.files.rows_csv)
    assert rows.loc[rows.method != "ar", "replayed"].all() and rows.loc[rows.method != "ar", "matches_ar"].all()
    status = sweeptab.page_values(last)[0]
    assert "Replayed from one recorded greedy AR run per prompt" in status and "predicted" in status


def test_the_charts_read_a_replayed_rows_predictions_where_its_measured_columns_are_empty():
    summary = pd.DataFrame({"replayed": [False, True], "speedup_vs_ar": [1.0, float("nan")],
                            "predicted_speedup_vs_ar": [1.0, 1.7], "tokens_per_s": [10.0, float("nan")],
                            "predicted_tokens_per_s": [10.0, 17.0]})
    shown = sweeptab.predicted_as_measured(summary)
    assert list(shown.speedup_vs_ar) == [1.0, 1.7] and list(shown.tokens_per_s) == [10.0, 17.0]
    assert summary.speedup_vs_ar.isna().iloc[1]  # the summary itself is left as it is
