"""`python -m specdemo sweep`: speedup against γ (SD), γ_max and EMA (EGAG) and n (NASD), AR interleaved."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch

from ..bench.long_suite import LONG_LENGTHS, long_suite
from ..bench.suite import select_prompts
from ..engine.methods import BASELINES
from ..bench.sweep import (
    DEFAULT_EMAS, DEFAULT_GAMMA_MAXES, DEFAULT_GAMMAS, SWEEP_METHODS, SweepResult, expand_grid, run_sweep,
    write_outputs,
)
from ..bench.sweep.axes import CACHE_AXES, OUTER_AXES, PRECISION_AXES, SAMPLING_AXES, axes_table, combinations, label, parse_axis, stacked
from ..bench.sweep.axes_report import axes_batches, axes_report_html, batch_verdicts
from ..engine.params import PARAMS, DecodeParams
from .common import (add_cluster_arguments, add_decoding_arguments, add_model_arguments, add_suite_arguments,
                     cluster_from_args, configured, decode_params, default_chat, pair_from_args, pair_spec_from_args,
                     progress_bar, read_suite, suite_needs_tokenizer)

GRID_PARAMS = ("gamma", "gamma_max", "ema", "ngram_n", "copy_n", "node_budget", "adaedl_lambda", "entropy_stop",
               "specdecpp_threshold")  # lists here, single values elsewhere
SHOWN = ["label", "runs", "speedup_vs_ar", "speedup_vs_ar_std", "tokens_per_s", "acceptance_rate",
         "mean_accepted_tokens", "mean_gamma", "wasted_drafts_per_token", "target_forwards_per_token",
         "predicted_speedup", "exact_match_pct"]


def _csv(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_suite_arguments(parser, repeats=2, what="(prompt, setting)")
    grid = parser.add_argument_group("grid (comma-separated values; AR always runs)")
    grid.add_argument("--methods", default=None,
                      help=f"which of {', '.join(SWEEP_METHODS)} to sweep (default: each whose grid is given; "
                           f"nasd only with --ngram-n), plus any of the baselines {', '.join(BASELINES)}, each run "
                           "once per prompt as a reference beside AR")
    grid.add_argument("--gamma", default=_csv(DEFAULT_GAMMAS), help=f"SD: draft lengths γ (default: {_csv(DEFAULT_GAMMAS)})")
    grid.add_argument("--gamma-max", dest="gamma_max", default=_csv(DEFAULT_GAMMA_MAXES),
                      help=f"EGAG: largest γ (default: {_csv(DEFAULT_GAMMA_MAXES)})")
    grid.add_argument("--ema", default=_csv(DEFAULT_EMAS), help=f"EGAG: entropy EMA β (default: {_csv(DEFAULT_EMAS)})")
    grid.add_argument("--ngram-n", dest="ngram_n", default=None, help="NASD: n of the n-gram table (default: no NASD)")
    grid.add_argument("--node-budget", dest="node_budget", default=None,
                      help="SD-tree: node budgets, e.g. 3,8,16 (default: no SD-tree); its other tree parameters are "
                           "the shared --tree-policy, --max-depth, --max-width, --tree-shape")
    grid.add_argument("--copy-n", dest="copy_n", default=None,
                      help=f"SD and EGAG: copy_n values, each setting run with each (0 = no copying; default: "
                           f"{PARAMS['copy_n'].default} alone, the setting's labels unchanged)")
    grid.add_argument("--adaedl-lambda", dest="adaedl_lambda", default=None, help="AdaEDL: thresholds λ, e.g. 0.3,0.5")
    grid.add_argument("--entropy-stop", dest="entropy_stop", default=None, help="EGAG-token: entropy thresholds")
    grid.add_argument("--specdecpp-threshold", dest="specdecpp_threshold", default=None,
                      help="SpecDec++: thresholds on the predicted probability of a rejection so far")
    grid.add_argument("--stop-cap", type=int, default=8, help="the per-token rules' largest γ (default: 8)")
    grid.add_argument("--nasd-gamma", type=int, default=PARAMS["gamma"].default,
                      help=f"NASD: γ at every n (default: {PARAMS['gamma'].default})")
    parser.add_argument("--long", nargs="?", const=_csv(LONG_LENGTHS), default=None, metavar="LENGTHS",
                        help="sweep the long suite (bench/long_suite.py) instead: one prompt of each of these lengths "
                             f"in the target's tokens (default: {_csv(LONG_LENGTHS)}), made from the shipped suite's "
                             "texts once the pair is loaded; --limit still caps prompts per length")
    parser.add_argument("--long-per-length", type=int, default=1, metavar="N",
                        help="with --long: prompts of each length (default: 1)")
    add_model_arguments(parser)
    # The shared decoding flags, as compare takes them, less the ones swept (γ_min stays: EGAG's floor).
    add_decoding_arguments(parser, methods=False, exclude=(*GRID_PARAMS, *CACHE_AXES, *SAMPLING_AXES))
    axes = parser.add_argument_group(
        "axes around the grid (comma-separated; each combination runs the whole grid again, AR included)",
        "--target-dtype and --draft-dtype above also take lists, e.g. --target-dtype float32,int8")
    for name in CACHE_AXES:
        spec = PARAMS[name]
        axes.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                          help=f"{spec.help} (default: {spec.default})")
    axes.add_argument("--temperature", default=None, metavar="T,T,…",
                      help="sampling temperatures, e.g. 0,0.7,1.0: the grid runs at each, AR at each temperature its "
                           "reference; rows carry temperature (default: 0, greedy)")
    axes.add_argument("--batch", default=None, metavar="B,B,…",
                      help="batch sizes, e.g. 1,2,4,8: the grid runs on batches of each size through generate_batch; "
                           "prints each size's throughput over AR's with its interval and the verdict; chain "
                           "methods only (default: 1)")
    replayed = parser.add_argument_group(
        "replay (greedy): every setting replayed exactly from one recorded AR run per prompt, its time predicted")
    replayed.add_argument("--replay", action="store_true",
                          help="record AR once per prompt and replay the whole grid from it over the draft's chains, "
                               "shared across settings: exact rounds, acceptance and τ; tokens/s and speedup are "
                               "predictions from this machine's cost table (calibrated and cached the first time), "
                               "in predicted_* columns; replayed rows say replayed=True")
    replayed.add_argument("--confirm", type=int, default=0, metavar="K",
                          help="with --replay: then decode the K settings of the highest predicted speedup for real "
                               "(--repeats times, AR interleaved) and print predicted beside measured tokens/s")
    out = parser.add_argument_group("output")
    out.add_argument("--csv", help="one row per (method, setting, prompt, repeat)")
    out.add_argument("--summary-csv", help="one row per (method, setting); default: next to --csv as *.summary.csv")
    out.add_argument("--tokens-csv", help="one row per drafted token (setting, p, q, acceptance probability, "
                                          "accepted, drafter entropy)")
    out.add_argument("--report", help="HTML report: verdict, summary and charts")
    out.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                     help="embed plotly.js in the report (offline) or link it from a CDN (default: inline)")
    out.add_argument("--chart-png", help="save the speedup-against-γ chart as a PNG (needs Playwright and Chromium)")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    add_cluster_arguments(parser, "grid's prompts")


def run(args: argparse.Namespace) -> int:
    """Sweep γ (SD), γ_max and EMA (EGAG) and n (NASD) on a prompt suite, AR interleaved."""
    params = decode_params(args, chat_default=default_chat(args),
                           exclude=(*GRID_PARAMS, *CACHE_AXES, *SAMPLING_AXES))  # fails before loading
    for name in ("repeats", "threads", "limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be an integer ≥ 1, got {value}")
    settings = expand_grid(args.gamma, args.gamma_max, args.ema, args.ngram_n, args.methods, args.copy_n, args.node_budget,
                           args.adaedl_lambda, args.entropy_stop, args.specdecpp_threshold,
                           gamma_min=params.gamma_min, nasd_gamma=args.nasd_gamma, stop_cap=args.stop_cap)
    args.cluster_run = cluster_from_args(args, args.threads)
    # Prompts cut in the target's tokens are read once the pair is loaded; every other suite now.
    long_lengths = _long_lengths(args)
    if args.cluster_run is not None and (long_lengths or suite_needs_tokenizer(args)):
        raise ValueError("--long and --prompt-tokens cut prompts with the pair's tokenizer, which a --cluster "
                         "driver never loads; give a suite of prompts instead")
    suite = None if long_lengths or suite_needs_tokenizer(args) else select_prompts(read_suite(args), args.categories,
                                                                                    args.limit)
    if args.chart_png:
        from ..bench.measure.chartpng import save_chart_png  # noqa: F401  (fail on a missing Playwright before the sweep)
    if args.confirm and not args.replay:
        raise ValueError("--confirm K decodes the best replayed settings: give it with --replay")
    replayable = _replayable(args, params) if args.replay else None
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        if args.replay:
            return _replay_with(args, *replayable, settings, suite)
        return _sweep_with(args, params, settings, suite)
    finally:
        torch.set_num_threads(threads)


def _sweep_with(args, params, settings, suite) -> int:
    planned = _combinations(args, params)  # every combination checked before any pair loads
    runs = []
    for combination, combined in planned:
        if len(planned) > 1:
            print(f"\n== {label(combination)}", flush=True)
        pair = _pair_or_spec(_with_precisions(args, combination))  # a cluster's workers load their own
        if suite is None:
            suite = select_prompts(_read_suite_with(args, pair.tokenizer), args.categories, args.limit)
        with progress_bar(args.quiet, "task" if args.cluster_run else "run") as progress:
            result = run_sweep(pair, suite, settings, repeats=args.repeats, warmup=args.warmup, progress=progress,
                               cluster=args.cluster_run, batch=combination.get("batch", 1), **combined.as_dict())
        del pair  # one pair in memory at a time
        print_summary(result)
        runs.append((combination, result))
        if len(planned) > 1:
            _write_reports(args, result, suffix=_slug(combination))
    if len(runs) == 1:
        _write(args, runs[0][1])
        if "batch" in runs[0][0]:
            _print_and_write_axes(args, runs, None)
        return 0
    table = axes_table(runs)
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.float_format", "{:.3f}".format):
        print("\n" + table.to_string(index=False))
    _write_stacked(args, runs, table)
    _print_and_write_axes(args, runs, table)
    return 0


REPLAY_SHOWN = ["label", "replayed", "prompts", "mean_accepted_tokens", "acceptance_rate", "mean_gamma",
                "predicted_tokens_per_s", "predicted_speedup_vs_ar", "tokens_per_s", "exact_match_pct"]


def _replayable(args, params: DecodeParams) -> tuple[dict, DecodeParams]:
    """--replay's one combination and its parameters, refused before any pair loads where a recorded greedy
    run cannot stand in for the sweep (sampling, several combinations, batches, a cluster)."""
    if args.confirm < 0:
        raise ValueError(f"--confirm must be an integer ≥ 0, got {args.confirm}")
    planned = _combinations(args, params)
    if len(planned) > 1 or args.cluster_run is not None:
        raise ValueError("--replay replays one pair here, on one precision, cache and temperature: give one value "
                         "of each axis and no --cluster")
    combination, combined = planned[0]
    if combination.get("batch", 1) != 1:
        raise ValueError("--replay replays one request at a time: drop --batch")
    if not combined.sampling.greedy:
        raise ValueError(f"--replay follows greedy AR's path; temperature {combined.temperature} samples, and a "
                         "sampled run leaves it, where nothing was recorded")
    return combination, combined


def _replay_with(args, combination: dict, params: DecodeParams, settings, suite) -> int:
    from ..bench.sweep.replay import confirm, replay_sweep

    pair = pair_from_args(_with_precisions(args, combination))
    if suite is None:
        suite = select_prompts(_read_suite_with(args, pair.tokenizer), args.categories, args.limit)
    with progress_bar(args.quiet, "step") as progress:
        result = replay_sweep(pair, suite, settings, progress=progress, **params.as_dict())
    seconds = result.meta["seconds"]
    shown = ("display.max_columns", None, "display.width", 220, "display.float_format", "{:.3f}".format)
    with pd.option_context(*shown):
        print(result.summary[REPLAY_SHOWN].to_string(index=False))
        print(f"\nrecorded AR in {seconds['record']:.2f} s, replayed {len(result.settings) - 1} settings in "
              f"{seconds['replay']:.2f} s (predictions {seconds['predict']:.2f} s); time columns are predictions "
              f"from the cost table {result.meta['cost_table']}")
        if args.confirm:
            with progress_bar(args.quiet, "run") as progress:
                _, table = confirm(pair, suite, result, args.confirm, repeats=args.repeats, progress=progress,
                                   warmup=args.warmup, **params.as_dict())
            print("\npredicted beside measured (the best settings decoded for real):")
            print(table.to_string(index=False))
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        result.rows.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    summary_csv = _summary_csv(args)
    if summary_csv:
        Path(summary_csv).parent.mkdir(parents=True, exist_ok=True)
        result.summary.to_csv(summary_csv, index=False)
        print(f"wrote {summary_csv}")
    return 0


def _pair_or_spec(args):
    """The pair, loaded here; under --cluster what identifies it, each worker loading its own."""
    return pair_spec_from_args(args) if args.cluster_run is not None else pair_from_args(args)


def _long_lengths(args) -> tuple[int, ...]:
    """--long's prompt lengths, checked before any model loads; () without --long."""
    if args.long is None:
        return ()
    if args.suite:
        raise ValueError("--long and --suite name two suites: give one")
    if args.long_per_length < 1:
        raise ValueError(f"--long-per-length must be an integer ≥ 1, got {args.long_per_length}")
    try:
        lengths = tuple(int(v) for v in args.long.split(",") if v.strip())
    except ValueError:
        lengths = ()
    if not lengths or min(lengths) < 64:
        raise ValueError(f"--long takes prompt lengths in tokens, each ≥ 64, e.g. 1024,2048; got {args.long!r}")
    return lengths


