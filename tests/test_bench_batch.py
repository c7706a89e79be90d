"""Batch size as an axis of the benchmark: how prompts are cut into batches, the per-size summary
(throughput over the batches' wall time, latency and TTFT percentiles, the ratio to AR with its
interval), where the ratio crosses below one, the verdict, the charts, and `bench --batch` end to end
on the tiny pair. No timing thresholds: constructed tables carry the numbers the rules are checked on."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from specdemo import bench, cli
from specdemo.bench.measure.batch_charts import batch_figures, ratio_figure, throughput_figure
from specdemo.bench.measure.batching import (
    BATCH_COLUMNS, BATCH_SUMMARY_COLUMNS, MIN_BATCHES, batch_turns, batch_verdict, crossover, cut_into_batches,
    parse_batch_sizes, pays_up_to, ratio_interval, summarize_batches,
)

SUITE = [{"prompt": f"w{i} w{i + 1} w{i + 2} w{i + 3}", "category": "chat"} for i in (5, 11, 17)]


def test_batch_sizes_parse_to_distinct_whole_numbers_smallest_first():
    assert parse_batch_sizes("4,1,2,2") == [1, 2, 4]
    assert parse_batch_sizes(None) == parse_batch_sizes("") == [1]
    assert parse_batch_sizes([8, 2]) == [2, 8]
    for bad in ("0", "two", "1,-2", "1.5"):
        with pytest.raises(ValueError, match="batch sizes"):
            parse_batch_sizes(bad)


def test_prompts_are_cut_into_full_batches_and_every_prompt_runs():
    assert cut_into_batches(5, 2) == [[0, 1], [2, 3], [4, 0]]
    assert cut_into_batches(3, 8) == [[0, 1, 2, 0, 1, 2, 0, 1]]
    for count, size in ((7, 3), (4, 4), (1, 16)):
        batches = cut_into_batches(count, size)
        assert all(len(b) == size for b in batches)
        assert set().union(*batches) == set(range(count))


def test_methods_alternate_batch_by_batch():
    """Every batch is run by every method, and the first to run moves one place each batch."""
    turns = list(batch_turns(4, [1, 2], ["ar", "sd", "egag"], repeats=2))
    assert len(turns) == 2 * (4 + 2)
    assert all(sorted(order) == ["ar", "egag", "sd"] for *_, order in turns)
    firsts = [order[0] for *_, order in turns]
    assert all(a != b for a, b in zip(firsts, firsts[1:]))
    assert {size for _, size, *_ in turns} == {1, 2}


def test_ratio_is_of_pooled_throughputs_with_an_interval_around_it():
    tokens, seconds = [10, 12, 8, 10], [1.0, 1.0, 1.0, 1.0]
    ref_tokens, ref_seconds = [10, 10, 10, 10], [2.0, 2.2, 1.8, 2.0]
    point, low, high = ratio_interval(tokens, seconds, ref_tokens, ref_seconds)
    assert point == pytest.approx((40 / 4) / (40 / 8))
    assert low <= point <= high and low < high
    assert low > 1.0  # every batch ran at about twice AR's throughput


def test_no_interval_under_the_minimum_of_batches():
    point, low, high = ratio_interval([10] * (MIN_BATCHES - 1), [1.0] * (MIN_BATCHES - 1),
                                      [10] * (MIN_BATCHES - 1), [2.0] * (MIN_BATCHES - 1))
    assert point == pytest.approx(2.0) and math.isnan(low) and math.isnan(high)
    with pytest.raises(ValueError, match="one value per paired batch"):
        ratio_interval([1, 2], [1], [1, 2], [1, 2])


def rows_for(batches: dict[str, list[tuple[int, float]]], size: int) -> pd.DataFrame:
    """Rows of `size` requests per batch: each method's batches as (new tokens per request, batch seconds)."""
    rows = []
    for method, runs in batches.items():
        for index, (tokens, wall) in enumerate(runs):
            for row in range(size):
                rows.append({"method": method, "label": method.upper(), "repeat": 0, "batch": size,
                             "batch_index": index, "batch_row": row, "batch_seconds": wall, "new_tokens": tokens,
                             "seconds": wall * (row + 1) / size, "ttft_s": 0.01 * (row + 1), "drafted": 4,
                             "accepted": 2, "rounds": 2, "error": ""})
    return pd.DataFrame(rows)


