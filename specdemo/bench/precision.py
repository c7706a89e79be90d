"""Precision measured side by side: AR speed of each target precision against float32's and
against the bytes-per-token roofline, how far a quantized target's greedy text moves from the
float32 target's, and the acceptance of each draft precision and of the quantized self-draft.

    python -m specdemo.bench.precision ar --dtypes float32,bfloat16,int8-dynamic,int8-weight-only
    python -m specdemo.bench.precision drafts --drafts embedded-lm:float32,embedded-lm:int8,embedded-head,self:int8
    python -m specdemo.bench.precision sweep --dtypes float32,bfloat16,int8 --draft-dtypes float32,int8

`sweep` crosses target precisions with draft precisions on one pair (default embedded-lm): each
row against AR at its own target precision and against float32 AR, with its token match, prefix
match, chrF and BLEU against float32 AR's text (`bench.vs_float32`).

Runs are interleaved (every precision on a prompt before the next prompt), greedy, on the
first prompts of the shipped suite's categories, at the thread count given (default one).
Prints a table and, with --csv, writes it; `ar --figure` also draws each target precision against
float32 AR (speed, token match, perplexity under float32) as an HTML chart, and `--png` as a PNG.
"""

from __future__ import annotations

import argparse
import math
import time

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..engine.decoding import generate
from ..models.loading import EMBEDDED, load_pair
from ..models.precision import weight_bytes
from .suite import DEFAULT_SUITE, encode_prompt, load_suite, select_prompts
from .measure.tables import target_perplexity
from .measure.vs_float32 import AGREEMENT_COLUMNS, FLOAT32, agreement, token_match
from ..engine.methods import FIXED_GAMMA, REFERENCE
from ..engine.pair import DRAFT_ROLE, TARGET_ROLE