def _read_suite_with(args, tokenizer) -> list:
    """The suite once the pair's tokenizer is there: the long suite under --long, else the command line's."""
    if args.long is not None:
        return long_suite(tokenizer, _long_lengths(args), args.long_per_length)
    return read_suite(args, tokenizer)


def _combinations(args, params: DecodeParams) -> list[tuple[dict, DecodeParams]]:
    """Each combination of the precision and cache axes, with its validated decoding parameters."""
    axes = {name: parse_axis(name, configured(args, name)) for name in OUTER_AXES}
    planned = []
    for combination in combinations(axes):
        caches = {name: value for name, value in combination.items() if name in (*CACHE_AXES, *SAMPLING_AXES)}
        planned.append((combination, DecodeParams.from_values(**{**params.as_dict(), **caches})))
    return planned


def _with_precisions(args, combination) -> argparse.Namespace:
    """`args` with one precision each for the target and the draft (the combination's, else the command line's)."""
    one = argparse.Namespace(**vars(args))
    for name in PRECISION_AXES:
        if name in combination:
            setattr(one, name, combination[name])
    return one


def _slug(combination) -> str:
    return ".".join(f"{name}-{value}" for name, value in combination.items())


def _summary_csv(args) -> str | None:
    """--summary-csv, else next to --csv as *.summary.csv."""
    if args.csv and not args.summary_csv:
        return str(Path(args.csv).with_suffix("")) + ".summary.csv"
    return args.summary_csv


