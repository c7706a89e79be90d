"""`python -m specdemo bench`: our decoders against transformers' own, on a prompt suite."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from ..bench.measure.batching import batch_verdict, parse_batch_sizes
from ..bench.measure.benchmark import BenchResult, run_benchmark
from ..bench.measure.quality import QUALITY_COLUMNS
from ..bench.overhead import OverheadReport, measure_round_overhead, spread_over_categories
from ..bench.tree_cost import largest_budget, verification_costs
from ..bench.measure.report import write_outputs
from ..bench.measure.roofline import add_roofline, parse_bandwidth
from ..bench.measure.runners import DEFAULT_BENCH_METHODS, bench_methods, parse_bench_methods
from ..bench.suite import ALL, encode_prompt, select_prompts
from ..bench.measure.threads import ThreadPlan
from ..bench.measure.vs_float32 import Float32Reference
from ..models.precision import exactness_sentence
from .common import (add_cluster_arguments, add_decoding_arguments, add_model_arguments, add_suite_arguments,
                     add_thread_plan_argument, cluster_from_args, decode_params, default_chat, engine_options,
                     pair_from_args, pair_spec_from_args, progress_bar, read_suite, suite_needs_tokenizer)
from ..engine.methods import REFERENCE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_suite_arguments(parser, repeats=3, what="(prompt, method)", threads=False)
    add_thread_plan_argument(parser)
    add_model_arguments(parser)
    add_decoding_arguments(parser, methods_default=DEFAULT_BENCH_METHODS, methods_known=list(bench_methods()))
    bound = parser.add_argument_group("roofline")
    bound.add_argument("--roofline", action="store_true",
                       help="print the bytes one target token must read, the memory-bandwidth bound in tokens/s and "
                            "measured AR as a fraction of it; add them to the summary CSV and report")
    bound.add_argument("--bandwidth", default=None, metavar="B|NAME",
                       help="memory bandwidth in bytes/s (e.g. 3.35e12) or a GPU name (e.g. 'H100 SXM'); implies "
                            "--roofline (default: looked up from the CUDA device's name; none is known for CPUs)")
    overhead = parser.add_argument_group("round overhead")
    overhead.add_argument("--round-overhead", action="store_true",
                          help="measure greedy SD's round time ÷ (γ × one draft step + one verification forward, "
                               "each timed alone): what the decode loop loses between model calls")
    overhead.add_argument("--overhead-prompts", type=int, default=4, metavar="N",
                          help="suite prompts it measures, one category after another (default: 4)")
    overhead.add_argument("--overhead-csv", default=None, metavar="FILE",
                          help="write its table, one row per prompt and an 'all' row; implies --round-overhead")
    overhead.add_argument("--overhead-only", action="store_true",
                          help="measure the round overhead and skip the method comparison; implies --round-overhead")
    trees = parser.add_argument_group("tree verification cost")
    trees.add_argument("--tree-cost", type=int, default=None, metavar="ROWS",
                       help="time one target forward over 1..ROWS rows, as a chain and as a tree, against one row, "
                            "on the first selected prompt, and skip the method comparison (a tree's node budget is "
                            "rows − 1)")
    batching = parser.add_argument_group("batch sizes")
    batching.add_argument("--batch", default="1", metavar="B,B,…",
                          help="batch sizes, e.g. 1,2,4,8,16: the prompts cut into batches of each size (the last "
                               "one filled from the first prompts again), each batch run by every method in turn "
                               "through generate_batch; prints each size's throughput, latency p50/p95, time to "
                               "first token and throughput over AR's with its interval (default: 1). transformers' "
                               "and the runtime's own decoders run at batch 1 only")
    batching.add_argument("--batch-csv", default=None, metavar="FILE",
                          help="one row per (batch size, method); default: next to --csv as *.batch.csv when "
                               "--batch names a size above 1")
    out = parser.add_argument_group("output")
    out.add_argument("--csv", help="one row per (prompt, method, repeat)")
    out.add_argument("--summary-csv", help="one row per (category, method); default: next to --csv as *.summary.csv")
    out.add_argument("--tokens-csv", help="one row per drafted token of our methods (p, q, acceptance probability, "
                                          "accepted, drafter entropy); default: next to --csv as *.tokens.csv")
    out.add_argument("--report", help="HTML report with the figures")
    out.add_argument("--vs-fp32", dest="vs_fp32", action=argparse.BooleanOptionalAction, default=True,
                     help="where a model runs below float32 (bfloat16, float16, int8, int4), set every method against "
                          "AR of the target's weights at float32 on the same prompts: speedup, token match, prefix "
                          "match, chrF, BLEU (loads a float32 copy of the target unless it is float32 already; those "
                          "runs are timed in no row) (default: on)")
    out.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                     help="embed plotly.js in the report (offline) or link it from a CDN (default: inline)")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    add_cluster_arguments(parser, "suite's prompts")


def run(args: argparse.Namespace) -> int:
    """Benchmark our decoders against transformers' on a prompt suite."""
    params = decode_params(args, chat_default=default_chat(args))  # fails on bad values before loading models
    engine = engine_options(args)
    if args.bandwidth is not None:
        parse_bandwidth(args.bandwidth)
    if args.repeats < 1:
        raise ValueError(f"repeats must be an integer ≥ 1, got {args.repeats}")
    args.thread_plan = ThreadPlan.parse(args.threads) if args.threads is not None else None
    args.round_overhead = args.round_overhead or args.overhead_only or bool(args.overhead_csv)
    if args.overhead_prompts < 1:
        raise ValueError(f"overhead-prompts must be an integer ≥ 1, got {args.overhead_prompts}")
    if args.overhead_only:
        skipped = [flag for flag, value in (("--csv", args.csv), ("--summary-csv", args.summary_csv),
                                            ("--report", args.report), ("--tokens-csv", args.tokens_csv),
                                            ("--roofline", args.roofline),
                                            ("--bandwidth", args.bandwidth)) if value]
        if skipped:
            raise ValueError(f"--overhead-only skips the method comparison, so {', '.join(skipped)} "
                             "would have nothing to show; drop them or drop --overhead-only")
    methods = parse_bench_methods(args.methods)
    args.batch_sizes = parse_batch_sizes(args.batch)
    if args.batch_sizes != [1] and (args.overhead_only or args.tree_cost is not None):
        raise ValueError("--batch sizes the method comparison, which --overhead-only and --tree-cost skip")
    args.cluster_run = _cluster(args)
    # Prompts cut in the target's tokens are read once the pair is loaded; every other suite now.
    suite = None if suite_needs_tokenizer(args) else select_prompts(read_suite(args), args.categories, args.limit)
    threads = torch.get_num_threads()
    if args.thread_plan is not None:
        # Spin-waiting worker threads collapse when another process holds a core, so a
        # shared machine often runs faster, and far steadier, on fewer threads.
        torch.set_num_threads(args.thread_plan.default)
    try:
        return _bench_with(args, params, engine, methods, suite)
    finally:
        torch.set_num_threads(threads)


