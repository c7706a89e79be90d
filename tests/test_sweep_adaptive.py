"""Sweeps over the per-token stopping rules, and the verdict against the best fixed γ with a
bootstrap interval over prompts."""

import math

import numpy as np
import pandas as pd
import pytest

from specdemo.bench import sweep
from specdemo.bench.sweep import expand_grid, policy_sentence, policy_verdict, run_sweep
from specdemo.bench.sweep.verdict import paired_ratio
from specdemo.engine.drafters.online import forget_online
from specdemo.engine.params import PARAMS
from tests.test_acceptance import frozen_heap  # noqa: F401 (a fixture)
from tests.test_feature_drafter import head_pair, with_head  # noqa: F401 (a fixture)


def test_each_rule_is_swept_over_its_threshold_with_a_cap():
    settings = expand_grid(gamma="2,3", gamma_max=None, ema=None, adaedl_lambda="0.3,0.6", entropy_stop="0.1")
    assert [s.method for s in settings] == ["ar", "sd", "sd", "adaedl", "adaedl", "egag-token"]
    adaedl = settings[3]
    assert adaedl.params() == {"gamma_max": 8, "adaedl_lambda": 0.3}
    assert adaedl.key == "adaedl:gamma_max=8,adaedl_lambda=0.3" and adaedl.label == "AdaEDL λ 0.3 (γ ≤ 8)"
    assert settings[5].label == "EGAG-token H > 0.1 (γ ≤ 8)"


def test_a_rule_picked_without_thresholds_runs_at_its_default_and_the_rest_have_no_grid():
    settings = expand_grid(gamma="2", gamma_max=None, ema=None, methods="sd,egag-token,sd-confidence,rest",
                           stop_cap=5, nasd_gamma=4)
    assert [(s.method, s.params()) for s in settings[2:]] == [
        ("egag-token", {"gamma_max": 5, "entropy_stop": PARAMS["entropy_stop"].default}),
        ("sd-confidence", {"gamma_max": 5}), ("rest", {"gamma": 4})]
    with pytest.raises(ValueError, match="entropy_stop"):
        expand_grid(gamma=None, gamma_max=None, ema=None, entropy_stop="1.5")


def _rows(speedups: dict[str, dict[str, list[float]]]) -> pd.DataFrame:
    """Rows of a sweep from {category: {setting: speedup per prompt}}; a setting's method is its key's prefix."""
    rows = []
    for category, settings in speedups.items():
        for key, values in settings.items():
            for i, value in enumerate(values):
                rows.append({"method": key.split(":")[0], "setting": key, "label": key, "category": category,
                             "prompt_id": f"{category}-{i}", "repeat": 0, "speedup_vs_ar": value})
    return sweep.rows_frame(rows)


def test_the_verdict_names_the_best_fixed_and_adaptive_settings_per_category_and_overall():
    rng = np.random.default_rng(0)
    noise = lambda: list(1 + 0.01 * rng.standard_normal(8))  # noqa: E731
    rows = _rows({
        "code": {"sd:gamma=2": [1.2 * x for x in noise()], "sd:gamma=4": [1.5 * x for x in noise()],
                 "adaedl:l=0.5": [1.8 * x for x in noise()], "egag-token:h=0.1": [1.6 * x for x in noise()]},
        "chat": {"sd:gamma=2": [1.3 * x for x in noise()], "sd:gamma=4": [1.1 * x for x in noise()],
                 "adaedl:l=0.5": [1.0 * x for x in noise()], "egag-token:h=0.1": [1.4 * x for x in noise()]},
    })
    table = policy_verdict(rows).set_index("category")
    assert list(table.index) == ["code", "chat", "all"]
    assert table.loc["code", "fixed"] == "sd:gamma=4" and table.loc["code", "adaptive"] == "adaedl:l=0.5"
    assert table.loc["code", "outcome"] == "beats" and table.loc["code", "ratio"] == pytest.approx(1.2, rel=0.02)
    assert table.loc["chat", "fixed"] == "sd:gamma=2" and table.loc["chat", "adaptive"] == "egag-token:h=0.1"
    # Tuned once over all prompts, the best is egag-token (1.6 and 1.4 against AdaEDL's 1.8 and 1.0).
    assert set(table.tuned_once) == {"egag-token:h=0.1"}
    assert table.loc["code", "tuned_once_outcome"] == "beats" and table.loc["chat", "tuned_once_outcome"] == "beats"
    low, high = table.loc["all", ["ratio_low", "ratio_high"]]
    assert low <= table.loc["all", "ratio"] <= high
    text = policy_sentence(table.reset_index())
    assert text.startswith("Over all 16 prompts the best adaptive setting, egag-token:h=0.1")
    assert "in 2 of 2 categories." in text


def test_a_tie_is_a_tie_and_two_prompts_give_no_interval():
    ratio, low, high = paired_ratio(pd.Series([1.0, 1.2, 0.9, 1.1]), pd.Series([1.05, 1.1, 1.0, 1.05]))
    assert low < 1 < high and low <= ratio <= high
    ratio, low, high = paired_ratio(pd.Series([1.5, 1.2]), pd.Series([1.0, 1.0]))
    assert ratio == pytest.approx(1.8 ** 0.5) and math.isnan(low)
    rows = _rows({"math": {"sd:gamma=3": [1.0, 1.1], "adaedl:x": [1.5, 1.4]}})
    assert policy_verdict(rows).outcome.tolist() == ["under 3 prompts: no interval"] * 2


