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


def test_tables_print_as_markdown():
    text = page.markdown(pd.DataFrame({"method": ["ar"], "tok_s": [12.345], "missing": [math.nan]}))
    assert text.splitlines() == ["| method | tok_s | missing |", "|---|---|---|", "| ar | 12.35 | – |"]


def test_the_command_takes_the_runs_threads_and_the_benchmark_tabs_category():
    args = page.build_parser().parse_args(["--runs", "2", "--threads", "1,2", "--page-threads", "1",
                                           "--bench-category", "math"])
    assert (args.runs, args.threads, args.page_threads, args.bench_category) == (2, "1,2", "1", "math")
    assert page.APP.name == "app.py" and page.APP.exists()
