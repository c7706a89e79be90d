"""`python -m specdemo.bench.precision`: each target precision against float32 AR, as a table and a chart."""

from __future__ import annotations

import pandas as pd
import pytest

from specdemo.bench import precision

pytestmark = pytest.mark.usefixtures("one_thread")


def test_token_match_counts_equal_positions_over_the_longer_output():
    assert precision.token_match([1, 2, 3], [1, 2, 3]) == 1.0
    assert precision.token_match([1, 9, 3, 4], [1, 2, 3]) == pytest.approx(2 / 4)
    assert precision.token_match([], []) == 1.0


def test_the_chart_sets_each_precision_against_float32_in_three_panels():
    frame = pd.DataFrame({"target": ["float32", "int8"], "library": ["torch", "torch.ao"],
                          "vs_float32": [1.0, 1.5], "token_match_vs_float32": [1.0, 0.2],
                          "perplexity_under_float32": [1.3, 1.7]})
    fig = precision.vs_float32_figure(frame)
    speed, match, perplexity = fig.data
    assert list(speed.y) == [1.0, 1.5] and list(match.y) == [100.0, 20.0] and list(perplexity.y) == [1.3, 1.7]
    assert list(speed.x) == ["float32<br>(torch)", "int8<br>(torch.ao)"]
    assert [a.text for a in fig.layout.annotations] == ["AR tokens/s ÷ float32", "token match with float32 (%)",
                                                         "perplexity under float32"]


def test_ar_command_writes_the_table_and_the_chart(tiny_pair, tmp_path, capsys):
    csv, html = tmp_path / "targets.csv", tmp_path / "targets.html"
    assert precision.main(["ar", "--target", tiny_pair.target_ref, "--dtypes", "bfloat16", "--categories", "chat",
                           "--max-new-tokens", "4", "--csv", str(csv), "--figure", str(html)]) == 0
    table = pd.read_csv(csv)
    assert list(table.target) == ["float32", "bfloat16"]
    assert table.vs_float32.iloc[0] == 1.0 and table.token_match_vs_float32.iloc[0] == 1.0
    assert table.token_match_vs_float32.between(0, 1).all() and (table.perplexity_under_float32 >= 1).all()
    assert "perplexity under float32" in html.read_text(encoding="utf-8")
    assert f"wrote {html}" in capsys.readouterr().out


def test_the_sweep_sets_each_target_and_draft_precision_against_its_own_ar_and_float32_ar(tiny_pair, monkeypatch):
    monkeypatch.setattr(precision, "suite_prompts", lambda pair, per_category, categories: [[1, 5, 9], [2, 6]])
    table = precision.measure_sweep(tiny_pair.target_ref, ["bfloat16"], ["float32", "bfloat16"], 1, None, 8,
                                    draft=tiny_pair.draft_ref)

    assert list(table.columns) == precision.SWEEP_COLUMNS
    assert table[["target", "draft", "method"]].values.tolist() == [
        ["float32", "", "ar"], ["bfloat16", "", "ar"], ["float32", "float32", "sd"], ["float32", "bfloat16", "sd"],
        ["bfloat16", "float32", "sd"], ["bfloat16", "bfloat16", "sd"]]
    float32_ar = table.iloc[0]
    assert float32_ar.speedup_vs_own_ar == float32_ar.speedup_vs_fp32_ar == float32_ar.token_match_vs_fp32 == 1.0
    assert float32_ar.chrf_vs_fp32 == pytest.approx(100.0)
    float32_target = table[table.target == "float32"]
    # A float32 target's own AR is float32 AR: the two speedups are one number.
    assert (float32_target.speedup_vs_own_ar == float32_target.speedup_vs_fp32_ar).all()
    # A bfloat16 row's two speedups differ by bfloat16 AR's speed over float32 AR's.
    bfloat16_ar = table.iloc[1].speedup_vs_fp32_ar
    for _, row in table[table.target == "bfloat16"].iterrows():
        assert row.speedup_vs_fp32_ar == pytest.approx(row.speedup_vs_own_ar * bfloat16_ar)
    assert (table[table.method == "sd"].matches_own_ar == 1.0).all()  # lossless at every precision
    assert table[table.method == "sd"].acceptance_rate.between(0, 1).all()
