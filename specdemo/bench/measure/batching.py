"""Batch size as an axis: how the prompts are cut into batches, each batch size's throughput,
latencies and ratio to AR, where the ratio falls below one, and the sentence that says up to which
batch size drafting still pays.

A batch of B requests goes through one target forward a round (`specdemo.generate_batch`). Drafting
pays at batch 1 because the target's forward is memory-bound: verifying γ+1 tokens costs about one
step. A batch fills the same forward with other rows, so the spare compute that verification used
shrinks, and every rejected draft costs a row of work. The summary below measures where that happens.

Definitions (one row per batch size and method):
  throughput_tokens_per_s  Σ new tokens of every row ÷ Σ wall seconds of the batch runs (each batch's
                  clock from its start to its last row's end), over every batch and repeat.
  latency_p50_s, latency_p95_s   per request: a row's seconds from its batch's start to its own end.
  ttft_p50_s, ttft_p95_s         per request: seconds from its batch's start to its first token.
  throughput_vs_ar  the method's throughput ÷ AR's at the same batch size, over the same batches
                  (each method ran every batch, in an order rotated per batch).
  throughput_vs_ar_low, _high   a percentile bootstrap interval (95 %) of that ratio, resampling the
                  batches as pairs (the method's run and AR's on the same prompts); none under
                  MIN_BATCHES batches.
  draft_seconds_per_round  the seconds a batch's round spends drafting, every row's drafts together
                  (a row's draft seconds are its rounds' drafting, which it waits for): per batch, its longest
                  row's draft seconds ÷ its rounds, averaged over the batches.

May import numpy, pandas and the method registry (which methods draft, which is AR); never plotly or gradio.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import pandas as pd

from ...engine.methods import METHODS, REFERENCE

# Each row of a benchmark or sweep names its batch: its size, which batch of that size (per repeat), the
# row's place in it, and the batch's wall seconds (the same on every row of the batch).
BATCH_COLUMNS = ["batch", "batch_index", "batch_row", "batch_seconds"]
BATCH_SUMMARY_COLUMNS = [
    "batch", "method", "label", "batches", "requests", "new_tokens", "wall_seconds", "throughput_tokens_per_s",
    "latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s", "throughput_vs_ar", "throughput_vs_ar_low",
    "throughput_vs_ar_high", "acceptance_rate", "mean_accepted_tokens", "draft_seconds_per_round", "errors",
]
CONFIDENCE = 0.95
RESAMPLES = 2000
# Resampling two batches only ever gives their two ratios and their pooled one: no interval below three.
MIN_BATCHES = 3
# Methods that draft nothing: the yardsticks, never the subject of the verdict (the registry's, and the peers').
NOT_DRAFTING = frozenset({*(name for name, method in METHODS.items() if not method.drafts), "torch-ar", "hf-generate",
                          "hf-generate-static", "onnx-generate"})


def parse_batch_sizes(value: str | int | Iterable[int] | None) -> list[int]:
    """Batch sizes from "1,2,4", a number or a list: whole numbers ≥ 1, each once, smallest first; [1] for
    None or an empty text."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return [1]
    items = value.split(",") if isinstance(value, str) else [value] if isinstance(value, int) else list(value)
    sizes = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"batch sizes must be whole numbers ≥ 1, e.g. 1,2,4,8; got {text!r}")
        sizes.append(int(text))
    if not sizes:
        raise ValueError("batch sizes: give at least one, e.g. 1,2,4,8")
    return sorted(set(sizes))


