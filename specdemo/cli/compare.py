"""`python -m specdemo compare`: run several methods on one prompt and tabulate them."""

from __future__ import annotations

import argparse
import math

import pandas as pd

from ..bench.measure.acceptance import comparison_break_evens, describe_auc
from ..bench.measure.compare import run_comparison
from ..bench.measure.tables import nodes_frame
from ..bench.measure.vs_float32 import VS_FLOAT32_COLUMNS, Float32Reference, runs_below_float32
from ..engine.divergence import describe_margin
from ..engine.methods import parse_methods
from ..models.precision import exactness_sentence, is_exact, mismatch_reading
from .common import (add_decoding_arguments, add_model_arguments, decode_params, default_chat, engine_options,
                     pair_from_args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", help="read the prompt from this file")
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--csv", help="write the comparison table (one row per method) here")
    out.add_argument("--trace-csv", help="write the per-round trace (one row per round per method) here")
    out.add_argument("--tokens-csv", help="write one row per drafted token (p, q, acceptance probability, "
                                          "accepted, drafter entropy) per method here")
    out.add_argument("--nodes-csv", help="write every node of every tree round (one row per node) here")
    out.add_argument("--show-text", action="store_true", help="print each method's output text")
    out.add_argument("--vs-fp32", dest="vs_fp32", action=argparse.BooleanOptionalAction, default=True,
                     help="where a model runs below float32 (bfloat16, float16, int8, int4), set every row against "
                          "AR of the target's weights at float32 on the same prompt: speed, token match, chrF, BLEU "
                          "(loads a float32 copy of the target unless it is float32 already; that run is timed in "
                          "no row) (default: on)")


def run(args: argparse.Namespace) -> int:
    """Run several methods on one prompt and print a comparison table (AR first, others as ratios)."""
    methods = parse_methods(args.methods)
    prompt = args.prompt if args.prompt is not None else open(args.prompt_file, encoding="utf-8").read()
    params = decode_params(args, chat_default=default_chat(args))  # fails on bad values before loading models
    engine = engine_options(args)
    pair = pair_from_args(args)
    if engine.first_round_note:
        print(f"{engine.first_round_note} (the first run of each model; not counted in tokens/s)")
    reference = Float32Reference() if args.vs_fp32 and runs_below_float32(pair) else None
    comparison = run_comparison(pair, prompt, methods, decode=params, vs_float32=reference, **engine.as_kwargs())
    summary, rounds = comparison.summary, comparison.rounds
    print(precision_line(summary))
    with pd.option_context("display.max_columns", None, "display.width", 160, "display.float_format", "{:.3f}".format):
        shown = ["label", "new_tokens", "tokens_per_s", "speedup_vs_ar", "ttft_s", "acceptance_rate",
                 "mean_accepted_tokens", "target_forwards_per_token", "mean_gamma", "matches_ar", "first_divergence",
                 "divergence_margin", "perplexity", "cache", "compile_seconds"]
        if comparison.float32_ar is not None:
            shown += VS_FLOAT32_COLUMNS
        print(summary[shown].to_string(index=False))
    if reference is not None:
        print(reference_line(reference, pair, comparison.float32_ar))
    for line in mismatch_lines(summary):
        print(line)
    for line in why_lines(summary):
        print(line)
    for result in comparison.results:
        if result.note:
            print(f"note: {result.note}")
    if args.show_text:
        for result in comparison.results:
            print(f"\n--- {result.method} ---\n{result.text}")
    if args.csv:
        summary.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    if args.trace_csv:
        rounds.to_csv(args.trace_csv, index=False)
        print(f"wrote {args.trace_csv}")
    if args.tokens_csv:
        comparison.tokens.to_csv(args.tokens_csv, index=False)
        print(f"wrote {args.tokens_csv}")
    if args.nodes_csv:
        nodes_frame(comparison.results).to_csv(args.nodes_csv, index=False)
        print(f"wrote {args.nodes_csv}")
    return 0


def precision_line(summary: pd.DataFrame) -> str:
    """Which precision each model ran at (speedup_vs_ar is over AR at the target's own precision),
    and what matches_ar can promise there."""
    first = summary.iloc[0] if len(summary) else {}
    target, draft, exactness = first.get("target_dtype"), first.get("draft_dtype"), first.get("exactness")
    line = (f"target {target or '?'}" + (f", draft {draft}" if isinstance(draft, str) and draft else "")
            + f": speedup_vs_ar is over AR with the {target or '?'} target")
    if isinstance(exactness, str) and exactness:
        line += f"\nexactness {exactness}: {exactness_sentence(exactness)}"
    return line


def divergence_phrase(index, margin) -> str:
    """", from token 12: near-tie (margin 0.12)" where the first divergence is known, else ""."""
    if index is None or pd.isna(index):
        return ""
    return f", from token {int(index)}: {describe_margin(float(margin) if margin is not None else math.nan)}"


def mismatch_lines(summary: pd.DataFrame) -> list[str]:
    """Each greedy run that left AR's tokens, read at its target's exactness: a fault of the method
    where the verification is exact, the precision's rounding where it is not."""
    lines = []
    for _, row in summary[summary.matches_ar.notna()].iterrows():
        if not bool(row["matches_ar"]):
            exactness = row.get("exactness") if isinstance(row.get("exactness"), str) else ""
            lines.append(f"{row['label']}: {mismatch_reading(exactness)}"
                         + ("" if is_exact(exactness) else " (its rounding, not a fault of the method)")
                         + divergence_phrase(row.get("first_divergence"), row.get("divergence_margin")))
    return lines


def reference_line(reference: Float32Reference, pair, float32_ar) -> str:
    """Where the vs-fp32 columns came from, and what that reference cost."""
    if float32_ar is None:
        return "vs fp32: no float32 AR reference ran"
    if not reference.loaded_beside(pair):
        return "vs fp32 columns: against this run's own AR (the target is float32 already; no extra run)"
    return (f"vs fp32 columns: against AR on a float32 copy of the target, loaded beside it; that run took "
            f"{reference.seconds:.2f} s ({len(float32_ar.tokens)} tokens, {float32_ar.stats['tokens_per_s']:.2f} tok/s), "
            "counted in no row")


def why_lines(summary: pd.DataFrame) -> list[str]:
    """Per drafting method: how well its drafter's entropy ranked acceptances, and its break-even."""
    evens = comparison_break_evens(summary)
    lines = []
    for _, row in summary.iterrows():
        parts = []
        if row["entropy_auc_n"]:
            parts.append(describe_auc(row["entropy_auc"], int(row["entropy_auc_n"])))
        if row["method"] in evens:
            parts.append(evens[row["method"]][0].sentence())
        if parts:
            lines.append(f"{row['label']}: " + "; ".join(parts))
    return lines
