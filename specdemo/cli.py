"""`python -m specdemo compare ...`: run several methods on one prompt and tabulate them."""

from __future__ import annotations

import argparse
import sys
from typing import Callable

import pandas as pd

from .loading import PRESETS, ModelLoadError, load_pair
from .methods import METHODS, parse_methods
from .params import DecodeParams

# Subcommands other modules contribute: name → (add_arguments, run).
SUBCOMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]] = {}

DEFAULTS = DecodeParams()


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--pair", default=None, choices=sorted(PRESETS),
                       help="a model-pair preset (default: embedded, unless --target is given)")
    group.add_argument("--target", default=None, help="target: hub id, local folder or .gguf file")
    group.add_argument("--draft", default=None, help="draft for sd/egag: hub id, local folder or .gguf file")
    group.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda if available)")
    group.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 on CPU, bfloat16 on GPU)")


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("decoding")
    group.add_argument("--methods", default="ar,sd,nasd,egag", help=f"comma-separated, from: {', '.join(METHODS)}")
    group.add_argument("--max-new-tokens", type=int, default=DEFAULTS.max_new_tokens, help="stop after this many new tokens")
    group.add_argument("--temperature", type=float, default=DEFAULTS.temperature, help="0 = greedy")
    group.add_argument("--top-k", type=int, default=DEFAULTS.top_k, help="0 = off")
    group.add_argument("--top-p", type=float, default=DEFAULTS.top_p, help="1 = off")
    group.add_argument("--seed", type=int, default=None, help="random seed (sampling); the same seed gives the same run")
    group.add_argument("--gamma", type=int, default=DEFAULTS.gamma, help="draft length γ of sd and nasd")
    group.add_argument("--gamma-min", type=int, default=DEFAULTS.gamma_min, help="egag: smallest γ")
    group.add_argument("--gamma-max", type=int, default=DEFAULTS.gamma_max, help="egag: largest γ")
    group.add_argument("--ema", type=float, default=DEFAULTS.ema, help="egag: entropy smoothing β (0 = none)")
    group.add_argument("--ngram-n", type=int, default=DEFAULTS.ngram_n, help="nasd: n of the n-gram table")
    group.add_argument("--ngram-storage", default=DEFAULTS.ngram_storage, help="nasd: basic or onelevel")
    group.add_argument("--top-k-filler", type=int, default=DEFAULTS.top_k_filler,
                       help="nasd: target top-k predictions added to the table per verified position")
    group.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                       help="wrap the prompt in the chat template (default: on for the embedded pair)")


def decoding_params(args: argparse.Namespace, chat_default: bool) -> dict:
    return dict(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        seed=args.seed, gamma=args.gamma, gamma_min=args.gamma_min, gamma_max=args.gamma_max, ema=args.ema,
        ngram_n=args.ngram_n, ngram_storage=args.ngram_storage, top_k_filler=args.top_k_filler,
        chat=chat_default if args.chat is None else args.chat,
    )


def pair_from_args(args: argparse.Namespace):
    if args.target:
        return load_pair(args.target, args.draft, device=args.device, dtype=args.dtype)
    return load_pair(args.pair or "embedded", device=args.device, dtype=args.dtype)


def _compare_arguments(parser: argparse.ArgumentParser) -> None:
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", help="read the prompt from this file")
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--csv", help="write the comparison table (one row per method) here")
    out.add_argument("--trace-csv", help="write the per-round trace (one row per round per method) here")
    out.add_argument("--show-text", action="store_true", help="print each method's output text")


def _compare(args: argparse.Namespace) -> int:
    """Run several methods on one prompt and print a comparison table (AR first, others as ratios)."""
    from .compare import run_comparison

    methods = parse_methods(args.methods)
    prompt = args.prompt if args.prompt is not None else open(args.prompt_file, encoding="utf-8").read()
    params = decoding_params(args, chat_default=not args.target and (args.pair or "embedded") == "embedded")
    DecodeParams.from_values(**params)  # fail on bad values before loading models
    pair = pair_from_args(args)
    comparison = run_comparison(pair, prompt, methods, **params)
    summary, rounds = comparison.summary, comparison.rounds
    with pd.option_context("display.max_columns", None, "display.width", 160, "display.float_format", "{:.3f}".format):
        shown = ["label", "new_tokens", "tokens_per_s", "speedup_vs_ar", "ttft_s", "acceptance_rate",
                 "mean_accepted_tokens", "target_forwards_per_token", "mean_gamma", "matches_ar", "perplexity"]
        print(summary[shown].to_string(index=False))
    if args.show_text:
        for result in comparison.results:
            print(f"\n--- {result.method} ---\n{result.text}")
    if args.csv:
        summary.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    if args.trace_csv:
        rounds.to_csv(args.trace_csv, index=False)
        print(f"wrote {args.trace_csv}")
    return 0


SUBCOMMANDS["compare"] = (_compare_arguments, _compare)


def build_parser() -> argparse.ArgumentParser:
    from . import bench  # noqa: F401  (registers the bench subcommand)

    parser = argparse.ArgumentParser(prog="python -m specdemo", description="Compare AR, SD, NASD and EGAG decoding.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (add_arguments, run) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=(run.__doc__ or "").strip().splitlines()[0] if run.__doc__ else None,
                                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        add_arguments(sub)
        sub.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, ModelLoadError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
