"""Sweeps over trees: node budgets form SD-tree settings, placed on the chart by nodes per round."""

from __future__ import annotations

import pytest

from specdemo.bench.sweep import expand_grid, run_sweep
from specdemo.bench.sweep.charts import speedup_figure

PROMPTS = ["w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "w11 w12 w13 w14"]


def test_node_budgets_expand_into_sd_tree_settings():
    settings = expand_grid(gamma="2", gamma_max=None, ema=None, node_budget="3,8,3")
    trees = [s for s in settings if s.method == "sd-tree"]
    assert [s.node_budget for s in trees] == [3, 8]
    assert [s.label for s in trees] == ["SD-tree 3 nodes", "SD-tree 8 nodes"]
    assert trees[0].params() == {"node_budget": 3} and trees[0].key == "sd-tree:node_budget=3"
    assert [s.method for s in expand_grid(gamma=None, gamma_max=None, ema=None, node_budget="4")] == ["ar", "sd-tree"]


def test_a_tree_grid_needs_budgets_and_refuses_bad_ones():
    with pytest.raises(ValueError, match="sd-tree needs node_budget"):
        expand_grid(methods="sd-tree")
    with pytest.raises(ValueError, match="node_budget"):
        expand_grid(gamma=None, gamma_max=None, ema=None, node_budget="0")


def test_a_tree_sweep_reports_nodes_per_round_and_charts_trees_by_it(tiny_pair):
    settings = expand_grid(gamma="3", gamma_max=None, ema=None, node_budget="2,6")
    result = run_sweep(tiny_pair, PROMPTS, settings, repeats=1, max_new_tokens=12, warmup=False)
    summary = result.summary
    trees = summary[summary.method == "sd-tree"]
    assert list(trees.node_budget) == [2, 6]
    assert (trees.nodes_per_round <= trees.node_budget).all() and (trees.nodes_per_round > 0).all()
    assert summary[summary.method != "ar"].exact_match_pct.eq(100.0).all()  # greedy: every tree is lossless
    figure = speedup_figure(summary)
    tree_trace = next(t for t in figure.data if t.name.startswith("SD-tree"))
    assert list(tree_trace.x) == pytest.approx(list(trees.nodes_per_round))