def test_summary_gives_throughput_latency_ttft_and_ratio_per_batch_size():
    rows = pd.concat([rows_for({"ar": [(10, 1.0)] * 3, "sd": [(10, 0.5)] * 3}, 1),
                      rows_for({"ar": [(10, 1.0)] * 3, "sd": [(10, 2.0)] * 3}, 4)], ignore_index=True)
    summary = summarize_batches(rows)
    assert list(summary.columns) == BATCH_SUMMARY_COLUMNS
    assert list(zip(summary.batch, summary.method)) == [(1, "ar"), (1, "sd"), (4, "ar"), (4, "sd")]
    four = summary[(summary.batch == 4) & (summary.method == "ar")].iloc[0]
    assert four.throughput_tokens_per_s == pytest.approx(4 * 10 * 3 / 3.0)  # all rows' tokens ÷ the batches' wall
    assert four.requests == 12 and four.batches == 3
    assert four.latency_p50_s == pytest.approx(pd.Series([0.25, 0.5, 0.75, 1.0] * 3).quantile(0.5))
    assert four.latency_p95_s == pytest.approx(pd.Series([0.25, 0.5, 0.75, 1.0] * 3).quantile(0.95))
    assert four.ttft_p50_s == pytest.approx(0.025)
    ratios = summary.set_index(["batch", "method"]).throughput_vs_ar
    assert ratios[(1, "sd")] == pytest.approx(2.0) and ratios[(4, "sd")] == pytest.approx(0.5)
    assert ratios[(1, "ar")] == pytest.approx(1.0)
    assert summary.acceptance_rate.dropna().eq(0.5).all()


def test_draft_seconds_per_round_are_a_batch_rounds_drafting_read_off_its_longest_row():
    rows = rows_for({"sd": [(10, 1.0)] * 2}, 2)
    # Each row's draft seconds are its rounds' drafting; the second row ran 4 rounds, the first 2 of them.
    rows["rounds"] = [2, 4, 2, 4]
    rows["draft_seconds"] = [0.2, 0.8, 0.2, 0.4]
    summary = summarize_batches(rows, reference="sd")
    assert summary.draft_seconds_per_round.iloc[0] == pytest.approx((0.8 / 4 + 0.4 / 4) / 2)


def test_a_failed_batch_counts_as_errors_not_as_throughput():
    rows = rows_for({"ar": [(10, 1.0)] * 3, "sd": [(10, 0.5)] * 3}, 2)
    rows.loc[(rows.method == "sd") & (rows.batch_index == 0), "error"] = "ValueError: refused"
    sd = summarize_batches(rows).set_index("method").loc["sd"]
    assert sd.errors == 2 and sd.requests == 4 and sd.batches == 2


def summary_of(ratios: dict[str, dict[int, tuple[float, float, float]]]) -> pd.DataFrame:
    """A batch summary with these (ratio, low, high) per method and batch size, AR at 1 everywhere."""
    rows = []
    sizes = sorted({b for per in ratios.values() for b in per})
    for size in sizes:
        rows.append({"batch": size, "method": "ar", "label": "AR", "throughput_vs_ar": 1.0,
                     "throughput_vs_ar_low": 1.0, "throughput_vs_ar_high": 1.0, "throughput_tokens_per_s": 100.0 * size})
        for method, per in ratios.items():
            ratio, low, high = per[size]
            rows.append({"batch": size, "method": method, "label": method.upper(), "throughput_vs_ar": ratio,
                         "throughput_vs_ar_low": low, "throughput_vs_ar_high": high,
                         "throughput_tokens_per_s": 100.0 * size * ratio})
    return pd.DataFrame(rows, columns=BATCH_SUMMARY_COLUMNS)


CROSSING = summary_of({
    "sd": {1: (1.6, 1.4, 1.8), 2: (1.3, 1.1, 1.5), 4: (1.05, 0.9, 1.2), 8: (0.8, 0.7, 0.9)},
    "egag": {1: (1.7, 1.5, 1.9), 2: (1.2, 1.05, 1.3), 4: (0.9, 0.8, 1.0), 8: (0.7, 0.6, 0.8)},
})


def test_crossover_is_the_first_batch_size_below_one():
    assert crossover(CROSSING, "sd") == 8
    assert crossover(CROSSING, "egag") == 4
    assert crossover(CROSSING, "ar") is None


def test_verdict_names_the_largest_batch_size_whose_interval_lies_above_one():
    best = pays_up_to(CROSSING)
    assert (best.batch, best.method) == (2, "sd")  # SD's 1.3 beats EGAG's 1.2 at batch 2, the largest that pays
    text = batch_verdict(CROSSING)
    assert text.startswith("Drafting still pays up to batch 2 here: SD reaches 1.30× AR's throughput")
    assert "(95% interval 1.10–1.50)" in text and "From batch 8 its throughput falls below AR's (0.80×)" in text


def test_verdict_says_none_when_no_interval_lies_above_one():
    losing = summary_of({"sd": {1: (0.9, 0.8, 1.1), 4: (0.5, 0.4, 0.6)}})
    assert pays_up_to(losing) is None
    text = batch_verdict(losing)
    assert text.startswith("Drafting pays at none of the batch sizes measured here (1, 4)")
    assert "SD at batch 1, 0.90×" in text
    no_interval = summary_of({"sd": {1: (1.5, math.nan, math.nan)}})
    assert "give no interval" in batch_verdict(no_interval)
    assert batch_verdict(summary_of({})).startswith("No batch verdict")