def test_without_an_adaptive_run_there_is_no_comparison():
    assert policy_verdict(_rows({"math": {"sd:gamma=3": [1.0, 1.1]}})).empty


def test_a_small_sweep_runs_each_rule_and_says_how_they_compare(tiny_pair, frozen_heap):
    settings = expand_grid(gamma="2", gamma_max=None, ema=None, adaedl_lambda="0.5", entropy_stop="0.2",
                           methods="sd,adaedl,egag-token,rest", stop_cap=4)
    prompts = ["w5 w6 w7 w8", "w10 w20 w30 w10 w20 w30", "w40 w41"]
    result = run_sweep(tiny_pair, prompts, settings, repeats=1, warmup=False, max_new_tokens=16)
    assert set(result.rows.method) == {"ar", "sd", "adaedl", "egag-token", "rest"}
    assert result.rows.matches_ar.dropna().all()
    assert result.rows.adaedl_lambda.dropna().tolist() == [0.5] * 3
    assert "Over all 3 prompts the best adaptive setting" in result.verdict
    assert {"all", "prompt"} == set(result.policy_table.category)
    assert "speedup_vs_gamma" in result.figures


def test_the_rules_trees_are_swept_on_their_chain_rules_axis_only_when_named():
    chains = expand_grid(gamma=None, gamma_max=None, ema=None, adaedl_lambda="0.3,0.6")
    assert [s.method for s in chains] == ["ar", "adaedl", "adaedl"]  # a threshold alone picks the chain
    settings = expand_grid(gamma=None, gamma_max=None, ema=None, adaedl_lambda="0.3,0.6", entropy_stop="0.2",
                           methods="adaedl-tree,egag-token-tree")
    assert [(s.method, s.params()) for s in settings[1:]] == [
        ("adaedl-tree", {"adaedl_lambda": 0.3}), ("adaedl-tree", {"adaedl_lambda": 0.6}),
        ("egag-token-tree", {"entropy_stop": 0.2})]
    budget = PARAMS["node_budget"].default
    assert settings[1].label == f"AdaEDL-tree λ 0.3 ({budget} nodes)"
    assert settings[3].label == f"EGAG-token-tree H > 0.2 ({budget} nodes)"


def test_a_small_sweep_runs_the_rules_trees_and_osd_losslessly(head_pair, frozen_heap):  # noqa: F811
    settings = expand_grid(gamma="2", gamma_max=None, ema=None, adaedl_lambda="0.5", entropy_stop="0.9",
                           methods="sd,adaedl-tree,egag-token-tree,osd", nasd_gamma=2)
    prompts = ["w5 w6 w7 w8", "w10 w20 w30 w10 w20 w30", "w40 w41"]
    forget_online(head_pair.draft)
    result = run_sweep(head_pair, prompts, settings, repeats=1, warmup=False, max_new_tokens=16)
    assert set(result.rows.method) == {"ar", "sd", "adaedl-tree", "egag-token-tree", "osd"}
    assert result.rows.matches_ar.all() and len(result.rows) == 15  # five settings, AR included, on three prompts
    # On the first prompt OSD's copy has learnt nothing yet: it drafts as SD does, and what it fed
    # each model is counted alike; its learning after the request (gradients) is not counted.
    first = result.rows[result.rows.prompt_index == 0].set_index("method")
    columns = ["draft_forwards_per_token", "draft_flops_per_token", "target_flops_per_token"]
    assert first.loc["osd", columns].tolist() == first.loc["sd", columns].tolist()
    osd = result.rows[result.rows.method == "osd"]
    assert first.at["osd", "draft_flops_per_token"] > 0 and osd.predicted_speedup.notna().all()


def test_the_speedup_chart_places_the_stopping_rules_and_rest_at_their_drafts_per_round():
    """The registry says which methods the chart places at their drafts per round (`Sweep.at_drafts`), in
    the grid's order, each labelled by its threshold axis; OSD and the rules' trees are not among them."""
    from specdemo.bench.sweep.charts import speedup_figure

    methods = ["ar", "osd", "adaedl-tree", "rest", "sd-heuristic", "sd-confidence", "specdecpp", "egag-token", "adaedl"]
    summary = pd.DataFrame({"method": methods, "label": [f"{m} setting" for m in methods],
                            "gamma": 3, "speedup_vs_ar": 1.5, "speedup_vs_ar_std": 0.1, "nodes_per_round": 2.0,
                            "adaedl_lambda": 0.3, "entropy_stop": 0.4, "specdecpp_threshold": 0.5})
    placed = [t for t in speedup_figure(summary).data if t.name.endswith("(drafts per round)")]
    assert [t.name.split(" ")[0] for t in placed] == ["adaedl", "egag-token", "specdecpp", "sd-confidence",
                                                       "sd-heuristic", "rest"]
    assert [list(t.text) for t in placed] == [["0.3"], ["0.4"], ["0.5"], [""], [""], [""]]


def test_leviathan_reads_the_drafts_of_the_methods_whose_policy_varies_them():
    from specdemo.bench.sweep.rows import _VARYING_GAMMA

    assert _VARYING_GAMMA == {"egag", "adaedl", "egag-token", "specdecpp", "sd-confidence", "sd-heuristic"}
