"""The page benchmark: the Playground's default run in Chromium against the engine alone, in one command.

    python -m specdemo.bench.page [--runs 5] [--threads 1,2] [--page-threads N] [--out DIR]

It serves the page as a user does (`python app.py`, a separate process, the default pair loaded
and warmed at startup), drives a headless Chromium on the same machine through the default run
`--runs` times, and reads each run's comparison CSV, the file the page offers for download. Between
page runs, this process decodes the same prompt with the same methods and settings through
`specdemo.generate`, at each of `--threads`. Per method it prints the page's tokens/s against the
engine's best, their ratio, and the speedups over AR on both sides, each ratio with a 95 % bootstrap
interval over the runs (`percentile_interval`), then whether each target is met and how firmly
(`target_lines`); per run, the CPU seconds the browser and the server spent against the decode time.
The server's own work is its CPU outside its busiest threads, as many as the most torch threads a
method decoded on (the decoders); beside it, the server's CPU beyond what the engine alone spends on
the same decodes at the page's thread counts (`cost_table`).

Playwright (the Python package) and a Chromium are needed (`chromium_path`).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd
import psutil
import torch
from scipy.stats import bootstrap

from ..engine.decoding import generate
from ..engine.methods import DEFAULT_METHODS, REFERENCE
from ..models.loading import PRESETS, load_pair
from .measure.benchmark import BenchResult, run_benchmark
from .measure.chartpng import chromium_path
from .measure.report import load_result
from .measure.runners import quiet_gc
from .measure.statistics import summarize
from .suite import ALL
from .measure.threads import ThreadPlan

APP = Path(__file__).resolve().parents[2] / "app.py"
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run"]
READY_TEXT = "to decode the prompt with every selected method"
# The page should decode at 90 % of the engine's speed or better, and its speedups over AR be the engine's
# within 10 % (a page faster over AR than the engine is no fault of the page, so only the lower bound).
TARGET = 0.9
CONFIDENCE = 0.95
RESAMPLES = 2000


@dataclass
class PageRun:
    summary: pd.DataFrame  # the page's comparison CSV
    wall_s: float  # Run pressed → "Done in" seen
    browser_cpu_s: float
    server_cpu_s: float
    settle_cpu_s: float = 0.0  # Chromium's CPU after "Done in", until it fell idle (drawing the charts)
    server_threads_cpu_s: list[float] = field(default_factory=list)  # each server thread's CPU, busiest first
    rows: pd.DataFrame | None = None  # the runs CSV, where the tab offers one (the Benchmark tab)

    @property
    def decode_s(self) -> float:
        return float(self.summary["seconds"].sum())


@dataclass
class EngineRuns:
    """tokens/s per (threads, method) over the repeats, and process CPU seconds per decode."""

    tokens_per_s: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    cpu_s: dict[tuple[int, str], list[float]] = field(default_factory=dict)
    new_tokens: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------- the served page


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served_page(threads: int | None, port: int | None = None, runtime: str = "auto"
                ) -> Iterator[tuple[str, psutil.Process]]:
    """`python app.py` on 127.0.0.1 (with `threads` torch threads, else its own choice; the target on
    `runtime`); yields its URL and process."""
    if not APP.exists():
        raise SystemExit(f"the page benchmark serves {APP}, which this installation lacks: run it from a checkout")
    port = port or free_port()
    log = tempfile.NamedTemporaryFile("w+", prefix="specdemo-page-", suffix=".log", delete=False)
    command = [sys.executable, str(APP), "--host", "127.0.0.1", "--port", str(port)]
    command += (["--threads", str(threads)] if threads else []) + ["--runtime", runtime]
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, server, log.name)
        yield f"http://127.0.0.1:{port}/", psutil.Process(server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def _wait_for_port(port: int, server: subprocess.Popen, log: str, timeout_s: float = 600) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the page did not start (exit {server.returncode}); its log: {log}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise SystemExit(f"the page did not open port {port} within {timeout_s:.0f} s; its log: {log}")


def cpu_seconds(processes: Sequence[psutil.Process]) -> dict[int, float]:
    """user + system CPU seconds by pid (children included in their own entries)."""
    seconds = {}
    for process in processes:
        try:
            times = process.cpu_times()
            seconds[process.pid] = times.user + times.system
        except psutil.Error:  # ended since it was listed
            pass
    return seconds


def thread_seconds(process: psutil.Process) -> dict[int, float]:
    """user + system CPU seconds by thread of one process."""
    try:
        return {thread.id: thread.user_time + thread.system_time for thread in process.threads()}
    except psutil.Error:
        return {}


def tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return [process]


def browser_processes(server: psutil.Process) -> list[psutil.Process]:
    """Chromium's processes: this process's descendants named so, outside the server's tree."""
    served = {p.pid for p in tree(server)}
    return [p for p in psutil.Process().children(recursive=True)
            if p.pid not in served and "chrom" in _name(p)]


