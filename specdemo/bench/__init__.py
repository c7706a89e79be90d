"""Measuring methods: the prompt suite (``suite``), runners for our methods and for
transformers' peers (``runners``), a benchmark run (``benchmark``), statistics over its rows
(``statistics``), the Plotly figures and HTML report of a result (``report``, which reads
``benchmark``, never the other way round), per-prompt comparison tables (``tables``,
``compare``), why drafts were kept (``acceptance``, drawn by ``acceptance_charts``), sweeps
over γ, γ_max, EMA and n (the ``sweep`` package) and offline random-weight pairs (``synthetic``).

May import ``engine`` and ``models``, pandas and plotly; never gradio, the page or the
command line. The names below are the benchmark's public API.
"""

from .measure.benchmark import ROUND_COLUMNS, ROW_COLUMNS, BenchResult, Progress, run_benchmark
from .measure.report import load_result, make_figures, report_html, write_outputs
from .measure.runners import DEFAULT_BENCH_METHODS, HF_METHODS, bench_methods, parse_bench_methods, unavailable_bench_methods
from .measure.statistics import SUMMARY_COLUMNS, leviathan_speedup, summarize
from .hub_data import load_hf_suite
from .measure.quality import QUALITY_COLUMNS, reference_scores
from .suite import (ALL, DEFAULT_SUITE, MT_BENCH, SUITE_CATEGORIES, SuiteError, SuitePrompt, encode_prompt, load_suite,
                    select_prompts)

__all__ = [
    "ALL", "DEFAULT_BENCH_METHODS", "DEFAULT_SUITE", "HF_METHODS", "MT_BENCH", "QUALITY_COLUMNS", "ROUND_COLUMNS", "ROW_COLUMNS", "SUITE_CATEGORIES",
    "SUMMARY_COLUMNS", "BenchResult", "Progress", "SuiteError", "SuitePrompt", "bench_methods", "encode_prompt",
    "leviathan_speedup", "load_result", "load_suite", "make_figures", "parse_bench_methods", "unavailable_bench_methods",
    "report_html", "load_hf_suite", "reference_scores", "run_benchmark", "select_prompts", "summarize", "write_outputs",
]