def _write(args, result: SweepResult) -> None:
    for path in write_outputs(result, args.csv, _summary_csv(args), tokens_csv=args.tokens_csv):
        print(f"wrote {path}")
    _write_reports(args, result)


def _suffixed(path: str | None, suffix: str | None) -> str | None:
    if not path or not suffix:
        return path
    return str(Path(path).with_suffix("")) + f".{suffix}{Path(path).suffix}"


def _write_reports(args, result: SweepResult, suffix: str | None = None) -> None:
    """The HTML report and the chart; with `suffix`, one combination's, named after it (the CSVs
    stack every combination)."""
    if args.report:
        for path in write_outputs(result, report=_suffixed(args.report, suffix), plotlyjs=args.plotlyjs):
            print(f"wrote {path}")
    if args.chart_png:
        from ..bench.measure.chartpng import save_chart_png

        print(f"wrote {save_chart_png(result.figures['speedup_vs_gamma'], _suffixed(args.chart_png, suffix))}")


def _write_stacked(args, runs, table: pd.DataFrame) -> None:
    """The rows, summary and token CSVs of every combination in one file each, an axis column per
    axis, and the combinations side by side (`axes_table`) beside the summary as *.axes.csv."""
    summary_csv = _summary_csv(args)
    outputs = {"rows": args.csv, "summary": summary_csv, "tokens": args.tokens_csv}
    for part, target in outputs.items():
        frame = stacked(runs, part) if target else None
        if frame is not None:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(target, index=False)
            print(f"wrote {target}")
    if summary_csv:
        axes_csv = str(Path(summary_csv).with_suffix("")).removesuffix(".summary") + ".axes.csv"
        table.to_csv(axes_csv, index=False)
        print(f"wrote {axes_csv}")