def _name(process: psutil.Process) -> str:
    try:
        return process.name().lower()
    except psutil.Error:
        return ""


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two readings (a process new since `before` counts from zero)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


# --------------------------------------------------------------------------- driving Chromium


def timed_run(page, server: psutil.Process, button: str, wait, csv_button: str) -> PageRun:
    """Press `button`, `wait()` for the run to end, and read the CSV behind `csv_button`; the wall
    time and the CPU seconds Chromium and the server spent in between come with it."""
    browser_before = cpu_seconds(browser_processes(server))
    server_before, threads_before = cpu_seconds(tree(server)), thread_seconds(server)
    started = time.perf_counter()
    page.locator(button).click()
    wait()
    wall = time.perf_counter() - started
    browser_after = cpu_seconds(browser_processes(server))
    browser_cpu = spent(browser_before, browser_after)
    server_cpu = spent(server_before, cpu_seconds(tree(server)))
    by_thread = sorted((seconds - threads_before.get(thread, 0.0) for thread, seconds in thread_seconds(server).items()),
                       reverse=True)
    settle_cpu = settle(lambda: browser_processes(server), browser_after)
    # A greedy Run goes on preparing the What-if panel on the server after "Done in" (one more AR decode
    # and its chain book): the engine's timed pass that follows must not share the cores with it.
    settle(lambda: tree(server), cpu_seconds(tree(server)))
    with page.expect_download() as download:
        page.locator(csv_button).click()
    return PageRun(pd.read_csv(download.value.path()), wall, browser_cpu, server_cpu, settle_cpu, by_thread)


def settle(processes: Callable[[], Sequence[psutil.Process]], since: dict[int, float], interval_s: float = 0.5,
           idle_cpu_s: float = 0.05, timeout_s: float = 120) -> float:
    """Wait until `processes` (Chromium's: it has drawn what the last update brought, as a visitor reads the
    charts before pressing Run again; the server's: it has finished a Run's after-work) are quiet for two
    intervals in a row, so that their work overlaps neither the engine's timed decodes nor the next run;
    returns the CPU seconds they spent."""
    deadline, quiet, last = time.perf_counter() + timeout_s, 0, since
    while quiet < 2 and time.perf_counter() < deadline:
        time.sleep(interval_s)
        now = cpu_seconds(processes())
        quiet = quiet + 1 if spent(last, now) < idle_cpu_s else 0
        last = now
    return spent(since, last)


def press_run(page, server: psutil.Process, timeout_s: float = 900) -> PageRun:
    """Press Run once, wait for "Done in", and read the comparison CSV the page offers."""
    def finished() -> None:
        # The last run's "Done in" stays until this run's first update: see it go, then come back.
        for done in ("false", "true"):
            # textContent, not innerText: reading it forces no layout, so the polling costs the page nothing.
            page.wait_for_function(f"document.querySelector('#sd-status').textContent.includes('Done in')"
                                   f" === {done}", timeout=timeout_s * 1000, polling=250)

    return timed_run(page, server, "#sd-run", finished, "#sd-summary-csv")


@contextmanager
def opened_page(url: str) -> Iterator[object]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("the page benchmark needs Playwright: pip install playwright, and a Chromium "
                         "(apt-get install chromium)") from None
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=BROWSER_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
            page.goto(url, wait_until="domcontentloaded")
            # The page opens saying that the default pair is warming up, and says when it is ready.
            page.locator("#sd-status").get_by_text(READY_TEXT).wait_for(timeout=900_000)
            yield page
        finally:
            browser.close()


