"""A sweep's summary and verdict, and `SweepResult`, the record a finished sweep leaves.

The summary (one row per method and setting) takes each metric per repeat over the
prompts — the speedup as a geometric mean, rates as pooled ratios, per-token counts
weighted by new tokens — then mean ± std over repeats. The verdict says in a sentence or
two whether EGAG reached the best fixed γ.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd
import torch

from ...engine.params import DecodeParams
from ...engine.methods import ENTROPY_GAMMA, FIXED_GAMMA, METHODS, REFERENCE, TABLE_DRAFTING
from ...models.torch_copy import TORCH_COPY, TORCH_COPY_AR
from ..measure.acceptance import describe_auc, entropy_auc
from ..measure.acceptance_charts import why_figures
from ..measure.statistics import geomean, break_even, distinct_values
from .charts import sweep_figures
from ...engine.flops import matmul_parameters
from ...engine.pair import DRAFT_ROLE, TARGET_ROLE
from ...engine.trace import leviathan_alpha
from .grid import AR, SETTING_COLUMNS, Setting, copy_phrase, fmt
from .rows import ratio, rows_frame, typed_settings
from .verdict import policy_sentence, policy_verdict

# Metrics of the summary, each with a *_std beside it; how one repeat's value is taken over its prompts.
_SUMMARY_METRICS = {
    "speedup_vs_ar": "geomean", "tokens_per_s": "tokens/seconds", "acceptance_rate": "accepted/drafted",
    "alpha": "alpha", "mean_accepted_tokens": "tokens/rounds", "nodes_per_round": "drafted/rounds", "mean_gamma": "mean",
    "wasted_drafts_per_token": "per_token", "target_forwards_per_token": "per_token",
    "draft_forwards_per_token": "per_token", "draft_flops_per_token": "per_token",
    "target_flops_per_token": "per_token", "cost_ratio": "mean", "predicted_speedup": "mean",
    "target_kv_bytes_peak": "max", "draft_kv_bytes_peak": "max",
}

SUMMARY_COLUMNS = (["method", "label", "setting", *SETTING_COLUMNS, "prompts", "repeats", "runs", "errors"]
                   + [c for m in _SUMMARY_METRICS for c in (m, f"{m}_std")] + ["exact_match_pct", "runtime"])


@dataclass
class SweepResult:
    rows: pd.DataFrame  # ROW_COLUMNS
    settings: list[Setting]
    meta: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False
    tokens: pd.DataFrame | None = None  # one row per drafted token (runner.TOKEN_COLUMNS); None if not kept
    # Parts of a cluster run that failed (ERROR_COLUMNS): their rows are missing, the others kept.
    errors: pd.DataFrame | None = None
    _summary: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def summary(self) -> pd.DataFrame:
        if self._summary is None:
            self._summary = summarize_sweep(self.rows, self.errors)
        return self._summary

    def use_summary(self, summary: pd.DataFrame) -> None:
        """A summary made another way than from the rows alone (a replayed sweep's, with its predicted columns)."""
        self._summary = summary

    @property
    def verdict(self) -> str:
        """The sentence on EGAG, then, when the sweep ran fixed γ and an adaptive rule, the bootstrap comparison."""
        comparison = policy_sentence(self.policy_table)
        parts = (verdict(self.summary, self.tokens), comparison, torch_copy_sentence(self.rows))
        return " ".join(part for part in parts if part)

    @property
    def policy_table(self) -> pd.DataFrame:
        """Per category and overall: the best fixed γ against the adaptive settings (see `verdict.py`)."""
        return policy_verdict(self.rows)

    @property
    def figures(self) -> dict[str, Any]:
        return sweep_figures(self.summary)

    def why_figures(self) -> dict[str, Any]:
        """Acceptance against entropy and by draft position per method, and the break-even of
        each method's fastest setting (see `bench.acceptance`)."""
        tokens = self.tokens if self.tokens is not None else pd.DataFrame(columns=["method"])
        return why_figures(tokens, best_break_evens(self.rows, self.summary),
                           label=lambda key: METHODS[key].label if key in METHODS else key)


def sweep_result(pair, rows: Sequence[dict], settings: Sequence[Setting], *, repeats: int, warmup: bool = True,
                 stopped: bool = False, tokens: Sequence[dict] | None = None, **params: Any) -> SweepResult:
    """The SweepResult of rows from `iter_sweep` (for callers that stream the events
    themselves), with the run's metadata: the pair, the device, the versions, the params."""
    runs = [AR] + [s for s in dict.fromkeys(settings) if s.method != REFERENCE]
    frame = rows_frame(rows)
    meta = sweep_meta(pair, DecodeParams.from_values(**params), runs, frame, repeats, warmup)
    return SweepResult(frame, runs, meta, stopped, pd.DataFrame(list(tokens)) if tokens is not None else None)


def sweep_meta(pair, decode: DecodeParams, runs, frame, repeats, warmup) -> dict[str, Any]:
    import transformers

    models = {TARGET_ROLE: pair.target, DRAFT_ROLE: pair.draft}
    return {
        "pair": getattr(pair, "name", ""), TARGET_ROLE: getattr(pair, "target_ref", ""),
        DRAFT_ROLE: getattr(pair, "draft_ref", None), "device": str(pair.device),
        "dtype": str(next(pair.target.parameters()).dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "parameters": {k: sum(matmul_parameters(m)) for k, m in models.items() if m is not None},
        "settings": [s.key for s in runs],
        "egag_gamma_min": next((s.gamma_min for s in runs if s.method == ENTROPY_GAMMA), None),
        "prompts": int(frame.prompt_id.nunique()), "repeats": repeats,
        "warmup": warmup, "params": decode.as_dict(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "runtime": distinct_values(frame, "runtime"),  # what ran the target: "onnx fp32", "torch"
    }


# A failed part of a cluster run: the prompts it held, the runs of each setting it took with it, the reason.
ERROR_COLUMNS = ["task", "prompt_ids", "runs", "attempts", "reason"]


def merged_result(parts: Sequence[tuple[Sequence[str], dict | None]], failures: Sequence[tuple[int, str, int, str]],
                  settings: Sequence[Setting], *, repeats: int, stopped: bool, extra: dict[str, Any]) -> SweepResult:
    """One SweepResult from the parts of a sweep run apart (a cluster's tasks), as the one run of every
    prompt would have left it: rows and drafted tokens in its order (repeat, then prompt), the meta of
    the parts' pair. parts: each part's prompt ids and its result ({"rows", "tokens", "meta"}, None if it
    failed); failures: (part, task label, attempts, reason)."""
    done = [result for _, result in parts if result is not None]
    place = {prompt_id: n for n, prompt_id in enumerate(p for ids, _ in parts for p in ids)}
    rows = sorted((row for result in done for row in result["rows"]), key=lambda r: (r["repeat"], r["prompt_index"]))
    tokens = sorted((t for result in done for t in result["tokens"]), key=lambda t: (t["repeat"], place[t["prompt_id"]]))
    frame = rows_frame(rows)
    errors = pd.DataFrame([{"task": label, "prompt_ids": ",".join(parts[index][0]),
                            "runs": len(parts[index][0]) * repeats, "attempts": attempts, "reason": reason}
                           for index, label, attempts, reason in failures], columns=ERROR_COLUMNS)
    meta = dict(done[0]["meta"]) if done else {"settings": [s.key for s in settings], "repeats": repeats}
    meta.update(prompts=int(frame.prompt_id.nunique()), runtime=distinct_values(frame, "runtime"),
                device=distinct_values(frame, "device"), nodes=distinct_values(frame, "node"), **extra)
    return SweepResult(frame, list(settings), meta, stopped, pd.DataFrame(tokens), errors)


def _per_repeat(part: pd.DataFrame, metric: str, how: str) -> float:
    if how == "geomean":
        return geomean(part[metric].dropna().tolist())
    if how == "tokens/seconds":
        return ratio(part.new_tokens.sum(), part.seconds.sum())
    if how == "accepted/drafted":
        return ratio(part.accepted.sum(), part.drafted.sum())
    if how == "alpha":
        return leviathan_alpha(part.accepted.sum(), part.rejected_rounds.sum())
    if how == "tokens/rounds":
        return ratio(part.new_tokens.sum(), part.rounds.sum())
    if how == "drafted/rounds":
        return ratio(part.drafted.sum(), part.rounds.sum())
    if how == "max":
        values = part[metric].dropna()
        return float(values.max()) if len(values) else math.nan
    if how == "per_token":
        ok = part[part[metric].notna()]
        return ratio((ok[metric] * ok.new_tokens).sum(), ok.new_tokens.sum())
    values = part[metric].dropna()
    return float(values.mean()) if len(values) else math.nan


def summarize_sweep(rows: pd.DataFrame | Sequence[dict], errors: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (method, setting), in the order they first appear: mean ± std over repeats.
    errors (a cluster run's failed parts, ERROR_COLUMNS): each setting's runs they took with them."""
    rows = rows if isinstance(rows, pd.DataFrame) else rows_frame(rows)
    failed = int(errors.runs.sum()) if errors is not None and not errors.empty else 0
    out = []
    for key in dict.fromkeys(rows.setting):
        mine = rows[rows.setting == key]
        first = mine.iloc[0]
        row = {"method": first.method, "label": first.label, "setting": key,
               **{c: first[c] for c in SETTING_COLUMNS},
               "prompts": mine.prompt_id.nunique(), "repeats": mine.repeat.nunique(), "runs": len(mine),
               "errors": failed}
        for metric, how in _SUMMARY_METRICS.items():
            values = pd.Series([_per_repeat(part, metric, how) for _, part in mine.groupby("repeat")]).dropna()
            row[metric] = float(values.mean()) if len(values) else math.nan
            row[f"{metric}_std"] = float(values.std()) if len(values) > 1 else math.nan
        matches = mine.matches_ar.dropna()
        row["exact_match_pct"] = 100.0 * matches.astype(bool).mean() if len(matches) else math.nan
        row["runtime"] = distinct_values(mine, "runtime")
        out.append(row)
    frame = pd.DataFrame(out, columns=SUMMARY_COLUMNS)
    return typed_settings(frame)


def _best(summary: pd.DataFrame, method: str) -> pd.Series | None:
    part = summary[(summary.method == method) & summary.speedup_vs_ar.notna()]
    return None if part.empty else part.loc[part.speedup_vs_ar.idxmax()]


def best_break_evens(rows: pd.DataFrame, summary: pd.DataFrame) -> dict[str, tuple]:
    """Each drafting method's fastest setting: its break-even over its runs and its speedup."""
    ar = rows[rows.method == REFERENCE]
    ar_step = ratio(ar.verify_seconds.sum(), ar.rounds.sum()) if not ar.empty else math.nan
    out = {}
    for method in (FIXED_GAMMA, ENTROPY_GAMMA, TABLE_DRAFTING):
        best = _best(summary, method)
        even = break_even(rows[rows.setting == best.setting], ar_step) if best is not None else None
        if even is not None:
            out[method] = (even, float(best.speedup_vs_ar))
    return out


def entropy_clause(tokens: pd.DataFrame | None) -> str:
    """How well the drafter's entropy ranked acceptances over the SD and EGAG runs, EGAG's premise."""
    if tokens is None or tokens.empty:
        return ""
    drafted = tokens[tokens.method.isin([FIXED_GAMMA, ENTROPY_GAMMA])]
    auc, n = entropy_auc(drafted)
    return describe_auc(auc, n) if n else ""


def torch_copy_sentence(rows: pd.DataFrame) -> str:
    """Which settings ran on the torch copy of a runtime target and why, and what their speedups are over, as
    the Playground's status line and the Benchmark tab say it; "" when none did."""
    if rows.empty or "runtime" not in rows:
        return ""
    copied = rows[(rows.runtime == TORCH_COPY) & (rows.method != TORCH_COPY_AR)]
    if copied.empty:
        return ""
    reasons = copied.groupby("runtime_reason", sort=False).label.unique()
    said = "; ".join(f"{', '.join(labels)} ran {reason}" for reason, labels in reasons.items())
    return f"{said}; their speedups and matches are over AR on the same torch copy (the AR ({TORCH_COPY}) row)."


def verdict(summary: pd.DataFrame, tokens: pd.DataFrame | None = None) -> str:
    """One sentence (two at most) from the numbers: the best EGAG against the best fixed γ, and
    how well the drafter's entropy ranked acceptances (`tokens`, the sweep's drafted tokens)."""
    egag, sd, nasd = _best(summary, ENTROPY_GAMMA), _best(summary, FIXED_GAMMA), _best(summary, TABLE_DRAFTING)
    sentences = []
    if egag is not None:
        text = (f"EGAG (γ_max {fmt(egag.gamma_max)}, EMA {fmt(egag.ema)}{copy_phrase(egag.copy_n, ', ')}) reached "
                f"{egag.speedup_vs_ar:.2f}× AR")
        if sd is not None:
            text += (f" against {sd.speedup_vs_ar:.2f}× for the best fixed γ "
                     f"(γ = {fmt(sd.gamma)}{copy_phrase(sd.copy_n, ', ')})")
        text += f"; its mean γ was {egag.mean_gamma:.1f}"
        if sd is None:
            text += " (no fixed-γ SD in this sweep)"
        clause = entropy_clause(tokens)
        if clause:
            text += f"; {clause}"
        sentences.append(text + ".")
    elif sd is not None:
        sentences.append(f"The best fixed γ (γ = {fmt(sd.gamma)}{copy_phrase(sd.copy_n, ', ')}) reached "
                         f"{sd.speedup_vs_ar:.2f}× AR "
                         "(no EGAG in this sweep).")
    if nasd is not None:
        sentences.append(f"The best NASD (n = {fmt(nasd.ngram_n)}) reached {nasd.speedup_vs_ar:.2f}× AR.")
    if not sentences:
        return "No SD, EGAG or NASD run has finished beside AR: nothing to compare yet."
    return " ".join(sentences)
