"""Rows against float32 AR: where a model runs below float32, each row's speed and output are set
against AR of the same target weights at float32, on the same prompt."""

from __future__ import annotations

import math

import pytest

import specdemo
from specdemo.bench.measure.compare import run_comparison
from specdemo.bench.measure.tables import SUMMARY_COLUMNS
from specdemo.bench.measure.vs_float32 import (VS_FLOAT32_COLUMNS, Float32Reference, load_float32_target, prefix_match,
                                       runs_below_float32, token_match)
from specdemo.engine.decoding import generate

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [1, 5, 9, 13, 17]
GREEDY = dict(max_new_tokens=12, temperature=0.0, seed=0)


def test_token_match_counts_equal_positions_and_prefix_match_stops_at_the_first_difference():
    assert token_match([1, 2, 3], [1, 2, 3]) == prefix_match([1, 2, 3], [1, 2, 3]) == 1.0
    # They part at the second token and meet again at the third: the match credits the meeting, the prefix does not.
    assert token_match([1, 9, 3, 4], [1, 2, 3]) == pytest.approx(2 / 4)
    assert prefix_match([1, 9, 3, 4], [1, 2, 3]) == pytest.approx(1 / 4)
    assert prefix_match([1, 2], [1, 2, 3, 4]) == pytest.approx(2 / 4)  # a shorter output stops short of the longer
    assert token_match([], []) == prefix_match([], []) == 1.0


@pytest.fixture(scope="module")
def folders(tiny_pair):
    return tiny_pair.target_ref, tiny_pair.draft_ref


def counting_loader(calls: list):
    def load(pair):
        calls.append(pair.target_ref)
        return load_float32_target(pair)
    return load


def test_a_bfloat16_target_is_set_against_ar_of_its_weights_loaded_at_float32(folders):
    pair = specdemo.load_pair(*folders, device="cpu", target_dtype="bfloat16", draft_dtype="float32")
    calls: list = []
    reference = Float32Reference(loader=counting_loader(calls))
    comparison = run_comparison(pair, PROMPT, ["ar", "sd"], vs_float32=reference, **GREEDY)

    assert calls == [folders[0]] and reference.runs == 1 and reference.seconds > 0
    expected = generate(specdemo.load_pair(folders[0], device="cpu", dtype="float32"), PROMPT, method="ar", **GREEDY)
    assert comparison.float32_ar.token_ids == expected.token_ids
    summary = comparison.summary.set_index("method")
    assert set(VS_FLOAT32_COLUMNS) <= set(SUMMARY_COLUMNS)
    for method in ("ar", "sd"):
        ids = next(r for r in comparison.results if r.method == method).token_ids
        assert summary.loc[method, "token_match_vs_fp32"] == token_match(ids, expected.token_ids)
        assert summary.loc[method, "prefix_match_vs_fp32"] == prefix_match(ids, expected.token_ids)
        assert 0 <= summary.loc[method, "chrf_vs_fp32"] <= 100
        speed = summary.loc[method, "tokens_per_s"] / comparison.float32_ar.stats["tokens_per_s"]
        assert summary.loc[method, "speedup_vs_fp32_ar"] == pytest.approx(speed)
    assert summary.loc["ar", "target_dtype"] == "bfloat16"


def test_a_float32_target_with_a_bfloat16_draft_is_its_own_reference(folders):
    pair = specdemo.load_pair(*folders, device="cpu", target_dtype="float32", draft_dtype="bfloat16")
    calls: list = []
    comparison = run_comparison(pair, PROMPT, ["ar", "sd"], vs_float32=Float32Reference(counting_loader(calls)),
                                **GREEDY)

    assert calls == []  # no second copy of the target, no extra run
    assert comparison.float32_ar is next(r for r in comparison.results if r.method == "ar")
    ar = comparison.summary.set_index("method").loc["ar"]
    assert ar.token_match_vs_fp32 == ar.prefix_match_vs_fp32 == 1.0
    assert ar.chrf_vs_fp32 == pytest.approx(100.0) and ar.speedup_vs_fp32_ar == pytest.approx(1.0)


def test_pairs_at_float32_or_above_run_no_reference_and_leave_the_columns_empty(tiny_pair):
    assert not runs_below_float32(tiny_pair)  # float64: above float32, nothing to compare with
    reference = Float32Reference(loader=counting_loader([]))
    comparison = run_comparison(tiny_pair, PROMPT, ["ar"], vs_float32=reference, **GREEDY)

    assert comparison.float32_ar is None and reference.runs == 0
    assert all(math.isnan(v) for v in comparison.summary[VS_FLOAT32_COLUMNS].iloc[0])


