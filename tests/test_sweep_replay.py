"""`sweep --replay`: the grid replayed from one recorded AR run per prompt.

A replayed row's rounds and τ equal the real sweep's row for the same prompt and setting; it says it was
replayed; its time figures are predictions in columns named so, never the measured columns; `--confirm K`
decodes the K best settings for real and prints predicted beside measured.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specdemo.bench.sweep import expand_grid, run_sweep
from specdemo.bench.sweep.grid import Setting
from specdemo.bench.sweep.replay import CONFIRM_COLUMNS, REPLAY_COLUMNS, best_settings, confirm, replay_sweep

PROMPTS = ["w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "w11 w12 w13 w14 w11 w12"]
LENGTH = 16
SETTINGS = expand_grid([1, 2, 4], [4, 6], [0.5, 0.9]) + [
    Setting("sd-heuristic", gamma=2), Setting("adaedl", gamma_max=6, adaedl_lambda=0.5),
    Setting("sd", gamma=3, copy_n=2)]
EXACT = ["mean_accepted_tokens", "rounds", "drafted", "accepted", "new_tokens", "mean_gamma", "acceptance_rate",
         "matches_ar", "target_forwards_per_token", "draft_forwards_per_token"]
MEASURED = ["tokens_per_s", "speedup_vs_ar", "seconds", "draft_seconds", "verify_seconds"]


@pytest.fixture(scope="module")
def costs_folder(tmp_path_factory, monkeypatch_module):
    folder = tmp_path_factory.mktemp("costs")
    monkeypatch_module.setenv("SPECDEMO_CACHE", str(folder))
    return folder


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def replayed(tiny_pair, costs_folder):
    return replay_sweep(tiny_pair, PROMPTS, SETTINGS, max_new_tokens=LENGTH)


@pytest.fixture(scope="module")
def real(tiny_pair):
    return run_sweep(tiny_pair, PROMPTS, SETTINGS, repeats=1, warmup=False, max_new_tokens=LENGTH)


def test_replayed_rows_equal_the_real_sweeps_rows(replayed, real):
    key = ["setting", "prompt_id"]
    ours = replayed.rows.set_index(key).sort_index()
    theirs = real.rows.set_index(key).sort_index()
    assert list(ours.index) == list(theirs.index)
    pd.testing.assert_frame_equal(ours[EXACT], theirs[EXACT], check_dtype=False)


def test_a_replayed_row_says_so_and_its_times_are_named_predictions(replayed):
    rows = replayed.rows
    assert set(REPLAY_COLUMNS) <= set(rows.columns)
    drafting = rows[rows.method != "ar"]
    assert drafting.replayed.all() and not rows[rows.method == "ar"].replayed.any()
    assert drafting[MEASURED].isna().all().all()  # nothing measured there
    assert (drafting.predicted_tokens_per_s > 0).all() and drafting.predicted_speedup_vs_ar.notna().all()
    ar = rows[rows.method == "ar"]
    assert (ar.tokens_per_s > 0).all() and (ar.predicted_speedup_vs_ar == 1.0).all()
    summary = replayed.summary
    assert {"replayed", "predicted_tokens_per_s", "predicted_speedup_vs_ar"} <= set(summary.columns)
    assert replayed.meta["replayed"] and set(replayed.meta["seconds"]) == {"record", "replay", "predict"}


def test_the_best_settings_are_those_of_the_highest_predicted_speedup(replayed):
    best = best_settings(replayed, 2)
    ranked = replayed.summary[replayed.summary.replayed].predicted_speedup_vs_ar.sort_values(ascending=False)
    assert [s.key for s in best] == list(replayed.summary.loc[ranked.index[:2], "setting"])


def test_confirm_decodes_the_best_for_real_and_sets_predicted_beside_measured(tiny_pair, replayed):
    _, table = confirm(tiny_pair, PROMPTS, replayed, 2, warmup=False, max_new_tokens=LENGTH)
    assert list(table.columns) == CONFIRM_COLUMNS and len(table) == 2
    assert (table.replayed_mean_accepted_tokens == table.measured_mean_accepted_tokens).all()
    assert (table.measured_tokens_per_s > 0).all()
    assert all(math.isfinite(v) for v in table.error_pct)


def test_a_sampled_sweep_is_not_replayed(tiny_pair, costs_folder):
    with pytest.raises(ValueError, match="samples"):
        replay_sweep(tiny_pair, PROMPTS, SETTINGS[:1], max_new_tokens=4, temperature=0.7)


def _model_args(pair) -> list[str]:
    return ["--target", pair.target_ref, "--draft", pair.draft_ref, "--dtype", "float64"]


def test_the_command_replays_and_confirms(tiny_pair, costs_folder, tmp_path, capsys):
    from specdemo import cli

    csv = tmp_path / "replay.csv"
    code = cli.main(["sweep", *_model_args(tiny_pair), "--replay", "--confirm", "2", "--gamma", "1,3",
                     "--gamma-max", "4", "--ema", "0.5", "--max-new-tokens", "8", "--repeats", "1", "--limit", "1",
                     "--no-warmup", "--csv", str(csv), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "predicted_speedup_vs_ar" in out and "replayed 3 settings" in out
    assert "predicted beside measured" in out and "measured_tokens_per_s" in out
    rows = pd.read_csv(csv)
    assert rows[rows.method != "ar"].replayed.all() and rows.tokens_per_s[rows.method != "ar"].isna().all()


@pytest.mark.parametrize("flags, message", [
    (["--confirm", "2"], "with --replay"),
    (["--replay", "--temperature", "0.7"], "greedy"),
    (["--replay", "--batch", "2"], "one request"),
])
def test_the_command_refuses_what_a_replay_cannot_stand_in_for(tiny_pair, flags, message, capsys):
    from specdemo import cli

    code = cli.main(["sweep", *_model_args(tiny_pair), *flags, "--gamma", "1", "--max-new-tokens", "4", "--quiet"])
    assert code != 0 and message in capsys.readouterr().err