def cut_into_batches(count: int, size: int) -> list[list[int]]:
    """The prompts' indices cut into batches of exactly `size`: every prompt in at least one batch, the
    last batch filled from the start again (so that batch B always measures B rows)."""
    if count < 1 or size < 1:
        raise ValueError(f"cut_into_batches: need prompts and a size ≥ 1, got {count} prompts, size {size}")
    batches = -(-count // size)
    return [[(b * size + r) % count for r in range(size)] for b in range(batches)]


def batch_turns(count: int, sizes: Sequence[int], contenders: Sequence[Any], repeats: int
                ) -> Iterator[tuple[int, int, int, list[int], list[Any]]]:
    """(repeat, batch size, batch index, prompt indices, contenders in this batch's order): every batch
    of every size, each run by every contender, the order rotated one place per batch and per repeat."""
    turn = 0
    for repeat in range(repeats):
        for size in sizes:
            for index, prompts in enumerate(cut_into_batches(count, size)):
                shift = (repeat + turn) % len(contenders)
                turn += 1
                yield repeat, size, index, prompts, list(contenders[shift:]) + list(contenders[:shift])


def ratio_interval(tokens: Sequence[float], seconds: Sequence[float], ref_tokens: Sequence[float],
                   ref_seconds: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """(Σ tokens / Σ seconds) ÷ (Σ ref_tokens / Σ ref_seconds), and its percentile bootstrap interval over
    the paired batches (NaN under MIN_BATCHES)."""
    arrays = [np.asarray(a, dtype=float) for a in (tokens, seconds, ref_tokens, ref_seconds)]
    if len({len(a) for a in arrays}) != 1:
        raise ValueError("ratio_interval: every sequence needs one value per paired batch")
    mine_t, mine_s, ref_t, ref_s = arrays

    def ratio(t, s, rt, rs):
        with np.errstate(divide="ignore", invalid="ignore"):
            return (t / s) / (rt / rs)

    point = float(ratio(mine_t.sum(), mine_s.sum(), ref_t.sum(), ref_s.sum())) if len(mine_t) else math.nan
    if len(mine_t) < MIN_BATCHES or not math.isfinite(point):
        return point, math.nan, math.nan
    picks = np.random.default_rng(seed).integers(0, len(mine_t), size=(RESAMPLES, len(mine_t)))
    resampled = ratio(mine_t[picks].sum(1), mine_s[picks].sum(1), ref_t[picks].sum(1), ref_s[picks].sum(1))
    resampled = resampled[np.isfinite(resampled)]
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(resampled, [tail, 100 - tail])
    return point, float(low), float(high)


def _per_batch(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (repeat, batch index): the batch's new tokens and its wall seconds."""
    return runs.groupby(["repeat", "batch_index"]).agg(new_tokens=("new_tokens", "sum"),
                                                        seconds=("batch_seconds", "first"))


def _quantile(values: pd.Series, q: float) -> float:
    values = pd.to_numeric(values, errors="coerce").dropna()
    return float(values.quantile(q)) if len(values) else math.nan


def summarize_batches(rows: pd.DataFrame, key: str = "method", reference: str = REFERENCE) -> pd.DataFrame:
    """One row per (batch size, method) (BATCH_SUMMARY_COLUMNS), the methods in the rows' order; `key`
    names the column that tells the contenders apart ("setting" in a sweep) and `reference` AR's value."""
    if rows.empty or "batch" not in rows:
        return pd.DataFrame(columns=BATCH_SUMMARY_COLUMNS)
    failed = rows.error.fillna("").astype(str) != "" if "error" in rows else pd.Series(False, index=rows.index)
    ok = rows[~failed]
    out = []
    for size in sorted(rows.batch.dropna().unique()):
        here = ok[ok.batch == size]
        ref = _per_batch(here[here[key] == reference])
        for name in dict.fromkeys(rows[key]):
            mine = here[here[key] == name]
            errors = int((failed & (rows.batch == size) & (rows[key] == name)).sum())
            if mine.empty and not errors:
                continue
            out.append({"batch": int(size), "method": name, **_measured(mine, ref, errors)})
    return pd.DataFrame(out, columns=BATCH_SUMMARY_COLUMNS)


def _measured(mine: pd.DataFrame, ref: pd.DataFrame, errors: int) -> dict:
    per_batch = _per_batch(mine)
    paired = per_batch.join(ref.add_suffix("_ref"), how="inner")
    point, low, high = ratio_interval(paired.new_tokens, paired.seconds, paired.new_tokens_ref, paired.seconds_ref)
    drafted = mine.drafted.sum() if "drafted" in mine else 0
    seconds = float(per_batch.seconds.sum())
    return {
        "label": str(mine.label.iloc[0]) if "label" in mine and len(mine) else "",
        "batches": len(per_batch), "requests": len(mine), "new_tokens": int(mine.new_tokens.sum()),
        "wall_seconds": seconds,
        "throughput_tokens_per_s": mine.new_tokens.sum() / seconds if seconds > 0 else math.nan,
        "latency_p50_s": _quantile(mine.seconds, 0.5), "latency_p95_s": _quantile(mine.seconds, 0.95),
        "ttft_p50_s": _quantile(mine.get("ttft_s", pd.Series(dtype=float)), 0.5),
        "ttft_p95_s": _quantile(mine.get("ttft_s", pd.Series(dtype=float)), 0.95),
        "throughput_vs_ar": point, "throughput_vs_ar_low": low, "throughput_vs_ar_high": high,
        "acceptance_rate": mine.accepted.sum() / drafted if drafted else math.nan,
        "mean_accepted_tokens": (mine.new_tokens.sum() / mine.rounds.sum()
                                 if "rounds" in mine and mine.rounds.sum() else math.nan),
        "draft_seconds_per_round": _draft_seconds_per_round(mine),
        "errors": errors,
    }


def _draft_seconds_per_round(mine: pd.DataFrame) -> float:
    if mine.empty or "draft_seconds" not in mine or "rounds" not in mine:
        return math.nan
    longest = mine.loc[mine.groupby(["repeat", "batch_index"]).rounds.idxmax()]
    per_round = pd.to_numeric(longest.draft_seconds, errors="coerce") / longest.rounds.where(longest.rounds > 0)
    return float(per_round.mean()) if per_round.notna().any() else math.nan


def drafting_methods(summary: pd.DataFrame) -> list[str]:
    """The methods of a batch summary that draft (the subject of the verdict), in its order."""
    return [m for m in dict.fromkeys(summary.method) if m.split(":")[0] not in NOT_DRAFTING]


def crossover(summary: pd.DataFrame, method: str) -> int | None:
    """The first batch size, smallest first, at which the method's throughput falls below AR's; None if never."""
    mine = summary[(summary.method == method) & summary.throughput_vs_ar.notna()].sort_values("batch")
    below = mine[mine.throughput_vs_ar < 1.0]
    return int(below.batch.iloc[0]) if len(below) else None


def pays_up_to(summary: pd.DataFrame) -> pd.Series | None:
    """The summary row of the largest batch size at which a drafting method's interval lies above one
    (the highest ratio there); None where none does."""
    drafting = summary[summary.method.isin(drafting_methods(summary)) & (summary.throughput_vs_ar_low > 1.0)]
    if drafting.empty:
        return None
    largest = drafting[drafting.batch == drafting.batch.max()]
    return largest.loc[largest.throughput_vs_ar.idxmax()]


def batch_verdict(summary: pd.DataFrame) -> str:
    """One or two sentences: the largest batch size at which drafting still pays here (its interval above
    one), and where the best method's ratio crosses below one; or that it pays at none."""
    methods = drafting_methods(summary)
    sizes = ", ".join(str(int(b)) for b in sorted(summary.batch.unique())) if len(summary) else ""
    if not methods or summary.throughput_vs_ar.isna().all():
        return "No batch verdict: it needs AR and a drafting method measured at the same batch sizes."
    best = pays_up_to(summary)
    if best is None:
        drafting = summary[summary.method.isin(methods)].dropna(subset=["throughput_vs_ar"])
        top = drafting.loc[drafting.throughput_vs_ar.idxmax()]
        why = (f"under {MIN_BATCHES} batches give no interval" if drafting.throughput_vs_ar_low.isna().all()
               else "no drafting method's interval lies above 1")
        return (f"Drafting pays at none of the batch sizes measured here ({sizes}): {why}; the best ratio was "
                f"{_name(top)} at batch {int(top.batch)}, {top.throughput_vs_ar:.2f}× AR's throughput.")
    text = (f"Drafting still pays up to batch {int(best.batch)} here: {_name(best)} reaches "
            f"{best.throughput_vs_ar:.2f}× AR's throughput (95% interval {best.throughput_vs_ar_low:.2f}–"
            f"{best.throughput_vs_ar_high:.2f}).")
    below = crossover(summary, best.method)
    if below is not None and below > best.batch:
        ratio = summary[(summary.method == best.method) & (summary.batch == below)].throughput_vs_ar.iloc[0]
        text += f" From batch {below} its throughput falls below AR's ({ratio:.2f}×)."
    elif best.batch < summary.batch.max():
        text += f" Above it, up to batch {int(summary.batch.max())}, no interval lies above 1."
    return text


def _name(row: pd.Series) -> str:
    return str(row.label) if isinstance(row.get("label"), str) and row.label else str(row.method)
