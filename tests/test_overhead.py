"""SD round overhead: round time ÷ (γ draft steps + one verification forward, each timed alone).
The arithmetic on hand-made rounds; the measurement and the command on the tiny pairs. No timing
thresholds: only structure, accounting, and numbers that are finite and positive."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from specdemo import cli
from specdemo.bench import overhead
from specdemo.bench.overhead import (OVERHEAD_COLUMNS, PromptRounds, StepCosts, measure_round_overhead,
                                     overhead_table, spread_over_categories)
from specdemo.bench.suite import SuitePrompt
from specdemo.engine.trace import Round
from tests.test_bench import model_args, write_suite
from tests.test_feature_drafter import with_head

pytestmark = pytest.mark.usefixtures("one_thread")

GAMMA = 3
PROMPTS = [("repeats", [1, 5, 9, 13, 5, 9, 13, 5]), ("counts", [1, 20, 21, 22, 23])]
RATIOS = ["round_overhead", "draft_overhead", "verify_overhead"]


@pytest.fixture(scope="module")
def head_pair(tiny_pair):
    return with_head(tiny_pair, list(range(0, 64, 2)) + [3, 5, 7, 9])


def a_round(drafted: int, draft_seconds: float, verify_seconds: float) -> Round:
    return Round(index=0, gamma=GAMMA, entropy=None, drafted=[7] * drafted, accepted=drafted, next_token=8,
                 draft_entropies=[], draft_seconds=draft_seconds, verify_seconds=verify_seconds, end_seconds=0.0)


def test_only_rounds_that_drafted_gamma_tokens_count_and_the_arithmetic_is_exact():
    costs = StepCosts(draft_step=0.001, verify_forward=0.004)  # alone: 3 × 1 ms + 4 ms = 7 ms
    first = PromptRounds("first", [a_round(3, 0.004, 0.005), a_round(3, 0.002, 0.005),
                                   a_round(1, 0.100, 0.100), a_round(0, 0.100, 0.100)], costs, 10)
    second = PromptRounds("second", [a_round(3, 0.006, 0.008)], StepCosts(0.002, 0.004), 20)
    table = overhead_table([first, second], GAMMA).set_index("prompt")

    assert list(table.reset_index().columns) == OVERHEAD_COLUMNS
    assert list(table.index) == ["first", "second", "all"]
    row = table.loc["first"]
    assert row.rounds == 2  # the 1-draft and 0-draft rounds are left out
    assert row.draft_phase_seconds == pytest.approx(0.003)
    assert row.verify_phase_seconds == pytest.approx(0.005)
    assert row.round_seconds == pytest.approx(0.008)
    assert row.isolated_round_seconds == pytest.approx(0.007)
    assert row.round_overhead == pytest.approx(8 / 7)
    assert row.draft_overhead == pytest.approx(1.0)
    assert row.verify_overhead == pytest.approx(5 / 4)

    second_row = table.loc["second"]
    assert second_row.isolated_round_seconds == pytest.approx(3 * 0.002 + 0.004)
    assert second_row.round_overhead == pytest.approx(0.014 / 0.010)

    # "all" pools the three full rounds: their time over what their calls take alone.
    everything = table.loc["all"]
    assert everything.rounds == 3
    assert everything.round_seconds == pytest.approx((0.009 + 0.007 + 0.014) / 3)
    assert everything.isolated_round_seconds == pytest.approx((2 * 0.007 + 0.010) / 3)
    assert everything.round_overhead == pytest.approx(0.030 / 0.024)
    assert everything.draft_overhead == pytest.approx((0.004 + 0.002 + 0.006) / (2 * 0.003 + 0.006))
    assert everything.verify_overhead == pytest.approx((0.005 + 0.005 + 0.008) / (2 * 0.004 + 0.004))
    assert everything.context_tokens == pytest.approx((2 * 10 + 20) / 3)


def test_a_prompt_without_full_rounds_has_no_ratio_and_weighs_nothing_in_all():
    costs = StepCosts(0.001, 0.004)
    table = overhead_table([PromptRounds("short", [a_round(2, 1.0, 1.0)], costs, 5),
                            PromptRounds("full", [a_round(3, 0.003, 0.004)], costs, 9)], GAMMA).set_index("prompt")
    assert table.loc["short"].rounds == 0
    assert all(math.isnan(table.loc["short", ratio]) for ratio in RATIOS)
    assert table.loc["all", "round_overhead"] == pytest.approx(1.0)
    assert table.loc["all", "context_tokens"] == 9


def test_prompts_are_spread_over_categories():
    suite = [SuitePrompt(f"{c}-{i}", c, "w5") for c in ("chat", "math", "code") for i in (1, 2)]
    assert [p.id for p in spread_over_categories(suite, 4)] == ["chat-1", "math-1", "code-1", "chat-2"]
    assert len(spread_over_categories(suite, 99)) == len(suite)


def assert_measured(table: pd.DataFrame) -> None:
    assert list(table.columns) == OVERHEAD_COLUMNS
    assert list(table.prompt) == [name for name, _ in PROMPTS] + ["all"]
    assert (table.rounds > 0).all()
    timed = [c for c in OVERHEAD_COLUMNS if c.endswith("_seconds")] + RATIOS
    values = table[timed].to_numpy(dtype=float)
    assert (values > 0).all() and pd.notna(values).all() and (values < math.inf).all()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_draft_lm_pair_is_measured_on_its_full_rounds(tiny_pair, cache, monkeypatch):
    runs = []
    real_generate = overhead.generate

    def recording_generate(*args, **kwargs):
        runs.append(real_generate(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(overhead, "generate", recording_generate)
    report = measure_round_overhead(tiny_pair, PROMPTS, gamma=GAMMA, max_new_tokens=24, cache=cache, calls=3)
    assert_measured(report.table)
    assert runs[0].cache == cache and all(r.method == "sd" and r.params["temperature"] == 0 for r in runs)
    # The first run warms up and is not counted; each prompt's row reads its own run's full rounds.
    for (name, _), run in zip(PROMPTS, runs[1:]):
        full = [r for r in run.rounds if len(r.drafted) == GAMMA]
        row = report.table.set_index("prompt").loc[name]
        assert row.rounds == len(full)
        assert row.round_seconds == pytest.approx(sum(r.draft_seconds + r.verify_seconds for r in full) / len(full))
    assert any(len(r.drafted) < GAMMA for run in runs for r in run.rounds), "some round was short, and left out"
    assert f"γ={GAMMA}" in report.summary and f"{cache} cache" in report.summary


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_feature_head_pair_is_measured(head_pair, cache):
    report = measure_round_overhead(head_pair, PROMPTS, gamma=GAMMA, max_new_tokens=24, cache=cache, calls=3)
    assert_measured(report.table)


@pytest.mark.slow
def test_compiled_steps_are_measured_with_the_loops_own_graphs(tmp_path_factory):
    """torch.compile on CPU (default mode): the isolated calls run the compiled steps too. One layer each: what
    runs compiled does not depend on depth, and compiling a graph takes longer the more layers it holds."""
    from tests.tiny import build_tiny_pair

    pair32 = build_tiny_pair(tmp_path_factory.mktemp("tiny32"), dtype="float32", draft_noise=0.3, layers=1)
    report = measure_round_overhead(pair32, PROMPTS, gamma=GAMMA, max_new_tokens=24, cache="static", compile=True,
                                    calls=3)
    assert_measured(report.table)
    assert "static cache, compiled" in report.summary


def test_a_pair_without_a_draft_is_refused(tiny_pair):
    import dataclasses

    with pytest.raises(ValueError, match="no draft"):
        measure_round_overhead(dataclasses.replace(tiny_pair, draft=None), PROMPTS)


SUITE = [{"prompt": "w5 w6 w7 w8 w5 w6 w7", "category": "summarisation"},
         {"prompt": "w20 w21 w22", "category": "chat"},
         {"prompt": "w11 w12 w13", "category": "chat"}]


def test_the_bench_flag_prints_the_table_and_writes_the_csv(tiny_pair, tmp_path, capsys):
    suite, csv = write_suite(tmp_path / "suite.jsonl", SUITE), tmp_path / "out" / "overhead.csv"
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--methods", "ar", "--repeats", "1",
                     "--max-new-tokens", "16", "--gamma", str(GAMMA), "--round-overhead", "--overhead-prompts", "2",
                     "--overhead-csv", str(csv), "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "tokens_per_s_mean" in out  # the comparison ran too
    assert "round_overhead" in out and "SD round overhead at γ=3" in out
    table = pd.read_csv(csv)
    assert list(table.columns) == OVERHEAD_COLUMNS
    # Two prompts, one category after another, then the pooled row.
    assert list(table.prompt) == ["summarisation-1", "chat-1", "all"]
    assert (table[RATIOS] > 0).all().all()


def test_overhead_only_skips_the_comparison_and_works_with_a_feature_head_folder(head_pair, tiny_pair, tmp_path,
                                                                                 capsys):
    head_dir = tmp_path / "head"
    head_pair.draft.save(head_dir, dtype=torch.float64)
    suite = write_suite(tmp_path / "suite.jsonl", SUITE)
    code = cli.main(["bench", "--target", tiny_pair.target_ref, "--draft", str(head_dir), "--device", "cpu",
                     "--dtype", "float64", "--suite", str(suite), "--max-new-tokens", "16", "--overhead-only",
                     "--overhead-prompts", "1", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "tokens_per_s_mean" not in captured.out
    assert "SD round overhead" in captured.out and "summarisation-1" in captured.out


def test_the_bench_flag_refuses_a_pair_without_a_draft_before_benchmarking(tiny_pair, tmp_path, capsys):
    suite, rows = write_suite(tmp_path / "suite.jsonl", SUITE), tmp_path / "rows.csv"
    code = cli.main(["bench", "--target", tiny_pair.target_ref, "--device", "cpu", "--dtype", "float64",
                     "--suite", str(suite), "--methods", "ar", "--round-overhead", "--csv", str(rows), "--quiet"])
    assert code == 2
    assert "--round-overhead measures SD rounds and this pair has no draft" in capsys.readouterr().err
    assert not rows.exists()


def test_overhead_only_refuses_outputs_it_would_not_write(tiny_pair, tmp_path, capsys):
    suite = write_suite(tmp_path / "suite.jsonl", SUITE)
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--overhead-only",
                     "--report", str(tmp_path / "r.html")])
    assert code == 2
    assert "--overhead-only skips the method comparison, so --report" in capsys.readouterr().err
