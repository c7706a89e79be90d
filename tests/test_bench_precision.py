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