def test_the_page_table_shows_the_vs_fp32_columns_only_where_a_reference_ran(folders, tiny_pair):
    from specdemo.app import viz

    pair = specdemo.load_pair(*folders, device="cpu", target_dtype="bfloat16", draft_dtype="float32")
    below = run_comparison(pair, PROMPT, ["ar", "sd"], vs_float32=Float32Reference(), **GREEDY)
    table = viz.display_table(below.summary)
    assert set(viz.VS_FLOAT32_DISPLAY) <= set(table.columns)
    assert "speedup vs bfloat16 AR" in table.columns and "speedup vs AR" not in table.columns
    assert table["precision (target / draft)"].tolist() == ["bfloat16 / float32"] * 2

    plain = viz.display_table(run_comparison(tiny_pair, PROMPT, ["ar", "sd"], vs_float32=Float32Reference(),
                                             **GREEDY).summary)
    assert list(plain.columns) == viz.DISPLAY_COLUMNS


def test_the_playground_runs_a_reference_only_for_a_precision_below_float32_that_was_chosen(folders, monkeypatch):
    from types import SimpleNamespace

    from specdemo.app import handlers
    from specdemo.engine.params import DecodeParams

    pair = specdemo.load_pair(*folders, device="cpu", target_dtype="bfloat16", draft_dtype="float32")
    calls: list = []
    monkeypatch.setattr(handlers, "FLOAT32_REFERENCE", Float32Reference(counting_loader(calls)))
    decode = DecodeParams.resolve(None, **GREEDY)
    results = [generate(pair, PROMPT, method="ar", decode=decode)]
    default = SimpleNamespace(target_dtype=handlers.AUTO, draft_dtype=handlers.AUTO, params=decode)
    assert handlers.float32_reference(pair, default, results) == (None, "")

    chosen = SimpleNamespace(target_dtype="bfloat16", draft_dtype=handlers.AUTO, params=decode)
    float32_ar, note = handlers.float32_reference(pair, chosen, results)
    assert calls == [folders[0]] and float32_ar.method == "ar" and "counted in no row" in note


BENCH_SUITE = [{"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "summarisation"},
               {"prompt": "w11 w12 w13", "category": "chat"}]


def test_the_benchmark_sets_each_method_against_float32_ar_per_prompt_and_repeat(folders):
    from specdemo.bench import run_benchmark

    pair = specdemo.load_pair(*folders, device="cpu", target_dtype="bfloat16", draft_dtype="float32")
    reference = Float32Reference(counting_loader(calls := []))
    result = run_benchmark(pair, BENCH_SUITE, ["ar", "sd"], repeats=2, warmup=False, vs_float32=reference,
                           max_new_tokens=8, temperature=0.0, chat=False)

    assert calls == [folders[0]] and reference.runs == 4  # one float32 AR per prompt and repeat, loaded once
    assert result.meta["target_dtype"] == "bfloat16" and "copy" in result.meta["fp32_reference"]
    rows = result.rows
    float32 = specdemo.load_pair(folders[0], device="cpu", dtype="float32")
    for _, row in rows.iterrows():
        ids = [int(t) for t in row.output_ids.split()]
        expected = generate(float32, pair.encode(BENCH_SUITE[row.prompt_index]["prompt"]), method="ar",
                            max_new_tokens=8, temperature=0.0).token_ids
        assert row.token_match_vs_fp32 == token_match(ids, expected) and row.fp32_ar_new_tokens == len(expected)
    overall = result.summary[result.summary.category == "all"].set_index("method")
    assert overall.loc["ar", "token_match_vs_fp32"] == pytest.approx(rows[rows.method == "ar"].token_match_vs_fp32.mean())
    assert overall.speedup_vs_fp32_ar.notna().all()


def test_the_benchmark_of_a_float32_pair_adds_nothing(tiny_pair):
    from specdemo.bench import run_benchmark

    reference = Float32Reference(counting_loader([]))
    result = run_benchmark(tiny_pair, BENCH_SUITE[:1], ["ar"], repeats=1, warmup=False, vs_float32=reference,
                           max_new_tokens=4, temperature=0.0, chat=False)
    assert reference.runs == 0 and "fp32_reference" not in result.meta
    assert result.summary[VS_FLOAT32_COLUMNS].isna().all().all()


@pytest.mark.parametrize("flags, shown", [([], True), (["--no-vs-fp32"], False)])
def test_the_compare_command_labels_the_precision_and_prints_the_vs_fp32_columns(folders, tmp_path, capsys, flags,
                                                                                 shown):
    import pandas as pd

    from specdemo import cli

    summary_csv = tmp_path / "summary.csv"
    assert cli.main(["compare", "--prompt", "w5 w6 w7 w8", "--target", folders[0], "--draft", folders[1], "--device",
                     "cpu", "--target-dtype", "bfloat16", "--draft-dtype", "float32", "--methods", "ar,sd",
                     "--max-new-tokens", "8", "--csv", str(summary_csv), *flags]) == 0
    out = capsys.readouterr().out
    assert "target bfloat16, draft float32: speedup_vs_ar is over AR with the bfloat16 target" in out
    assert ("speedup_vs_fp32_ar" in out) is shown and ("loaded beside it" in out) is shown
    assert bool(pd.read_csv(summary_csv).token_match_vs_fp32.notna().all()) is shown
