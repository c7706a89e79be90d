"""The page benchmark's arithmetic: page against engine per method, CPU per run, the Benchmark tab
against `bench`, from readings made up here (the timed runs themselves need a browser and minutes)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specdemo.bench import page


def page_run(speeds: dict[str, float], threads: int | dict = 1, browser: float = 1.0,
             server: float = 12.0, after: float = 0.0) -> page.PageRun:
    threads = threads if isinstance(threads, dict) else {method: threads for method in speeds}
    summary = pd.DataFrame({"method": list(speeds), "tokens_per_s": list(speeds.values()),
                            "new_tokens": [46] * len(speeds), "seconds": [46 / v for v in speeds.values()],
                            "threads": [threads[m] for m in speeds]})
    return page.PageRun(summary, wall_s=20.0, browser_cpu_s=browser, server_cpu_s=server, settle_cpu_s=after)


def engine(speeds: dict[tuple[int, str], list[float]], cpu: float = 2.0) -> page.EngineRuns:
    return page.EngineRuns(tokens_per_s=speeds, cpu_s={key: [cpu] for key in speeds},
                           new_tokens={method: 46 for _, method in speeds})


RUNS = [page_run({"ar": 10.0, "sd": 18.0}), page_run({"ar": 12.0, "sd": 19.0}), page_run({"ar": 11.0, "sd": 20.0})]
ENGINE = engine({(1, "ar"): [12.0, 11.0], (2, "ar"): [10.0], (1, "sd"): [19.0], (2, "sd"): [25.0, 24.0]})


def test_each_method_is_set_against_the_engines_best_thread_count_median_against_median():
    table = page.method_table(RUNS, ENGINE).set_index("method")
    assert table.at["ar", "page_tok_s"] == 11.0 and table.at["ar", "page_first_run_tok_s"] == 10.0
    # Not the single best engine run: the page's median meets the engine's median.
    assert (table.at["ar", "engine_best_tok_s"], table.at["ar", "engine_best_threads"]) == (11.5, 1)
    assert (table.at["sd", "engine_best_tok_s"], table.at["sd", "engine_best_threads"]) == (24.5, 2)
    assert table.at["sd", "page_over_engine"] == pytest.approx(19.0 / 24.5)
    # Speedups compare like with like: the engine's at the thread count the page decoded on.
    assert table.at["sd", "page_speedup"] == pytest.approx(19.0 / 11.0)
    assert table.at["sd", "engine_speedup"] == pytest.approx(19.0 / 11.5)
    assert table.at["sd", "speedup_page_over_engine"] == pytest.approx((19.0 / 11.0) / (19.0 / 11.5))



def spread_runs(runs: int) -> tuple[list[page.PageRun], page.EngineRuns]:
    """`runs` page runs and as many engine passes, each side spread evenly over the same ±5 %."""
    def spread(middle: float) -> list[float]:
        return [middle * (0.95 + 0.1 * k / (runs - 1)) for k in range(runs)]

    page_ar, page_sd, engine_ar, engine_sd = spread(11.0), spread(18.0), spread(11.5), spread(20.0)
    return ([page_run({"ar": ar, "sd": sd}) for ar, sd in zip(page_ar, page_sd)],
            engine({(1, "ar"): engine_ar, (1, "sd"): engine_sd}))


def width(row: pd.Series, ratio: str) -> float:
    return row[f"{ratio}_high"] - row[f"{ratio}_low"]


def test_each_ratio_has_a_bootstrap_interval_that_holds_it_and_narrows_with_more_runs():
    few, many = (page.method_table(*spread_runs(n)).set_index("method").loc["sd"] for n in (3, 15))
    for row in (few, many):
        assert row.page_over_engine_low <= row.page_over_engine <= row.page_over_engine_high
        assert row.speedup_page_over_engine_low <= row.speedup_page_over_engine <= row.speedup_page_over_engine_high
        # Never beyond what the runs can give: the slowest page run over the fastest engine pass, and back.
        assert row.page_over_engine_low >= 18.0 * 0.95 / (20.0 * 1.05) - 1e-12
        assert row.page_over_engine_high <= 18.0 * 1.05 / (20.0 * 0.95) + 1e-12
    assert width(many, "page_over_engine") < width(few, "page_over_engine")
    assert width(many, "speedup_page_over_engine") < width(few, "speedup_page_over_engine")


def test_the_same_runs_give_the_same_intervals():
    page_sd, engine_sd = [17.1, 18.4, 17.6, 19.0, 18.1, 17.3], [19.5, 20.8, 20.1, 19.2, 20.4, 21.0]
    runs = [page_run({"ar": 10.0 + k / 7, "sd": v}) for k, v in enumerate(page_sd)]
    passes = engine({(1, "ar"): [10.2, 11.1, 10.6, 10.9], (1, "sd"): engine_sd})
    assert page.method_table(runs, passes).equals(page.method_table(runs, passes))


def test_the_intervals_sit_right_after_their_ratios_and_leave_the_other_columns_in_place():
    columns = list(page.method_table(RUNS, ENGINE).columns)
    assert columns == ["method", "page_tok_s", "page_first_run_tok_s", "engine_1t_tok_s", "engine_2t_tok_s",
                       "engine_best_tok_s", "engine_best_threads", "page_over_engine", "page_over_engine_low",
                       "page_over_engine_high", "page_new_tokens", "engine_new_tokens", "page_threads",
                       "page_speedup", "engine_speedup", "speedup_page_over_engine",
                       "speedup_page_over_engine_low", "speedup_page_over_engine_high"]


def test_a_page_as_fast_as_the_engine_run_for_run_has_an_interval_around_one():
    speeds = [10.0, 10.5, 11.0, 11.5, 12.0]
    runs = [page_run({"ar": v, "sd": 2 * v}) for v in speeds]
    same = engine({(1, "ar"): speeds, (1, "sd"): [2 * v for v in speeds]})
    table = page.method_table(runs, same).set_index("method")
    for method in ("ar", "sd"):
        assert table.at[method, "page_over_engine"] == pytest.approx(1.0)
        assert table.at[method, "page_over_engine_low"] < 1.0 < table.at[method, "page_over_engine_high"]
    assert table.at["sd", "speedup_page_over_engine_low"] < 1.0 < table.at["sd", "speedup_page_over_engine_high"]


def test_one_run_on_either_side_gives_no_interval_and_no_error():
    one_page_run = page.method_table(RUNS[:1], ENGINE).set_index("method")
    assert one_page_run.page_over_engine_low.isna().all() and one_page_run.page_over_engine_high.isna().all()
    assert math.isnan(one_page_run.at["sd", "speedup_page_over_engine_low"])
    one_engine_pass = page.method_table(RUNS, engine({(1, "ar"): [11.0], (1, "sd"): [19.0]})).set_index("method")
    assert one_engine_pass.page_over_engine_low.isna().all()
    assert math.isnan(one_engine_pass.at["sd", "speedup_page_over_engine_high"])
    assert one_engine_pass.at["sd", "page_over_engine"] == pytest.approx(1.0)  # the ratio itself stays


def test_ars_speedup_over_itself_is_exactly_one_even_from_one_run():
    for runs in (RUNS[:1], RUNS):
        table = page.method_table(runs, ENGINE).set_index("method")
        assert (table.at["ar", "speedup_page_over_engine_low"], table.at["ar", "speedup_page_over_engine_high"]) == \
            (1.0, 1.0)

def test_a_page_with_threads_per_method_is_compared_with_the_engine_on_the_same_counts():
    runs = [page_run({"ar": 12.0, "sd": 24.0}, threads={"ar": 1, "sd": 2})]
    table = page.method_table(runs, ENGINE).set_index("method")
    assert table.at["sd", "engine_speedup"] == pytest.approx(24.5 / 11.5)  # SD at 2 threads over AR at 1
    assert table.at["sd", "page_speedup"] == pytest.approx(2.0)
    assert list(table.page_threads) == [1, 2]
    assert page.cost_table(runs, ENGINE).iloc[0].engine_cpu_s == pytest.approx(4.0)


def test_bench_runs_by_the_thread_plan_the_page_decoded_with_as_the_tab_does_for_suites():
    assert page.served_plan([page_run({"ar": 12.0, "sd": 24.0}, threads={"ar": 1, "sd": 2})]) == \
        page.ThreadPlan(count=None, cores=2)
    assert page.served_plan([page_run({"ar": 12.0, "sd": 24.0}, threads=2)]) == page.ThreadPlan(count=2)
    assert page.served_plan([page_run({"ar": 12.0, "sd": 24.0}, threads={"ar": 1, "sd": 2})]).for_suites() == \
        page.ThreadPlan(count=1)


def test_the_cost_of_drawing_is_the_browser_plus_the_servers_work_outside_the_decoders():
    run = page_run({"ar": 10.0, "sd": 18.0}, threads={"ar": 1, "sd": 2}, browser=1.0, server=12.0, after=3.0)
    run.server_threads_cpu_s = [6.0, 5.0, 0.3, 0.05, 0.0]  # SD decoded on two threads: the two busiest
    row = page.cost_table([run], ENGINE).iloc[0]
    decode = 46 / 10.0 + 46 / 18.0
    assert row.decode_s == pytest.approx(decode)
    assert row.server_outside_decoder_threads_s == pytest.approx(0.35)
    assert row.drawing_cpu_over_decode == pytest.approx((1.0 + 3.0 + 0.35) / decode)
    # The other reading: the server's CPU beyond the engine's median on the same decodes (summed per method).
    assert row.engine_cpu_s == pytest.approx(4.0)
    assert row.server_beyond_engine_s == pytest.approx(12.0 - 4.0)
    assert row.with_engine_gap_over_decode == pytest.approx((1.0 + 3.0 + 8.0) / decode)


def test_on_one_thread_the_decoder_is_the_one_busiest_thread():
    run = page_run({"ar": 10.0, "sd": 18.0})
    run.server_threads_cpu_s = [9.0, 0.3, 0.05]
    assert page.cost_table([run], ENGINE).iloc[0].server_outside_decoder_threads_s == pytest.approx(0.35)
    assert math.isnan(page.cost_table([page_run({"ar": 10.0})], ENGINE).iloc[0].drawing_cpu_over_decode)


def test_cpu_spent_counts_new_processes_from_zero_and_ignores_ended_ones():
    before = {1: 10.0, 2: 5.0, 3: 1.0}
    after = {1: 12.5, 2: 5.0, 4: 0.75}
    assert page.spent(before, after) == pytest.approx(2.5 + 0.0 + 0.75)


def test_the_benchmark_tab_is_read_against_bench_on_the_all_row():
    def summary(ar: float, sd: float) -> pd.DataFrame:
        return pd.DataFrame({"category": ["math", "all", "math", "all"], "method": ["ar", "ar", "sd", "sd"],
                             "tokens_per_s_mean": [0.0, ar, 0.0, sd], "speedup_vs_ar": [1, 1.0, 9, sd / ar]})

    table = page.bench_table(summary(10.0, 15.0), summary(11.0, 16.0)).set_index("method")
    assert table.at["sd", "tab_over_bench"] == pytest.approx(15.0 / 16.0)
    assert table.at["sd", "tab_speedup_vs_ar"] == pytest.approx(1.5)
    assert table.at["sd", "bench_speedup_vs_ar"] == pytest.approx(16.0 / 11.0)


def test_the_benchmark_tabs_ratio_has_an_interval_over_its_runs_where_both_runs_csvs_are_read():
    def summary(ar: float, sd: float) -> pd.DataFrame:
        return pd.DataFrame({"category": ["all", "all"], "method": ["ar", "sd"], "tokens_per_s_mean": [ar, sd],
                             "speedup_vs_ar": [1.0, sd / ar]})

    def rows(ar: list[float], sd: list[float], failed: float | None = None) -> pd.DataFrame:
        speeds = [("ar", v, "") for v in ar] + [("sd", v, "") for v in sd]
        speeds += [("sd", failed, "RuntimeError: out of memory")] if failed is not None else []
        return pd.DataFrame(speeds, columns=["method", "tokens_per_s", "error"])

    tab, cli = rows([9.0, 10.0, 11.0], [14.0, 15.0, 16.0]), rows([10.0, 11.0, 12.0], [15.0, 16.0, 17.0], failed=1.0)
    table = page.bench_table(summary(10.0, 15.0), summary(11.0, 16.0), tab, cli).set_index("method")
    for method in ("ar", "sd"):
        low, ratio, high = table.loc[method, ["tab_over_bench_low", "tab_over_bench", "tab_over_bench_high"]]
        assert low < ratio < high
    # A failed run's speed is not a speed: the interval is that of the timed runs alone.
    timed_only = page.bench_table(summary(10.0, 15.0), summary(11.0, 16.0), tab,
                                  rows([10.0, 11.0, 12.0], [15.0, 16.0, 17.0])).set_index("method")
    assert table.loc["sd", ["tab_over_bench_low", "tab_over_bench_high"]].tolist() == \
        timed_only.loc["sd", ["tab_over_bench_low", "tab_over_bench_high"]].tolist()
    assert "tab_over_bench_low" not in page.bench_table(summary(10.0, 15.0), summary(11.0, 16.0)).columns


def test_tables_print_as_markdown():
    text = page.markdown(pd.DataFrame({"method": ["ar"], "tok_s": [12.345], "missing": [math.nan]}))
    assert text.splitlines() == ["| method | tok_s | missing |", "|---|---|---|", "| ar | 12.35 | – |"]


def methods(**ratios: tuple[float, float, float]) -> pd.DataFrame:
    """A methods table as `method_table` returns it, reduced to the ratios `target_lines` reads:
    `ar`/`sd` = (page over engine, low, high), `sd_speedup` = (speedup ratio, low, high)."""
    ar, sd, speedup = ratios["ar"], ratios["sd"], ratios["sd_speedup"]
    return pd.DataFrame({"method": ["ar", "sd"], "page_over_engine": [ar[0], sd[0]],
                         "page_over_engine_low": [ar[1], sd[1]], "page_over_engine_high": [ar[2], sd[2]],
                         "speedup_page_over_engine": [1.0, speedup[0]],
                         "speedup_page_over_engine_low": [1.0, speedup[1]],
                         "speedup_page_over_engine_high": [1.0, speedup[2]]})


def test_each_target_is_said_met_or_not_and_how_firmly():
    ar, sd = page.target_lines(methods(ar=(0.95, 0.92, 0.98), sd=(0.93, 0.85, 1.0), sd_speedup=(0.85, 0.8, 0.89)))
    assert ar == "ar: page ÷ engine's best ≥ 0.9: met at 0.95 [0.92, 0.98] (interval low ≥ 0.9)"
    page_part, speedup_part = sd.split("; ")
    assert page_part == "sd: page ÷ engine's best ≥ 0.9: met at 0.93 [0.85, 1.00] (interval reaches below 0.9)"
    assert speedup_part == "speedup page ÷ engine ≥ 0.9: not met at 0.85 [0.80, 0.89] (interval high < 0.9)"
    _, sd = page.target_lines(methods(ar=(1.0, 0.9, 1.1), sd=(0.88, 0.8, 0.95), sd_speedup=(1.3, 1.2, 1.4)))
    assert "page ÷ engine's best ≥ 0.9: not met at 0.88 [0.80, 0.95] (interval reaches 0.9)" in sd
    # A page faster over AR than the engine is no fault of the page: only the lower bound counts.
    assert "speedup page ÷ engine ≥ 0.9: met at 1.30 [1.20, 1.40] (interval low ≥ 0.9)" in sd


def test_ar_is_judged_on_its_speed_alone_and_a_missing_interval_is_said_so():
    ar, sd = page.target_lines(methods(ar=(0.95, math.nan, math.nan), sd=(0.8, math.nan, math.nan),
                                       sd_speedup=(1.0, math.nan, math.nan)))
    assert ar == "ar: page ÷ engine's best ≥ 0.9: met at 0.95 (no interval: under 2 runs on a side)"
    assert "not met at 0.80 (no interval" in sd and "speedup page ÷ engine ≥ 0.9: met at 1.00 (no interval" in sd
    # Without AR in the table there is no speedup to judge.
    (line,) = page.target_lines(page.method_table([page_run({"sd": 18.0})] * 2, ENGINE))
    assert line.startswith("sd: page ÷ engine's best") and "speedup" not in line


def test_the_command_takes_five_runs_unless_told_otherwise():
    assert page.build_parser().parse_args([]).runs == 5
    assert "[--runs 5]" in page.__doc__


def test_the_command_takes_the_runs_threads_and_the_benchmark_tabs_category():
    args = page.build_parser().parse_args(["--runs", "2", "--threads", "1,2", "--page-threads", "1",
                                           "--bench-category", "math"])
    assert (args.runs, args.threads, args.page_threads, args.bench_category) == (2, "1,2", "1", "math")
    assert page.APP.name == "app.py" and page.APP.exists()


def test_the_benchmark_tab_is_judged_within_ten_percent_on_either_side():
    bench = pd.DataFrame({"method": ["ar", "sd", "nasd", "egag"], "tab_over_bench": [1.0, 1.12, 0.95, 0.85],
                          "tab_over_bench_low": [0.95, 1.11, 0.85, 0.80], "tab_over_bench_high": [1.05, 1.2, 1.02, 0.88]})
    ar, sd, nasd, egag = page.bench_target_lines(bench)
    assert "met at 1.00 [0.95, 1.05] (interval within)" in ar
    assert "not met at 1.12 [1.11, 1.20]" in sd and "(interval outside)" in sd
    assert ": met at 0.95" in nasd and "(interval reaches outside)" in nasd
    assert "not met at 0.85" in egag and "(interval outside)" in egag
    no_runs = page.bench_target_lines(bench[["method", "tab_over_bench"]])
    assert no_runs[0].endswith("met at 1.00 (no interval)")


def test_each_page_run_meets_the_engine_pass_after_it_so_a_machine_that_drifts_cancels_out():
    # The machine slows by a third over the command; the page runs at the engine's speed throughout.
    drift = [1.0, 0.9, 0.8, 0.7, 0.67]
    runs = [page_run({"ar": 12.0 * d, "sd": 20.0 * d}, threads={"ar": 1, "sd": 2}) for d in drift]
    passes = engine({(1, "ar"): [12.0 * d for d in drift], (2, "ar"): [11.0 * d for d in drift],
                     (1, "sd"): [15.0 * d for d in drift], (2, "sd"): [20.0 * d for d in drift]})
    paired = page.paired_table(runs, passes).set_index("method")
    for method in ("ar", "sd"):
        assert paired.at[method, "paired_page_over_engine"] == pytest.approx(1.0)
        assert paired.at[method, "paired_page_over_engine_low"] == pytest.approx(1.0)
        assert paired.at[method, "paired_page_over_engine_high"] == pytest.approx(1.0)
    assert paired.at["sd", "paired_speedup_page_over_engine"] == pytest.approx(1.0)
    assert paired.at["sd", "runs"] == 5
    # Unpaired, the same runs leave the drift in the interval.
    unpaired = page.method_table(runs, passes).set_index("method")
    assert unpaired.at["sd", "page_over_engine_low"] < 0.9 and unpaired.at["sd", "page_over_engine_high"] > 1.1


def test_a_page_slower_run_by_run_reads_so_in_the_paired_ratio():
    runs = [page_run({"ar": 10.0, "sd": 16.0 + k}) for k in range(4)]
    passes = engine({(1, "ar"): [10.0] * 4, (1, "sd"): [20.0 + 1.25 * k for k in range(4)]})
    paired = page.paired_table(runs, passes).set_index("method")
    assert paired.at["sd", "paired_page_over_engine"] == pytest.approx(0.8)
    assert paired.at["sd", "paired_page_over_engine_high"] == pytest.approx(0.8)
    assert paired.at["ar", "paired_speedup_page_over_engine_low"] == 1.0


def test_every_timed_decode_of_the_command_is_kept_one_row_each():
    rows = page.runs_table(RUNS, ENGINE)
    assert len(rows) == 3 * 2 + 6  # three page runs of two methods, six engine decodes
    page_rows = rows[rows.side == "page"]
    assert page_rows[page_rows.method == "sd"].tokens_per_s.tolist() == [18.0, 19.0, 20.0]
    assert rows[(rows.side == "engine") & (rows.threads == 2) & (rows.method == "sd")].run.tolist() == [1, 2]


def test_the_benchmark_tab_and_bench_take_turns_and_their_repeats_pool_as_one_run_of_that_many(tiny_pair, tmp_path):
    from specdemo import bench

    suite = [{"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "summarisation"}]
    run = bench.run_benchmark(tiny_pair, suite, ["ar", "sd"], repeats=2, warmup=False, max_new_tokens=6)
    csv = tmp_path / "rows.csv"  # as the tab offers it for download, and as it is read back
    bench.write_outputs(run, csv=csv)
    downloaded = bench.load_result(csv).rows
    one_repeat_each = [downloaded[downloaded.repeat == k].assign(repeat=0) for k in (0, 1)]

    assert page.pooled(one_repeat_each).repeat.tolist() == downloaded.repeat.tolist()
    repeats = page.BenchRepeats(tab=one_repeat_each, cli=[run.rows[run.rows.repeat == k] for k in (0, 1)])
    table = repeats.table().set_index("method")
    # The same runs on both sides: the tab reads as `bench`, interval and all.
    assert table.tab_over_bench.tolist() == pytest.approx([1.0, 1.0])
    assert table.at["sd", "tab_tok_s"] == pytest.approx(
        run.summary.set_index(["category", "method"]).at[("all", "sd"), "tokens_per_s_mean"])
    assert table.at["sd", "tab_over_bench_low"] <= 1.0 <= table.at["sd", "tab_over_bench_high"]
