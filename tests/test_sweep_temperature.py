"""Temperature and batch size as axes of the sweep: each value runs the whole grid again, AR included, so
AR at each temperature is that temperature's reference; every row says its temperature and its batch; a
batch size above 1 runs the grid on batches through generate_batch. No timing thresholds."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from specdemo import cli
from specdemo.bench.sweep import expand_grid, run_sweep
from specdemo.bench.sweep.axes import OUTER_AXES, parse_axis
from specdemo.bench.sweep.charts import temperature_figure
from specdemo.bench.sweep.grid import Setting

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["w5 w6 w7 w8", "w11 w12 w13", "w20 w21 w22 w23 w24"]


def test_temperature_and_batch_are_axes_checked_before_any_run():
    assert {"temperature", "batch"} <= set(OUTER_AXES)
    assert parse_axis("temperature", "0,0.7,1.0,0.7") == [0.0, 0.7, 1.0]
    assert parse_axis("batch", "1,8") == [1, 8]
    with pytest.raises(ValueError, match="temperature"):
        parse_axis("temperature", "0,-1")
    with pytest.raises(ValueError, match="batch must be whole numbers"):
        parse_axis("batch", "0")


def test_temperature_chart_draws_acceptance_and_speedup_per_setting():
    summary = pd.DataFrame({
        "method": ["ar", "sd", "ar", "sd"], "setting": ["ar", "sd:gamma=3"] * 2, "label": ["AR", "SD γ=3"] * 2,
        "temperature": [0.0, 0.0, 1.0, 1.0], "acceptance_rate": [float("nan"), 0.8, float("nan"), 0.5],
        "acceptance_rate_std": [0.0] * 4, "speedup_vs_ar": [1.0, 1.6, 1.0, 1.1], "speedup_vs_ar_std": [0.0] * 4})
    fig = temperature_figure(summary)
    assert [(t.name, list(t.x), list(t.y)) for t in fig.data] == [
        ("SD γ=3", [0.0, 1.0], [0.8, 0.5]), ("SD γ=3", [0.0, 1.0], [1.6, 1.1])]  # AR is the line at 1
    assert fig.layout.xaxis.title.text == "temperature (0 = greedy)"


def test_sweep_command_runs_the_grid_at_each_temperature(tiny_pair, tmp_path, capsys):
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"prompt": p, "category": "chat"}) + "\n" for p in PROMPTS), encoding="utf-8")
    csv, report = tmp_path / "out" / "sweep.csv", tmp_path / "out" / "sweep.html"
    code = cli.main(["sweep", "--target", tiny_pair.target_ref, "--draft", tiny_pair.draft_ref, "--device", "cpu",
                     "--dtype", "float64", "--suite", str(suite), "--gamma", "2", "--gamma-max", "4", "--ema", "0.5",
                     "--temperature", "0,1.0", "--max-new-tokens", "6", "--repeats", "1", "--seed", "7", "--no-warmup",
                     "--csv", str(csv), "--report", str(report), "--plotlyjs", "cdn", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = pd.read_csv(csv)
    assert sorted(rows.temperature.unique()) == [0.0, 1.0]
    for temperature, part in rows.groupby("temperature"):
        assert set(part.method) == {"ar", "sd", "egag"} and len(part) == 3 * len(PROMPTS)
        ar = part[part.method == "ar"]
        assert ar.speedup_vs_ar.eq(1.0).all()  # AR is its own temperature's reference
    greedy, sampled = rows[rows.temperature == 0], rows[rows.temperature == 1.0]
    assert greedy.matches_ar.dropna().astype(bool).all() and sampled.matches_ar.isna().all()
    summary = pd.read_csv(tmp_path / "out" / "sweep.summary.csv")
    assert sorted(summary.temperature.unique()) == [0.0, 1.0]
    axes = pd.read_csv(tmp_path / "out" / "sweep.axes.csv")
    assert axes.temperature.tolist() == [0.0, 1.0]
    page = (tmp_path / "out" / "sweep.axes.html").read_text(encoding="utf-8")
    assert 'id="fig-temperature"' in page and "Acceptance and speedup against temperature" in page


def test_a_batch_above_one_runs_every_setting_on_batches(tiny_pair):
    settings = expand_grid(gamma=[2], gamma_max=[4], ema=[0.5])
    result = run_sweep(tiny_pair, PROMPTS, settings, repeats=1, batch=2, max_new_tokens=6, warmup=False)
    rows = result.rows
    assert (rows.batch == 2).all() and (rows.temperature == 0.0).all()
    # Three prompts in batches of two: two batches, the second with the first prompt again.
    assert len(rows) == 3 * 4 and sorted(rows[rows.method == "ar"].prompt_index) == [0, 0, 1, 2]
    assert rows.matches_ar.dropna().astype(bool).all()  # greedy rows in a batch equal AR's
    assert (rows.groupby(["setting", "batch_index"]).batch_seconds.nunique() == 1).all()
    assert rows.ttft_s.notna().all() and rows.draft_flops_per_token.isna().all()
    assert result.tokens is not None and set(result.tokens.setting) >= {"sd:gamma=2"}


def test_a_batch_refuses_a_tree_before_running(tiny_pair):
    with pytest.raises(ValueError, match="SD-tree 4 nodes at a batch above 1"):
        run_sweep(tiny_pair, PROMPTS, [Setting("sd-tree", node_budget=4)], repeats=1, batch=2, max_new_tokens=4,
                  warmup=False)