def bench_tab_run(page, server: psutil.Process, category: str, timeout_s: float = 1800) -> PageRun:
    """The Benchmark tab's default run on one category (or all), one repeat, read from its summary and
    runs CSVs (the repeats take turns with `bench`'s, see `measure`)."""
    page.get_by_role("tab", name="Benchmark").click()
    if category != ALL:
        page.locator("#bench-category input").click()
        page.get_by_role("option", name=category, exact=True).click()
    page.locator("#bench-repeats input").fill("1")
    # Polled every 250 ms through textContent: a locator's wait would poll on every animation frame,
    # keeping Chromium busy beside the runs it times.
    run = timed_run(page, server, "#bench-run",
                    lambda: page.wait_for_function("document.querySelector('#bench-status').textContent"
                                                   ".includes('Done:')", timeout=timeout_s * 1000, polling=250),
                    "#bench-summary-csv")
    with page.expect_download() as download:
        page.locator("#bench-rows-csv").click()
    run.rows = load_result(download.value.path()).rows  # read as `bench` reads its own
    page.get_by_role("tab", name="Playground").click()
    return run


def bench_table(tab: pd.DataFrame, cli: pd.DataFrame, tab_rows: pd.DataFrame | None = None,
                cli_rows: pd.DataFrame | None = None) -> pd.DataFrame:
    """The Benchmark tab's summary against `bench`'s on the same settings, category "all"; with both
    runs CSVs, each ratio's bootstrap interval over the runs (the summary's speed is their mean)."""
    def rows(summary: pd.DataFrame) -> pd.DataFrame:
        return summary[summary.category == ALL].set_index("method")

    tab, cli = rows(tab), rows(cli)
    table = pd.DataFrame({"tab_tok_s": tab.tokens_per_s_mean, "bench_tok_s": cli.tokens_per_s_mean})
    table["tab_over_bench"] = table.tab_tok_s / table.bench_tok_s
    if tab_rows is not None and cli_rows is not None:
        def speeds(runs: pd.DataFrame, method: str) -> list[float]:
            timed = runs[(runs.method == method) & runs.error.fillna("").astype(str).eq("")]
            return timed.tokens_per_s.astype(float).tolist()

        bounds = {m: median_ratio_interval([speeds(tab_rows, m)], [speeds(cli_rows, m)], center=np.mean)
                  for m in table.index}
        table["tab_over_bench_low"] = pd.Series({m: low for m, (low, _) in bounds.items()})
        table["tab_over_bench_high"] = pd.Series({m: high for m, (_, high) in bounds.items()})
    table["tab_speedup_vs_ar"] = tab.speedup_vs_ar
    table["bench_speedup_vs_ar"] = cli.speedup_vs_ar
    return table.reset_index()


# --------------------------------------------------------------------------- the engine alone


def engine_pass(pair, prompt: str, methods: Sequence[str], threads: Sequence[int], runs: EngineRuns) -> None:
    """One decode of the prompt per method at each thread count, added to `runs`."""
    before = torch.get_num_threads()
    try:
        for count in threads:
            torch.set_num_threads(count)
            for method in methods:
                with quiet_gc():  # as the page and `bench` decode
                    cpu = time.process_time()
                    result = generate(pair, prompt, method, seed=0, chat=True)
                runs.cpu_s.setdefault((count, method), []).append(time.process_time() - cpu)
                runs.tokens_per_s.setdefault((count, method), []).append(result.stats["tokens_per_s"])
                runs.new_tokens[method] = len(result.tokens)
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- the tables


def page_threads(page_runs: Sequence[PageRun]) -> dict[str, int]:
    """The thread count the page decoded each method on, as its CSV says."""
    summary = page_runs[0].summary
    return {method: int(threads) for method, threads in zip(summary["method"], summary["threads"])}