def test_ratio_chart_marks_the_line_at_one_and_the_crossover():
    fig = ratio_figure(CROSSING)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == ["SD", "EGAG"]  # the drafting methods only, AR is the line at 1
    assert list(lines[0].x) == [1, 2, 4, 8] and lines[0].error_y.array is not None
    crossings = {t.name: (list(t.x), list(t.y)) for t in fig.data if t.mode == "markers"}
    assert crossings == {"SD: below AR from batch 8": ([8], [0.8]), "EGAG: below AR from batch 4": ([4], [0.9])}
    assert any(shape.y0 == 1.0 and shape.y1 == 1.0 for shape in fig.layout.shapes)
    assert {a.text for a in fig.layout.annotations} >= {"SD < AR from batch 8", "EGAG < AR from batch 4"}
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [1, 2, 4, 8]


def test_throughput_chart_has_every_method():
    fig = throughput_figure(CROSSING)
    assert [t.name for t in fig.data] == ["AR", "SD", "EGAG"]
    assert list(fig.data[0].y) == [100.0, 200.0, 400.0, 800.0]
    assert set(batch_figures(CROSSING)) == {"batch_ratio", "batch_throughput"}


@pytest.fixture(scope="module")
def batched(tiny_pair):
    return bench.run_benchmark(tiny_pair, SUITE, "ar,sd,hf-generate", repeats=1, batch="1,2",
                               max_new_tokens=8, warmup=False)


@pytest.mark.usefixtures("one_thread")
def test_every_row_carries_its_batch(batched):
    rows = batched.rows
    assert list(rows.columns) == bench.ROW_COLUMNS and set(BATCH_COLUMNS) <= set(rows.columns)
    assert (rows.error == "").all()
    assert sorted(rows.batch.unique()) == [1, 2]
    two = rows[rows.batch == 2]
    # Three prompts in batches of two: the second batch takes the first prompt again.
    assert sorted(two[two.method == "ar"].prompt_index) == [0, 0, 1, 2]
    assert set(two.method) == {"ar", "sd"}  # transformers' generate takes one request: batch 1 only
    assert "batch 1 only" in batched.meta["batch_one_only"]["hf-generate"]
    one = rows[rows.batch == 1]
    assert len(one) == 3 * 3 and (one.batch_seconds == one.seconds).all()
    # A batch's rows share its wall time; each row's latency is at most that.
    assert (two.groupby(["method", "batch_index"]).batch_seconds.nunique() == 1).all()
    assert (two.seconds <= two.batch_seconds + 1e-9).all()
    assert rows.matches_ar.dropna().astype(bool).all()  # greedy rows equal AR's, alone or in a batch


@pytest.mark.usefixtures("one_thread")
def test_result_summarises_each_batch_size(batched):
    batches = batched.batches
    assert list(zip(batches.batch, batches.method)) == [(1, "ar"), (1, "sd"), (1, "hf-generate"), (2, "ar"), (2, "sd")]
    assert batches.throughput_tokens_per_s.gt(0).all()
    assert batches.latency_p50_s.le(batches.latency_p95_s).all() and batches.ttft_p50_s.notna().any()
    assert batches[batches.method == "ar"].throughput_vs_ar.eq(1.0).all()
    assert batched.summary.runs.max() == len(SUITE)  # the per-category summary reads batch 1's rows


@pytest.mark.usefixtures("one_thread")
def test_bench_command_takes_batch_sizes(tiny_pair, tmp_path, capsys):
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps(item) + "\n" for item in SUITE), encoding="utf-8")
    csv, report = tmp_path / "out" / "rows.csv", tmp_path / "out" / "report.html"
    code = cli.main(["bench", "--target", tiny_pair.target_ref, "--draft", tiny_pair.draft_ref, "--device", "cpu",
                     "--dtype", "float64", "--suite", str(suite), "--methods", "ar,sd", "--batch", "2,1",
                     "--max-new-tokens", "6", "--repeats", "1", "--no-warmup", "--csv", str(csv), "--report",
                     str(report), "--plotlyjs", "cdn", "--quiet"])
    out = capsys.readouterr().out
    assert code == 0
    assert "throughput_vs_ar_low" in out and "Drafting" in out
    table = pd.read_csv(tmp_path / "out" / "rows.batch.csv")
    assert list(table.columns) == BATCH_SUMMARY_COLUMNS and sorted(table.batch.unique()) == [1, 2]
    assert sorted(pd.read_csv(csv).batch.unique()) == [1, 2]
    page = report.read_text(encoding="utf-8")
    assert "<h2>Batch sizes</h2>" in page and 'id="fig-batch_ratio"' in page and 'id="fig-batch_throughput"' in page
    assert bench.load_result(csv).batches.batch.tolist() == table.batch.tolist()
    assert cli.main(["bench", "--batch", "1,0", "--target", tiny_pair.target_ref, "--device", "cpu"]) == 2
    assert "batch sizes must be whole numbers ≥ 1" in capsys.readouterr().err


def test_the_yardsticks_are_the_registry_s_methods_that_draft_nothing_and_the_peers():
    from specdemo.bench.measure.batching import NOT_DRAFTING

    assert NOT_DRAFTING == {"ar", "beam", "draft", "ar-nocache", "torch-ar", "hf-generate", "hf-generate-static",
                            "onnx-generate"}