def _cluster(args):
    """--cluster's run, refused (before anything loads) with what needs the pair on this machine."""
    plan = args.thread_plan
    cluster = cluster_from_args(args, plan.count if plan is not None else None)
    if cluster is None:
        return None
    here = [flag for flag, value in (("--round-overhead", args.round_overhead), ("--tree-cost", args.tree_cost is not None),
                                     ("--roofline", args.roofline or args.bandwidth is not None),
                                     ("--prompt-tokens", args.prompt_tokens)) if value]
    if here:
        raise ValueError(f"{', '.join(here)} measure(s) the pair loaded on this machine, which --cluster never "
                         "loads; run them without --cluster")
    return cluster


def _bench_with(args, params, engine, methods, suite) -> int:
    if args.cluster_run is not None:  # the workers load the pair, each its own
        _compare_methods(args, params, engine, methods, suite, pair_spec_from_args(args))
        return 0
    pair = pair_from_args(args)
    if suite is None:
        suite = select_prompts(read_suite(args, pair.tokenizer), args.categories, args.limit)
    if args.round_overhead and pair.draft is None:  # refuse before the comparison runs, not after
        raise ValueError("--round-overhead measures SD rounds and this pair has no draft; pass --draft, or a --pair "
                         "with a draft model or a feature head")
    if args.tree_cost is not None:
        _print_tree_cost(pair, encode_prompt(pair, suite[0], params.chat), args.tree_cost)
        return 0
    if not args.overhead_only:
        _compare_methods(args, params, engine, methods, suite, pair)
    if args.round_overhead:
        _print_overhead(_measure_overhead(args, params, engine, suite, pair), args.overhead_csv)
    return 0