def _print_and_write_axes(args, runs, table: pd.DataFrame | None) -> None:
    """With a batch axis: each size's throughput over AR's and the verdict, and *.batch.csv beside the summary;
    with --report and several combinations, one page beside it (*.axes.html) that sets them side by side."""
    batches = axes_batches(runs)
    if batches is not None:
        shown = ["batch", "label", "requests", "throughput_tokens_per_s", "latency_p50_s", "latency_p95_s",
                 "ttft_p50_s", "throughput_vs_ar", "throughput_vs_ar_low", "throughput_vs_ar_high"]
        with pd.option_context("display.max_columns", None, "display.width", 220, "display.float_format",
                               "{:.3f}".format):
            print("\n" + batches[shown].to_string(index=False))
        for line in batch_verdicts(batches, [c for c in batches.columns[:batches.columns.get_loc("batch")]]):
            print(line)
        summary_csv = _summary_csv(args)
        if summary_csv:
            batch_csv = str(Path(summary_csv).with_suffix("")).removesuffix(".summary") + ".batch.csv"
            batches.to_csv(batch_csv, index=False)
            print(f"wrote {batch_csv}")
    if args.report and table is not None:
        path = _suffixed(args.report, "axes")
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        axes_report_html(runs, table, path, args.plotlyjs)
        print(f"wrote {path}")


def print_summary(result: SweepResult) -> None:
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.float_format", "{:.3f}".format):
        print(result.summary[SHOWN].to_string(index=False))
    policies = result.policy_table
    if not policies.empty:
        print()
        with pd.option_context("display.max_columns", None, "display.width", 250, "display.float_format", "{:.3f}".format):
            print(policies.to_string(index=False))
    print()
    print(result.verdict)
    for error in (result.errors.itertuples() if result.errors is not None else ()):
        print(f"warning: task {error.task} failed after {error.attempts} attempt(s), its rows left out: {error.reason}")
    if result.stopped:
        print("stopped early: the summary holds the runs that finished")