def percentile_interval(samples: Sequence[Sequence[float]], statistic, seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval of `statistic(*samples, axis=...)`, each sample resampled
    on its own; NaN where a sample holds fewer than two values (one run says nothing of its spread).
    Percentile, not BCa, whose jackknife fails or warns on a handful of runs; a fixed seed, so that
    the same runs give the same table."""
    arrays = [np.asarray(sample, dtype=float) for sample in samples]
    if any(len(array) < 2 for array in arrays):
        return math.nan, math.nan
    result = bootstrap(arrays, statistic, paired=False, vectorized=True, confidence_level=CONFIDENCE,
                       n_resamples=RESAMPLES, method="percentile", random_state=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def median_ratio_interval(over: Sequence[Sequence[float]], under: Sequence[Sequence[float]],
                          center=np.median) -> tuple[float, float]:
    """The interval of (the product of the medians of `over`) / (the product of the medians of
    `under`), each sample resampled on its own: page and engine runs are separate decodes, not pairs.
    `center`: np.mean where the ratio compared is of means."""
    def ratio(*resampled: np.ndarray, axis: int = -1) -> np.ndarray:
        centers = [center(sample, axis=axis) for sample in resampled]
        return np.prod(centers[:len(over)], axis=0) / np.prod(centers[len(over):], axis=0)

    return percentile_interval([*over, *under], ratio)


def page_speeds(page_runs: Sequence[PageRun]) -> dict[str, list[float]]:
    """The page's tokens/s by method, one value per run."""
    return {method: [float(run.summary.set_index("method").at[method, "tokens_per_s"]) for run in page_runs]
            for method in page_runs[0].summary["method"]}


def best_threads(engine: EngineRuns, method: str) -> int:
    """The engine's thread count with the highest median tokens/s for `method`."""
    return max((t for (t, m) in engine.tokens_per_s if m == method),
               key=lambda t: statistics.median(engine.tokens_per_s[(t, method)]))


def method_table(page_runs: Sequence[PageRun], engine: EngineRuns) -> pd.DataFrame:
    """Per method: page tok/s against the engine's best thread count, each the median over its runs
    (the same statistic on both sides: the best of several noisy engine runs against the page's
    median would call noise a gap). Each ratio comes with its bootstrap interval (`_low`, `_high`),
    as one run moves by ±10 % on a small machine and a target is judged within 10 %."""
    speeds = page_speeds(page_runs)
    rows = []
    for method, on_page in speeds.items():
        by_threads = {t: statistics.median(v) for (t, m), v in engine.tokens_per_s.items() if m == method}
        best = best_threads(engine, method)
        low, high = median_ratio_interval([on_page], [engine.tokens_per_s[(best, method)]])
        rows.append({
            "method": method, "page_tok_s": statistics.median(on_page), "page_first_run_tok_s": on_page[0],
            **{f"engine_{t}t_tok_s": by_threads[t] for t in sorted(by_threads)},
            "engine_best_tok_s": by_threads[best], "engine_best_threads": best,
            "page_over_engine": statistics.median(on_page) / by_threads[best],
            "page_over_engine_low": low, "page_over_engine_high": high,
            "page_new_tokens": int(page_runs[0].summary.set_index("method").at[method, "new_tokens"]),
            "engine_new_tokens": engine.new_tokens.get(method),
        })
    table = pd.DataFrame(rows).set_index("method")
    if REFERENCE in table.index:
        threads = page_threads(page_runs)
        # The engine on the same thread counts as the page, method by method.
        at_page = pd.Series({m: table.at[m, f"engine_{threads[m]}t_tok_s"] for m in table.index})
        table["page_threads"] = pd.Series(threads)
        table["page_speedup"] = table["page_tok_s"] / table.at[REFERENCE, "page_tok_s"]
        table["engine_speedup"] = at_page / at_page[REFERENCE]
        table["speedup_page_over_engine"] = table["page_speedup"] / table["engine_speedup"]
        engine_ar = engine.tokens_per_s[(threads[REFERENCE], REFERENCE)]
        # AR over itself is 1 on both sides in every resample: nothing to resample.
        bounds = {m: (1.0, 1.0) if m == REFERENCE else median_ratio_interval(
            [speeds[m], engine_ar], [speeds[REFERENCE], engine.tokens_per_s[(threads[m], m)]])
            for m in table.index}
        table["speedup_page_over_engine_low"] = pd.Series({m: low for m, (low, _) in bounds.items()})
        table["speedup_page_over_engine_high"] = pd.Series({m: high for m, (_, high) in bounds.items()})
    return table.reset_index()


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """The interval of the median of `values`."""
    return percentile_interval([values], np.median)


def paired_table(page_runs: Sequence[PageRun], engine: EngineRuns) -> pd.DataFrame:
    """Per method, each page run against the engine pass right after it, as ratios run by run: the
    page ÷ the engine at its best thread count, and the page's speedup over AR ÷ the engine's at the
    page's counts; the median over runs, with its interval. A run and the pass after it share the
    machine's state of that minute, which the unpaired medians of `method_table` do not."""
    page, threads = page_speeds(page_runs), page_threads(page_runs)
    rows = []
    for m in page:
        ratios = [p / e for p, e in zip(page[m], engine.tokens_per_s[(best_threads(engine, m), m)])]
        row = {"method": m, "runs": len(ratios), "paired_page_over_engine": statistics.median(ratios)}
        row["paired_page_over_engine_low"], row["paired_page_over_engine_high"] = median_interval(ratios)
        if REFERENCE in page:
            at_page = zip(page[m], page[REFERENCE], engine.tokens_per_s[(threads[m], m)],
                          engine.tokens_per_s[(threads[REFERENCE], REFERENCE)])
            speedups = [(pm / pa) / (em / ea) for pm, pa, em, ea in at_page]
            row["paired_speedup_page_over_engine"] = statistics.median(speedups)
            low, high = (1.0, 1.0) if m == REFERENCE else median_interval(speedups)
            row["paired_speedup_page_over_engine_low"], row["paired_speedup_page_over_engine_high"] = low, high
        rows.append(row)
    return pd.DataFrame(rows)


def runs_table(page_runs: Sequence[PageRun], engine: EngineRuns) -> pd.DataFrame:
    """Every timed decode of the command, one row each: the page's runs and the engine's passes."""
    rows = [{"side": "page", "run": k, "threads": int(threads), "method": method, "tokens_per_s": float(speed)}
            for k, run in enumerate(page_runs, 1)
            for method, threads, speed in zip(run.summary["method"], run.summary["threads"], run.summary["tokens_per_s"])]
    rows += [{"side": "engine", "run": k, "threads": t, "method": m, "tokens_per_s": speed}
             for (t, m), speeds in engine.tokens_per_s.items() for k, speed in enumerate(speeds, 1)]
    return pd.DataFrame(rows)


def target_lines(methods: pd.DataFrame) -> list[str]:
    """One line per method of `method_table`: is the page at `TARGET` of the engine's best or better,
    and its speedup over AR at `TARGET` of the engine's or better (not for AR, 1 by definition);
    firmly when the whole interval is on the same side of the target."""
    lines = []
    for row in methods.to_dict("records"):
        parts = [_verdict("page ÷ engine's best", row["page_over_engine"], row["page_over_engine_low"],
                          row["page_over_engine_high"])]
        if "speedup_page_over_engine" in row and row["method"] != REFERENCE:
            parts.append(_verdict("speedup page ÷ engine", row["speedup_page_over_engine"],
                                  row["speedup_page_over_engine_low"], row["speedup_page_over_engine_high"]))
        lines.append(f"{row['method']}: " + "; ".join(parts))
    return lines


def _verdict(name: str, ratio: float, low: float, high: float) -> str:
    """Met or not met against `TARGET`, and whether the interval stays on that side of it."""
    met = ratio >= TARGET
    if math.isnan(low):
        firmness = "no interval: under 2 runs on a side"
    elif met:
        firmness = f"interval low ≥ {TARGET}" if low >= TARGET else f"interval reaches below {TARGET}"
    else:
        firmness = f"interval high < {TARGET}" if high < TARGET else f"interval reaches {TARGET}"
    interval = "" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
    return f"{name} ≥ {TARGET}: {'met' if met else 'not met'} at {ratio:.2f}{interval} ({firmness})"


def bench_target_lines(bench: pd.DataFrame) -> list[str]:
    """One line per method of `bench_table`: is the tab within 10 % of `bench`, on either side (the
    same suite timed twice), and does the interval stay within, where there is one."""
    lines = []
    for row in bench.to_dict("records"):
        ratio, low, high = row["tab_over_bench"], row.get("tab_over_bench_low", math.nan), row.get("tab_over_bench_high", math.nan)
        within = TARGET <= ratio <= 2 - TARGET
        if math.isnan(low):
            firmness = "no interval"
        elif within:
            firmness = "interval within" if TARGET <= low and high <= 2 - TARGET else "interval reaches outside"
        else:
            firmness = "interval outside" if high < TARGET or low > 2 - TARGET else "interval reaches within"
        interval = "" if math.isnan(low) else f" [{low:.2f}, {high:.2f}]"
        lines.append(f"{row['method']}: Benchmark tab ÷ bench within {TARGET}–{2 - TARGET:.1f}: "
                     f"{'met' if within else 'not met'} at {ratio:.2f}{interval} ({firmness})")
    return lines


def cost_table(page_runs: Sequence[PageRun], engine: EngineRuns) -> pd.DataFrame:
    """Per page run: wall and decode seconds, browser and server CPU, and two readings of what the page
    cost beside the decoding. `drawing_cpu_over_decode` counts the server's CPU outside the decoders'
    threads (its own work: the event loop, the updates). `with_engine_gap_over_decode` counts instead
    the server's CPU beyond the engine's on the same decodes, which also holds the decoders' own
    variation: two OpenMP threads spin while they wait on each other, so a decode that ran slower for
    any reason (the browser, the machine) spends more CPU, and that reading moves by seconds from one
    run to the next."""
    threads = page_threads(page_runs)
    engine_cpu = sum(statistics.median(v) for (t, m), v in engine.cpu_s.items() if threads.get(m) == t)
    decoders = max(threads.values())
    rows = []
    for k, run in enumerate(page_runs, 1):
        beyond_engine = max(0.0, run.server_cpu_s - engine_cpu)
        own = sum(run.server_threads_cpu_s[decoders:]) if run.server_threads_cpu_s else math.nan
        browser = run.browser_cpu_s + run.settle_cpu_s
        rows.append({"run": k, "wall_s": run.wall_s, "decode_s": run.decode_s, "browser_cpu_s": run.browser_cpu_s,
                     "browser_cpu_after_s": run.settle_cpu_s, "server_cpu_s": run.server_cpu_s,
                     "engine_cpu_s": engine_cpu, "server_beyond_engine_s": beyond_engine,
                     "server_outside_decoder_threads_s": own,
                     "drawing_cpu_over_decode": (browser + own) / run.decode_s if run.decode_s else math.nan,
                     "with_engine_gap_over_decode": (browser + beyond_engine) / run.decode_s if run.decode_s else math.nan})
    return pd.DataFrame(rows)


def markdown(frame: pd.DataFrame, digits: int = 2, cell: Callable[[object], str] | None = None) -> str:
    """A DataFrame as a Markdown table (numbers rounded, or as `cell` writes them; no tabulate on a GPU image)."""
    def rounded(value) -> str:
        if isinstance(value, float):
            return "–" if math.isnan(value) else f"{value:.{digits}f}"
        return str(value)

    cell = cell or rounded
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command


@dataclass
class BenchRepeats:
    """The Benchmark tab and `bench` on the same settings, one repeat of each in turn: the runs CSV of
    each repeat, in order."""

    tab: list[pd.DataFrame] = field(default_factory=list)
    cli: list[pd.DataFrame] = field(default_factory=list)

    def table(self) -> pd.DataFrame:
        """`bench_table` on the repeats of each side pooled, as one run of `repeats` repeats writes them."""
        tab, cli = pooled(self.tab), pooled(self.cli)
        return bench_table(summarize(tab), summarize(cli), tab, cli)


def pooled(repeats: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Runs CSVs of one repeat each as one runs CSV, each numbered as the repeat it was."""
    return pd.concat([rows.assign(repeat=k) for k, rows in enumerate(repeats)], ignore_index=True)


@dataclass
class Measured:
    page_runs: list[PageRun]
    engine: EngineRuns
    prompt: str
    bench: BenchRepeats | None = None  # the Benchmark tab against `bench`, when asked for


def measure(runs: int, threads: Sequence[int], served_threads: str | None, preset: str,
            bench_category: str | None = None, screenshot: Path | None = None, port: int | None = None,
            bench_repeats: int = 1, runtime: str = "auto") -> Measured:
    """`runs` page runs, each followed by one engine pass at every thread count (and the page after
    the last run saved as `screenshot`); then, when asked, `bench_repeats` times the Benchmark tab's
    default run on `bench_category` (one repeat), each followed by `run_benchmark` on the same
    settings: the two sides take turns, so that the machine's drift over the minutes they take falls
    on both alike rather than on whichever side ran last. runtime: the target's, on the page and the engine alike."""
    chosen = PRESETS[preset]
    pair = load_pair(chosen.target, chosen.draft, runtime=runtime)
    engine, page_runs = EngineRuns(), []
    with served_page(served_threads, port, runtime) as (url, server), opened_page(url) as page:
        prompt = page.locator("#sd-prompt textarea").input_value()
        engine_pass(pair, prompt, DEFAULT_METHODS, threads, EngineRuns())  # warm, like the page's startup
        for k in range(runs):
            page_runs.append(press_run(page, server))
            print(f"page run {k + 1}/{runs}: {page_runs[-1].wall_s:.1f} s", flush=True)
            engine_pass(pair, prompt, DEFAULT_METHODS, threads, engine)
        if screenshot is not None:
            page.screenshot(path=str(screenshot), full_page=True)
        measured = Measured(page_runs, engine, prompt)
        if bench_category:
            measured.bench = BenchRepeats()
            for k in range(bench_repeats):
                tab = bench_tab_run(page, server, bench_category)
                measured.bench.tab.append(tab.rows)
                measured.bench.cli.append(_bench_cli(pair, tab, page_runs, bench_category).rows)
                print(f"Benchmark tab and bench, repeat {k + 1}/{bench_repeats}", flush=True)
    return measured


def _bench_cli(pair, tab: PageRun, page_runs: Sequence[PageRun], category: str) -> BenchResult:
    """`bench` with the Benchmark tab's defaults (1 prompt per category, 64 tokens, seed 0), one
    repeat, on the methods of the tab's run `tab`, by the tab's thread plan (the page's, for suites)."""
    methods = list(dict.fromkeys(tab.summary.method))
    return run_benchmark(pair, methods=methods, repeats=1, limit=1, max_new_tokens=64, seed=0, chat=True,
                         categories=None if category == ALL else category,
                         threads=served_plan(page_runs).for_suites())


def served_plan(page_runs: Sequence[PageRun]) -> ThreadPlan:
    """The page's thread plan, read from the counts its Playground decoded each method on (the
    Benchmark tab decodes by the same plan)."""
    counts = set(page_threads(page_runs).values())
    return ThreadPlan(count=counts.pop()) if len(counts) == 1 else ThreadPlan(count=None, cores=max(counts))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdemo.bench.page", description=__doc__.split("\n\n")[0])
    # One run moves by ±10 % on a 2-core machine: five give the targets' intervals something to stand on.
    parser.add_argument("--runs", type=int, default=5, help="default runs pressed on the page (default 5)")
    parser.add_argument("--threads", default="1,2", help="the engine's thread counts, comma-separated (default 1,2)")
    parser.add_argument("--page-threads", default=None,
                        help="app.py --threads: a count or auto (default: what app.py chooses on this machine)")
    parser.add_argument("--preset", default="embedded", help="the model pair (default: embedded, the page's default)")
    parser.add_argument("--bench-category", default=None,
                        help="also run the Benchmark tab's defaults on this category (or all) against bench")
    parser.add_argument("--bench-repeats", type=int, default=3,
                        help="repeats of the Benchmark tab and of bench, one of each in turn, so that noise is "
                             "below the 10 %% compared (default 3)")
    parser.add_argument("--runtime", choices=("auto", "torch", "onnx"), default="auto",
                        help="the target's runtime on the page (app.py --runtime) and in the engine (default auto, "
                             "the page's: onnx where it runs the target, else torch)")
    parser.add_argument("--screenshot", type=Path, default=None, help="save the page after the last run here (PNG)")
    parser.add_argument("--out", default=None,
                        help="a folder for methods.csv, paired.csv, costs.csv, runs.csv (and bench.csv)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    measured = measure(args.runs, threads, args.page_threads, args.preset, args.bench_category, args.screenshot,
                       bench_repeats=args.bench_repeats, runtime=args.runtime)
    tables = {"methods": method_table(measured.page_runs, measured.engine),
              "paired": paired_table(measured.page_runs, measured.engine),
              "costs": cost_table(measured.page_runs, measured.engine)}
    if measured.bench is not None:
        tables["bench"] = measured.bench.table()
    print(f"\n{os.cpu_count()} cores; the page's threads by method {page_threads(measured.page_runs)}; "
          f"{args.runs} page runs; prompt {measured.prompt[:60]!r}…")
    for name, table in tables.items():
        print(f"\n{name}:\n{markdown(table)}")
    print(f"\ntargets (median ratio [{CONFIDENCE * 100:.0f} % bootstrap interval over the runs]):")
    for line in target_lines(tables["methods"]) + (bench_target_lines(tables["bench"]) if "bench" in tables else []):
        print(line)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name, table in {**tables, "runs": runs_table(measured.page_runs, measured.engine)}.items():
            table.to_csv(Path(args.out) / f"{name}.csv", index=False)
    return 0


if __name__ == "__main__": raise SystemExit(main())