def _compare_methods(args, params, engine, methods, suite, pair) -> None:
    with progress_bar(args.quiet, "task" if args.cluster_run else "run") as progress:
        result = run_benchmark(pair, suite, methods, repeats=args.repeats, warmup=args.warmup,
                               progress=progress, decode=params, threads=args.thread_plan,
                               vs_float32=Float32Reference() if args.vs_fp32 else None, cluster=args.cluster_run,
                               batch=args.batch_sizes, **engine.as_kwargs())
    roofline_lines = add_roofline(result, pair, args.bandwidth) if args.roofline or args.bandwidth else []
    summary_csv = args.summary_csv
    if args.csv and not summary_csv:
        summary_csv = str(Path(args.csv).with_suffix("")) + ".summary.csv"
    _print_summary(result)
    if args.batch_sizes != [1]:
        print_batches(result)
    if result.meta.get("stopped"):
        print("stopped early: the summary holds the runs that finished")
    for line in roofline_lines:
        print(line)
    batch_csv = args.batch_csv
    if args.csv and not batch_csv and args.batch_sizes != [1]:
        batch_csv = str(Path(args.csv).with_suffix("")) + ".batch.csv"
    for path in write_outputs(result, args.csv, summary_csv, args.report, args.plotlyjs,
                              tokens_csv=args.tokens_csv, batch_csv=batch_csv):
        print(f"wrote {path}")


def _print_tree_cost(pair, context: list[int], rows: int) -> None:
    if not 1 <= rows <= 65:
        raise ValueError(f"tree-cost must be an integer from 1 to 65 (rows of one forward), got {rows}")
    table = verification_costs(pair, context, max_rows=rows)
    print(f"verification forward cost on a {len(context)}-token context, {torch.get_num_threads()} thread(s); "
          "cost = median seconds ÷ one row's")
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(table.to_string(index=False))
    print(f"largest node budget verified for at most 1.3 one-row forwards: {largest_budget(table, 1.3)}")


def _measure_overhead(args, params, engine, suite, pair) -> OverheadReport:
    chosen = spread_over_categories(suite, args.overhead_prompts)
    prompts = [(item.id, encode_prompt(pair, item, params.chat)) for item in chosen]
    if not args.quiet:
        print(f"round overhead: greedy SD at γ={params.gamma} on {len(prompts)} prompt(s), "
              "then each model call timed alone…", flush=True)
    return measure_round_overhead(pair, prompts, gamma=params.gamma, max_new_tokens=params.max_new_tokens,
                                  **engine.as_kwargs())


def _print_overhead(report: OverheadReport, csv: str | None) -> None:
    with pd.option_context("display.max_columns", None, "display.width", 250, "display.float_format",
                           "{:.4g}".format):
        print(report.table.to_string(index=False))
    print(report.summary)
    if csv:
        Path(csv).parent.mkdir(parents=True, exist_ok=True)
        report.table.to_csv(csv, index=False)
        print(f"wrote {csv}")


def _print_summary(result: BenchResult) -> None:
    shown = ["category", "method", "tokens_per_s_mean", "tokens_per_s_std", "speedup_vs_ar", "speedup_vs_hf",
             "speedup_vs_hf_static", "acceptance_rate", "mean_accepted_tokens", "exact_match_pct", "first_divergence",
             "divergence_margin", "predicted_speedup", "cache", "runtime", "reference_runtime", "compile_seconds",
             "errors"]
    overall = result.summary[result.summary.category == ALL]
    shown = [c for c in shown if c not in ("speedup_vs_hf", "speedup_vs_hf_static") or overall[c].notna().any()]
    shown[shown.index("predicted_speedup"):shown.index("predicted_speedup")] = [
        c for c in ("perplexity", *QUALITY_COLUMNS) if c in overall and overall[c].notna().any()]
    if not overall.compile_seconds.fillna(0).any():
        shown.remove("compile_seconds")
    if overall.speedup_vs_fp32_ar.notna().any():
        shown += ["speedup_vs_fp32_ar", "token_match_vs_fp32", "prefix_match_vs_fp32", "chrf_vs_fp32"]
    meta = result.meta
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.float_format", "{:.3f}".format):
        print(overall[shown].to_string(index=False))
    others = reference_lines(overall)
    print(f"target {meta.get('target_dtype')}" + (f", draft {meta['draft_dtype']}" if meta.get("draft_dtype") else "")
          + f": speedup_vs_ar is over AR with the {meta.get('target_dtype')} target"
          + (", except where reference_runtime names another:" if others else ""))
    for line in others:
        print(line)
    if meta.get("exactness"):
        print(f"exactness {meta['exactness']}: {exactness_sentence(meta['exactness'])}")
    if "fp32_reference" in meta:
        print(f"vs fp32 columns: against {meta['fp32_reference']}"
              + (f" ({meta['fp32_reference_seconds']:.1f} s in all)" if "copy" in meta["fp32_reference"] else ""))
    warm = {m: s for m, s in result.meta.get("warmup_compile_seconds", {}).items() if s and s == s}
    if warm:
        print("compiled in the warm-up (not counted in tokens/s): "
              + ", ".join(f"{m} {s:.1f} s" for m, s in warm.items()))
    if "turn" in result.rows and result.rows.turn.max() > 1:
        _print_turns(result.rows)
    notes = result.rows[result.rows.note.fillna("") != ""] if "note" in result.rows else result.rows.iloc[:0]
    for _, row in notes.drop_duplicates("method").iterrows():
        print(f"note: {row.note}")
    errors = result.rows[result.rows.error.fillna("") != ""]
    for _, row in errors.drop_duplicates("method").iterrows():
        print(f"warning: {row.method} failed on {len(errors[errors.method == row.method])} run(s): {row.error}")


