"""specdemo.bench.measure.acceptance and tables.tokens_frame: what the entropy and position charts and the
break-even line are computed from."""

import gc
import math

import pandas as pd
import pytest

import specdemo
from specdemo.bench.measure import acceptance
from specdemo.bench.measure.tables import TOKEN_COLUMNS, summary_frame, tokens_frame
from specdemo.engine.trace import DraftDecision, GenerationResult, Round


@pytest.fixture(scope="module")
def frozen_heap():
    """What is alive now (the libraries, the loaded pairs) out of the collector's reach for the module, as
    the page has it once its pair is loaded (`app.page._freeze_what_stays`): the collection before each
    timed run (`quiet_gc`) then walks what was made since, not half a million objects (most of a second
    each on a small CPU, against milliseconds for the runs themselves)."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def _round(index, entropies, accepted, point_mass=False):
    drafted = list(range(10, 10 + len(entropies)))
    decisions = [DraftDecision(t, 0.5, 0.5, 1.0 if i < accepted else 0.0, i < accepted, i <= accepted, point_mass)
                 for i, t in enumerate(drafted)]
    return Round(index, len(drafted), None, drafted, accepted, 7, list(entropies), 0.0, 0.0, 0.0,
                 new_tokens=drafted[:accepted] + [7], decisions=decisions)


def _result(method, rounds):
    return GenerationResult(method, {}, [1, 2], rounds=rounds)


def test_auc_is_one_when_every_kept_draft_was_more_confident_than_every_refused_one():
    rounds = [_round(0, [0.1, 0.2, 0.9], 2), _round(1, [0.15, 0.8], 1), _round(2, [0.7, 0.05], 0)]
    auc, n = acceptance.entropy_auc(tokens_frame([_result("sd", rounds)]))
    # Judged: 0.1, 0.2, 0.15 kept; 0.9, 0.8, 0.7 refused. 0.05 came after a rejection: not judged.
    assert (auc, n) == (1.0, 6)


def test_auc_counts_ordered_pairs_and_ties_half():
    # kept 0.2, 0.5; refused 0.5, 0.3, 0.1. Pairs where the kept draft is the more confident:
    # 0.2 beats 0.5 and 0.3 (2), 0.5 ties 0.5 (½) → 2.5 of 6.
    rounds = [_round(0, [0.2, 0.5], 1), _round(1, [0.5, 0.3], 1), _round(2, [0.1], 0)]
    tokens = tokens_frame([_result("sd", rounds)])
    auc, n = acceptance.entropy_auc(tokens)
    assert n == 5 and auc == pytest.approx(2.5 / 6)


def test_auc_leaves_out_point_masses_and_is_nan_without_both_outcomes():
    rounds = [_round(0, [0.0, 0.0], 1, point_mass=True), _round(1, [0.3], 1)]
    auc, n = acceptance.entropy_auc(tokens_frame([_result("nasd", rounds)]))
    assert n == 1 and math.isnan(auc)
    assert "all kept, or all refused" in acceptance.describe_auc(auc, n)
    assert acceptance.describe_auc(0.7123, 2310) == "entropy ranks acceptances with AUC 0.71 (n = 2,310)"


def test_entropy_bins_count_rate_and_wilson_band():
    rounds = [_round(i, [0.05], 1 if i < 3 else 0) for i in range(4)] + [_round(9, [0.95], 0)]
    bins = acceptance.entropy_bins(tokens_frame([_result("sd", rounds)]), bins=10)
    assert list(bins.columns) == acceptance.ENTROPY_BIN_COLUMNS
    low, high = bins.iloc[0], bins.iloc[1]
    assert (low["count"], low.accepted, low.rate, low.entropy_low) == (4, 3, 0.75, 0.0)
    assert (high["count"], high.rate, high.entropy_high) == (1, 0.0, 1.0)
    # Wilson 95 % for 3/4, by its closed form.
    z, n, p = 1.959963984540054, 4, 0.75
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    assert (low.rate_low, low.rate_high) == (pytest.approx(centre - half), pytest.approx(centre + half))


def test_position_acceptance_is_per_round_that_drafted_that_far():
    rounds = [_round(0, [0.1, 0.1, 0.1], 3), _round(1, [0.1, 0.1, 0.1], 1), _round(2, [0.1], 0)]
    table = acceptance.position_acceptance(tokens_frame([_result("sd", rounds), _result("ar", [])]))
    assert table.position.tolist() == [1, 2, 3]
    assert table.drafted.tolist() == [3, 2, 2] and table.accepted.tolist() == [2, 1, 1]
    assert table.rate.tolist() == pytest.approx([2 / 3, 0.5, 0.5])


def test_break_even_prices_a_round_in_ar_steps():
    even = acceptance.BreakEven.measure(draft_seconds=4.0, verify_seconds=6.0, rounds=10, drafted=40,
                                        new_tokens=25, alpha=0.5, ar_step_seconds=0.5)
    # c = 4 / 40 / 0.5 = 0.2 per draft, v = 6 / 10 / 0.5 = 1.2 per round, γ = 4 → 0.8 + 1.2 = 2.0 steps.
    assert (even.draft_cost, even.verify_cost, even.gamma) == pytest.approx((0.2, 1.2, 4.0))
    assert even.needed == pytest.approx(2.0) and even.obtained == 2.5 > even.needed
    assert even.predicted_speedup() == pytest.approx((1 - 0.5 ** 5) / 0.5 / 2.0)
    assert even.predicted_speedup(1.0) == pytest.approx(5 / 2.0)
    assert "needs 2.00 tokens per round" in even.sentence() and "got 2.50" in even.sentence()
    # Where the predicted curve crosses AR: expected tokens (1 − α⁵)/(1 − α) = 2.
    assert even.predicted_speedup(even.alpha_needed) == pytest.approx(1.0)
    assert f"α ≥ {even.alpha_needed:.2f}" in even.sentence()
    assert acceptance.BreakEven.measure(draft_seconds=1, verify_seconds=1, rounds=3, drafted=0, new_tokens=3,
                                        alpha=math.nan, ar_step_seconds=0.1) is None


def test_tokens_frame_has_a_row_per_drafted_token_of_a_real_run(tiny_pair):
    results = [specdemo.generate(tiny_pair, "w5 w6 w7 w8", method=m, max_new_tokens=20, gamma=3, copy_n=0)
               for m in ("ar", "sd", "nasd")]
    tokens = tokens_frame(results)
    assert list(tokens.columns) == TOKEN_COLUMNS
    for result in results:
        mine = tokens[tokens.method == result.method]
        assert len(mine) == sum(len(r.drafted) for r in result.rounds)
        assert mine.accepted.sum() == sum(r.accepted for r in result.rounds)
        per_round = mine.groupby("round").position.max()
        assert per_round.to_dict() == {r.index: len(r.drafted) for r in result.rounds if r.drafted}
    sd = tokens[tokens.method == "sd"]
    assert sd.entropy.notna().all() and not sd.point_mass.any()
    assert tokens[tokens.method == "nasd"].point_mass.all()
    summary = summary_frame(results).set_index("method")
    auc, n = acceptance.entropy_auc(sd)
    assert summary.loc["sd", "entropy_auc_n"] == n == sd.decided.sum()
    assert summary.loc["nasd", "entropy_auc_n"] == 0


def test_benchmark_keeps_each_drafted_token_and_its_report_draws_why(tiny_pair, frozen_heap, tmp_path):
    from specdemo import bench

    suite = [{"prompt": "w5 w6 w7 w8", "category": "chat"}]
    result = bench.run_benchmark(tiny_pair, suite, ["ar", "sd", "nasd"], repeats=1, warmup=False, max_new_tokens=12,
                                 gamma=3, copy_n=0)
    tokens = result.tokens
    assert list(tokens.columns) == bench.measure.benchmark.TOKEN_COLUMNS
    assert set(tokens.method) == {"sd", "nasd"} and (tokens.category == "chat").all()
    for method in ("sd", "nasd"):
        row = result.rows[result.rows.method == method].iloc[0]
        assert (tokens.method == method).sum() == row.drafted
        assert tokens[tokens.method == method].accepted.sum() == row.accepted
    overall = result.summary[result.summary.category == bench.ALL].set_index("method")
    sd_tokens = tokens[tokens.method == "sd"]
    assert overall.loc["sd", "entropy_auc_n"] == sd_tokens.decided.sum() > 0
    assert overall.loc["sd", "break_even_tokens"] > 0 and overall.loc["ar", "break_even_tokens"] != overall.loc["ar", "break_even_tokens"]
    assert {"entropy_acceptance", "position_acceptance", "break_even"} <= set(bench.make_figures(result))
    csv = tmp_path / "rows.csv"
    written = bench.write_outputs(result, csv=csv, report=tmp_path / "report.html", plotlyjs="cdn")
    assert tmp_path / "rows.tokens.csv" in written
    again = bench.load_result(csv)
    assert len(again.tokens) == len(tokens)
    page = (tmp_path / "report.html").read_text()
    assert "fig-entropy_acceptance" in page and "fig-position_acceptance" in page and "fig-break_even" in page


def test_break_even_below_one_step_is_reached_at_any_acceptance():
    cheap = acceptance.BreakEven(draft_cost=0.0, verify_cost=0.9, gamma=2.0, obtained=1.1, alpha=0.05)
    assert cheap.alpha_needed == 0.0 and "at any α" in cheap.sentence()
    dear = acceptance.BreakEven(draft_cost=1.0, verify_cost=1.0, gamma=2.0, obtained=1.1, alpha=0.05)
    assert math.isnan(dear.alpha_needed) and "no α reaches it" in dear.sentence() and dear.obtained <= dear.needed


def test_a_sweep_keeps_each_drafted_token_and_names_the_auc_beside_egag(tiny_pair, frozen_heap, tmp_path):
    from specdemo.bench import sweep

    settings = sweep.expand_grid(gamma=[2], gamma_max=[3], ema=[0.0], ngram_n=[3], copy_n=[0])
    result = sweep.run_sweep(tiny_pair, ["w5 w6 w7 w8", "w9 w10 w11"], settings, repeats=1, warmup=False,
                             max_new_tokens=12)
    tokens = result.tokens
    assert list(tokens.columns) == sweep.runner.TOKEN_COLUMNS
    for key, part in result.rows.groupby("setting"):
        assert (tokens.setting == key).sum() == part.drafted.sum()
    auc, n = acceptance.entropy_auc(tokens[tokens.method.isin(["sd", "egag"])])
    assert n > 0 and acceptance.describe_auc(auc, n) in result.verdict
    assert result.verdict.index("EGAG") < result.verdict.index("entropy")
    written = sweep.write_outputs(result, report=tmp_path / "r.html", tokens_csv=tmp_path / "tokens.csv",
                                  plotlyjs="cdn")
    assert len(pd.read_csv(tmp_path / "tokens.csv")) == len(tokens) and len(written) == 2
    page = (tmp_path / "r.html").read_text()
    assert all(f'id="fig-{name}"' in page for name in ("entropy_acceptance", "position_acceptance", "break_even"))
    assert set(result.why_figures()) == {"entropy_acceptance", "position_acceptance", "break_even"}


def test_the_command_line_writes_the_per_token_csvs(tiny_pair, frozen_heap, tmp_path, capsys):
    from specdemo import cli

    models = ["--target", tiny_pair.target_ref, "--draft", tiny_pair.draft_ref, "--device", "cpu", "--dtype", "float64"]
    tokens_csv, trace_csv = tmp_path / "tokens.csv", tmp_path / "trace.csv"
    assert cli.main(["compare", "--prompt", "w5 w6 w7 w8", *models, "--methods", "ar,sd", "--max-new-tokens", "12",
                     "--copy-n", "0", "--tokens-csv", str(tokens_csv), "--trace-csv", str(trace_csv)]) == 0
    out = capsys.readouterr().out
    tokens, trace = pd.read_csv(tokens_csv), pd.read_csv(trace_csv)
    assert list(tokens.columns) == TOKEN_COLUMNS and len(tokens) == trace.n_drafted.sum()
    assert set(tokens[tokens.method == "sd"].accepted) == {True, False}, "SD's drafts were kept and refused"
    assert "SD: entropy ranks acceptances with AUC" in out
    assert "to match AR; it got" in out

    suite = tmp_path / "suite.jsonl"
    suite.write_text('{"prompt": "w5 w6 w7 w8", "category": "chat"}\n')
    bench_tokens = tmp_path / "bench-tokens.csv"
    assert cli.main(["bench", *models, "--suite", str(suite), "--methods", "ar,sd", "--repeats", "1", "--no-warmup",
                     "--max-new-tokens", "8", "--tokens-csv", str(bench_tokens), "--quiet"]) == 0
    assert set(pd.read_csv(bench_tokens).method) == {"sd"}


def test_the_command_line_says_entropy_cannot_rank_drafts_that_were_all_kept(tiny_pair, frozen_heap, capsys):
    """The target drafting for itself, greedily: every draft is kept, so entropy has nothing to rank."""
    from specdemo import cli

    models = ["--target", tiny_pair.target_ref, "--draft", tiny_pair.target_ref, "--device", "cpu",
              "--dtype", "float64"]
    assert cli.main(["compare", "--prompt", "w5 w6 w7 w8", *models, "--methods", "ar,sd", "--max-new-tokens", "12",
                     "--copy-n", "0"]) == 0
    assert "SD: entropy cannot rank acceptances: the" in capsys.readouterr().out