def suite_prompts(pair, per_category: int, categories: str | None) -> list[list[int]]:
    """Chat-encoded ids of the first prompts of each category of the shipped suite."""
    suite = load_suite(DEFAULT_SUITE)
    chosen = select_prompts(suite, categories.split(",") if categories else None, per_category)
    return [encode_prompt(pair, item, chat=True) for item in chosen]


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """Bytes per second this process reads a large float32 tensor at its thread count (the best of
    `repeats` sums): the roofline's bandwidth on a CPU, whose datasheet figure no table holds."""
    data = torch.ones(megabytes * 2**20 // 4)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.numel() * 4 / best


def measure_targets(target: str, dtypes: list[str], prompts_per_category: int, categories: str | None,
                    max_new_tokens: int, repeats: int) -> pd.DataFrame:
    """One row per target precision: AR tokens/s (mean over runs), its ratio to float32's, weight
    bytes, the roofline bound, and the greedy text's token match and perplexity under float32."""
    pairs = {d: load_pair(target, target_dtype=d, device="cpu", runtime="torch") for d in dict.fromkeys(["float32", *dtypes])}
    prompts = suite_prompts(pairs["float32"], prompts_per_category, categories)
    timed: dict[str, list] = {d: [] for d in pairs}  # every counted run, the first pass's first
    for repeat in range(repeats + 1):  # the first pass warms every kernel up and is not counted
        for ids in prompts:
            for dtype, pair in pairs.items():
                result = generate(pair, ids, method=REFERENCE, max_new_tokens=max_new_tokens, temperature=0.0)
                if repeat:
                    timed[dtype].append(result)
    bandwidth = read_bandwidth()
    rows = []
    for dtype, pair in pairs.items():
        outputs, reference = timed[dtype][:len(prompts)], timed["float32"][:len(prompts)]
        rows.append({
            "target": dtype, "library": pair.target_precision.library,
            "ar_tokens_per_s": 1 / _seconds_per_token(timed[dtype]),
            "weight_bytes": weight_bytes(pair.target),
            "roofline_tokens_per_s": bandwidth / weight_bytes(pair.target),
            "token_match_vs_float32": _mean(token_match(r.token_ids, f.token_ids) for r, f in zip(outputs, reference)),
            "perplexity_under_float32": _mean(target_perplexity(pairs["float32"], r) for r in outputs),
        })
    frame = pd.DataFrame(rows)
    frame.insert(3, "vs_float32", frame.ar_tokens_per_s / frame.ar_tokens_per_s.iloc[0])
    frame["of_roofline"] = frame.ar_tokens_per_s / frame.roofline_tokens_per_s
    return frame


def measure_drafts(target: str, drafts: list[str], prompts_per_category: int, categories: str | None,
                   max_new_tokens: int, method: str = FIXED_GAMMA) -> pd.DataFrame:
    """One row per draft spec "REF[:PRECISION]" (self-drafts: "self:int8"), each with the float32
    target; greedy acceptance, draft seconds per drafted token, and speed against AR on the same pair."""
    pairs = {spec: _draft_pair(target, spec) for spec in drafts}
    prompts = suite_prompts(next(iter(pairs.values())), prompts_per_category, categories)
    runs = {name: ([], []) for name in pairs}  # the method's runs, and AR's on the same prompts
    for warm, ids in [(True, prompts[0])] + [(False, p) for p in prompts]:
        for name, pair in pairs.items():
            ar = generate(pair, ids, method=REFERENCE, max_new_tokens=max_new_tokens)
            sd = generate(pair, ids, method=method, max_new_tokens=max_new_tokens, copy_n=0)
            if ar.token_ids != sd.token_ids:
                raise AssertionError(f"{name}: {method} left AR's tokens")
            if not warm:
                runs[name][0].append(sd)
                runs[name][1].append(ar)
    rows = []
    for name, pair in pairs.items():
        mine, ar = runs[name]
        drafted = sum(r.stats["drafted"] for r in mine)
        rows.append({DRAFT_ROLE: name, "library": pair.draft_precision.library, "draft_weight_bytes": weight_bytes(pair.draft),
                     "acceptance_rate": sum(r.stats["accepted"] for r in mine) / drafted,
                     "draft_ms_per_token": 1000 * sum(r.stats["draft_seconds"] for r in mine) / drafted,
                     f"{method}_tokens_per_s": 1 / _seconds_per_token(mine),
                     "speedup_vs_ar": _seconds_per_token(ar) / _seconds_per_token(mine)})
    return pd.DataFrame(rows)


SWEEP_COLUMNS = [TARGET_ROLE, DRAFT_ROLE, "method", "tokens_per_s", "speedup_vs_own_ar", "speedup_vs_fp32_ar",
                 "acceptance_rate", "matches_own_ar", *AGREEMENT_COLUMNS]


def measure_sweep(pair_name: str, targets: list[str], drafts: list[str], prompts_per_category: int,
                  categories: str | None, max_new_tokens: int, method: str = FIXED_GAMMA,
                  draft: str | None = None) -> pd.DataFrame:
    """One row per target precision's AR and one per (target, draft) precision's `method`, greedy:
    decoding tokens/s (the prefill apart), its ratio to AR at the same target precision and to float32
    AR, its acceptance, the share of prompts where it gave its own AR's tokens, and its mean token
    match, prefix match, chrF and BLEU against float32 AR's output (`bench.vs_float32`). float32 AR
    is the float32 target's own AR run, so the reference costs no extra run. `pair_name` is a preset,
    or a target with `draft`."""
    targets = list(dict.fromkeys([FLOAT32, *targets]))
    pairs = {(t, d): load_pair(pair_name, draft, device="cpu", target_dtype=t, draft_dtype=d, runtime="torch") for t in targets for d in drafts}
    prompts = suite_prompts(next(iter(pairs.values())), prompts_per_category, categories)
    keys = [(t, None, REFERENCE) for t in targets] + [(t, d, method) for t in targets for d in drafts]
    runs: dict[tuple, list] = {key: [] for key in keys}
    for warm, ids in [(True, prompts[0])] + [(False, p) for p in prompts]:  # the first pass warms kernels up
        for target, draft, name in keys:
            pair = pairs[(target, draft if draft is not None else drafts[0])]
            result = generate(pair, ids, method=name, max_new_tokens=8 if warm else max_new_tokens,
                              temperature=0.0, copy_n=0)
            if not warm:
                runs[(target, draft, name)].append(result)
    rows = [_sweep_row(key, runs) for key in keys]
    return pd.DataFrame(rows, columns=SWEEP_COLUMNS)


def _sweep_row(key: tuple, runs: dict[tuple, list]) -> dict:
    target, draft, method = key
    mine, own_ar, float32_ar = runs[key], runs[(target, None, REFERENCE)], runs[(FLOAT32, None, REFERENCE)]
    drafted = sum(r.stats["drafted"] for r in mine)
    scores = [agreement(r.token_ids, r.text, f.token_ids, f.text) for r, f in zip(mine, float32_ar)]
    return {TARGET_ROLE: target, DRAFT_ROLE: draft or "", "method": method, "tokens_per_s": 1 / _seconds_per_token(mine),
            "speedup_vs_own_ar": _seconds_per_token(own_ar) / _seconds_per_token(mine),
            "speedup_vs_fp32_ar": _seconds_per_token(float32_ar) / _seconds_per_token(mine),
            "acceptance_rate": sum(r.stats["accepted"] for r in mine) / drafted if drafted else math.nan,
            "matches_own_ar": _mean(float(r.token_ids == a.token_ids) for r, a in zip(mine, own_ar)),
            **{name: _mean(s[name] for s in scores) for name in AGREEMENT_COLUMNS}}


def _seconds_per_token(results) -> float:
    """Decoding seconds per new token over the runs (the prefill is another workload)."""
    return sum(r.seconds - r.prefill_seconds for r in results) / sum(len(r.tokens) for r in results)


def _draft_pair(target: str, spec: str):
    """The pair for a draft spec: "embedded-lm:int8" (a draft at a precision) or "self:int8"."""
    if spec.startswith("self:"):
        return load_pair(target, spec, device="cpu", runtime="torch")
    ref, _, dtype = spec.partition(":")
    return load_pair(target, ref, device="cpu", draft_dtype=dtype or None, runtime="torch")


def _mean(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def vs_float32_figure(frame: pd.DataFrame) -> go.Figure:
    """`measure_targets`' table as three bar charts, one bar per target precision: AR speed over
    float32's, the share of the greedy text's positions that hold float32's token, and that text's
    perplexity under the float32 target (float32's own text is the floor)."""
    panels = (("vs_float32", "AR tokens/s ÷ float32", "{:.2f}×"),
              ("token_match_vs_float32", "token match with float32 (%)", "{:.0f} %"),
              ("perplexity_under_float32", "perplexity under float32", "{:.2f}"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[title for _, title, _ in panels])
    labels = [f"{t}<br>({lib})" for t, lib in zip(frame.target, frame.library)]
    for col, (column, _, text) in enumerate(panels, 1):
        values = frame[column] * (100 if column == "token_match_vs_float32" else 1)
        fig.add_bar(x=labels, y=values, text=[text.format(v) for v in values], textposition="outside",
                    showlegend=False, row=1, col=col)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(title="Each target precision against float32 AR (greedy, same prompts)", height=420,
                      margin=dict(t=90, b=90), template="plotly_white")
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdemo.bench.precision", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=(REFERENCE, "drafts", "sweep"))
    parser.add_argument("--target", default=EMBEDDED, help="the target (default: the embedded SmolLM2-135M)")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8",
                        help="ar, sweep: comma-separated target precisions (float32 is always measured)")
    parser.add_argument("--draft-dtypes", default="float32,int8", help="sweep: comma-separated draft precisions")
    parser.add_argument("--pair", default="embedded-lm", help="sweep: the pair (default: embedded-lm)")
    parser.add_argument("--drafts", default="embedded-lm:float32,embedded-lm:bfloat16,embedded-lm:int8,embedded-head,"
                        "self:int8", help="drafts: comma-separated REF[:PRECISION] drafts, or self:PRECISION")
    parser.add_argument("--method", default=FIXED_GAMMA, help="drafts, sweep: the drafting method (default: %(default)s)")
    parser.add_argument("--per-category", type=int, default=1, help="prompts per suite category (default: 1)")
    parser.add_argument("--categories", default=None, help="comma-separated suite categories (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="ar: timed passes over the prompts (default: 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    parser.add_argument("--csv", default=None, help="write the table here")
    parser.add_argument("--figure", default=None, help="ar: write the chart against float32 AR here (HTML)")
    parser.add_argument("--png", default=None, help="ar: and as a PNG (needs Playwright and Chromium)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if args.what == REFERENCE:
        frame = measure_targets(args.target, dtypes, args.per_category, args.categories, args.max_new_tokens,
                                args.repeats)
        write_figure(vs_float32_figure(frame), args.figure, args.png)
    elif args.what == "sweep":
        frame = measure_sweep(args.pair, dtypes, [d for d in args.draft_dtypes.split(",") if d], args.per_category,
                              args.categories, args.max_new_tokens, args.method)
    else:
        frame = measure_drafts(args.target, [d for d in args.drafts.split(",") if d], args.per_category,
                               args.categories, args.max_new_tokens, args.method)
    show_table(frame, args.csv)
    return 0



def write_figure(fig: go.Figure, html: str | None, png: str | None) -> None:
    if html:
        fig.write_html(html, include_plotlyjs=True)  # offline: plotly.js inside
        print(f"wrote {html}")
    if png:
        from .measure.chartpng import save_chart_png

        print(f"wrote {save_chart_png(fig, png)}")


def show_table(frame: pd.DataFrame, csv: str | None) -> None:
    """A measurement's table printed in full (three decimals), and written to `csv` when given."""
    with pd.option_context("display.width", 200, "display.max_columns", None, "display.float_format", "{:.3f}".format):
        print(frame.to_string(index=False))
    if csv:
        frame.to_csv(csv, index=False)

if __name__ == "__main__": raise SystemExit(main())