def reference_lines(overall: pd.DataFrame) -> list[str]:
    """Where a method's speedup_vs_ar is over an AR on another runtime than the runtime's own (a peer on the
    torch copy of a runtime target, against AR on that copy; the torch copy's AR against the runtime's), one
    line that names both sides; and which methods speedup_vs_hf leaves out, being on another runtime."""
    rows = overall.set_index("method")
    if "reference_runtime" not in rows or REFERENCE not in rows.index:
        return []
    lines, own = [], str(rows.loc[REFERENCE, "runtime"] or "")
    for method, row in rows.iterrows():
        mine, theirs = str(row.get("runtime") or ""), str(row.get("reference_runtime") or "")
        if method != REFERENCE and theirs and mine != own:
            lines.append(f"{method} ({mine}) vs AR ({theirs}): speedup_vs_ar {row.speedup_vs_ar:.2f}×")
    if "hf-generate" in rows.index:
        apart = [m for m in rows.index if m != "hf-generate" and pd.isna(rows.loc[m, "speedup_vs_hf"])
                 and rows.loc[m, "runtime"] != rows.loc["hf-generate", "runtime"]]
        if apart:
            lines.append(f"speedup_vs_hf is over hf-generate ({rows.loc['hf-generate', 'runtime']}) for methods on that "
                         f"runtime only; not for {', '.join(apart)} (on {own})")
    return lines


def print_batches(result: BenchResult) -> None:
    """Each batch size's throughput, latencies and ratio to AR, the methods that ran at batch 1 only, and
    the verdict."""
    shown = ["batch", "method", "requests", "throughput_tokens_per_s", "latency_p50_s", "latency_p95_s", "ttft_p50_s",
             "ttft_p95_s", "throughput_vs_ar", "throughput_vs_ar_low", "throughput_vs_ar_high", "acceptance_rate",
             "draft_seconds_per_round", "errors"]
    with pd.option_context("display.max_columns", None, "display.width", 220, "display.float_format", "{:.3f}".format):
        print("per batch size (throughput: all requests' new tokens ÷ the batches' wall time; "
              "throughput_vs_ar: over AR's at the same size, 95% bootstrap interval over batches):")
        print(result.batches[shown].to_string(index=False))
    for method, reason in result.meta.get("batch_one_only", {}).items():
        print(f"note: {method}: {reason}")
    print(batch_verdict(result.batches))


def _print_turns(rows: pd.DataFrame) -> None:
    """Questions of several turns: each turn's throughput and exact match to AR, every method."""
    ok = rows[rows.error.fillna("") == ""]
    by_turn = ok.groupby(["turn", "method"], sort=False).agg(
        runs=("seconds", "size"), new_tokens=("new_tokens", "sum"), seconds=("seconds", "sum"),
        prompt_tokens_mean=("prompt_tokens", "mean"),
        exact_match_pct=("matches_ar", lambda m: 100.0 * m.dropna().astype(bool).mean() if m.notna().any() else None))
    by_turn.insert(3, "tokens_per_s", by_turn.new_tokens / by_turn.seconds)
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.float_format", "{:.3f}".format):
        print("per turn (questions of several turns answer turn 2 after their own turn-1 answer):")
        print(by_turn.drop(columns="seconds").reset_index().to_string(index=False))
