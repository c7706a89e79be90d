"""One row per run of a sweep: the columns, and how the runs of one (prompt, repeat)
become rows, each compared with AR's run on the same prompt in the same repeat.

Definitions of the row columns (one row per method, setting, prompt and repeat):
  tokens_per_s        new tokens / wall seconds of the call (prompt ids in → ids out).
  speedup_vs_ar       AR's seconds per new token / this run's, same prompt and repeat.
  acceptance_rate     accepted ÷ drafted tokens ("acceptance" on every surface); not α.
  mean_accepted_tokens  new tokens per round (tokens per target forward).
  mean_gamma          mean γ over the rounds that drafted (0 for AR).
  wasted_drafts_per_token  rejected draft tokens per new token.
  *_forwards_per_token  forwards of that model per new token, decoding only (the
                      prompt's prefill is not counted), as the decode loop counted them.
  *_flops_per_token   an ESTIMATE: 2 × parameters × tokens fed to that model ÷ new
                      tokens, decoding only. Parameters are the matmul weights (the input
                      embedding is left out unless tied to the output head), and the head
                      is charged only for the positions whose logits were asked for;
                      attention over the context is not counted. NASD's drafter is a table
                      lookup: 0 draft FLOPs. The tokens and logit rows are counted by the model
                      wrappers the decode loop runs, so on every runtime alike (`engine.trace.FedCounts`);
                      empty at a batch above 1, whose forwards feed every request at once.
  alpha               α (Leviathan, per token): accepted / (accepted + rounds that ended in a
                      rejection) (`engine.trace.leviathan_alpha`), not acceptance_rate.
  cost_ratio          c: seconds per draft forward (NASD: per draft slot) / seconds per AR
                      target step, both from the traces of this prompt and repeat.
  predicted_speedup   Leviathan: (1 − α^(γ+1)) / ((1 − α)(γc + 1)); EGAG uses its mean γ,
                      an approximation since its γ varies by round.
  target_kv_bytes_peak, draft_kv_bytes_peak  the most bytes that model's KV cache held during the
                      run (0 where no draft model drafts), as the engine's memory columns record it.
  runtime             what ran the target's forwards: "torch", the runtime and its weights ("onnx fp32"), or
                      "torch copy" for a setting the runtime cannot run (a tree), which ran on the torch
                      weights the pair keeps and is set against AR on that copy (the "torch-ar" rows).
  first_divergence, divergence_margin  where a run that differs from AR first leaves AR's tokens (empty
                      where equal) and AR's top-1 minus top-2 logit there (engine.divergence).
  runtime_reason      why the target ran where it did (for a "torch copy" row: what the runtime refused).
  speedup_vs_ar, matches_ar  for a "torch copy" row: over AR on the torch copy, in the same prompt and repeat.
  node, device        the machine (host name) and the device (a GPU by its index on that machine, and its
                      model) that measured the run; a cluster run spreads its tasks over several.
  temperature         the sampling temperature every method of the run decoded at (0 = greedy).
  ttft_s              seconds from the call's start (a batch's start) to the request's first token.
  batch, batch_index, batch_row, batch_seconds   the batch the request ran in: its size, which batch of that
                      size in the repeat, the request's place in it, and the batch's wall seconds.
  matches_ar          greedy runs of lossless methods only: the same tokens as AR on the same
                      prompt (empty for the baselines beam and draft, which are not meant to).
"""

from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from ...engine.divergence import divergence_where_compared
from ...engine.methods import ENTROPY_GAMMA, METHODS, REFERENCE, TABLE_DRAFTING, is_lossless, matches_reference
from ..measure.batching import BATCH_COLUMNS
from ...models.torch_copy import TORCH_COPY, TORCH_COPY_AR
from ..measure.statistics import leviathan_speedup, ratio

ROW_COLUMNS = [
    "method", "gamma", "gamma_max", "ema", "ngram_n", "prompt_id", "repeat", "tokens_per_s", "speedup_vs_ar",
    "acceptance_rate", "mean_accepted_tokens", "mean_gamma", "wasted_drafts_per_token", "target_forwards_per_token",
    "draft_forwards_per_token", "draft_flops_per_token", "target_flops_per_token", "predicted_speedup", "matches_ar",
    "first_divergence", "divergence_margin",
    # beyond the required columns
    "copy_n", "setting", "label", "category", "prompt_index", "order", "seed", "prompt_tokens", "new_tokens", "seconds",
    "rounds", "copied_rounds", "drafted", "accepted", "rejected_rounds", "alpha", "cost_ratio", "draft_seconds",
    "verify_seconds", "stop_reason", "node_budget", "nodes_per_round", "adaedl_lambda", "entropy_stop",
    "specdecpp_threshold", "target_kv_bytes_peak", "draft_kv_bytes_peak", "runtime", "runtime_reason", "node",
    "device",
    # The sampling temperature every method ran at, and the batch the request ran in (measure.batching).
    "temperature", "ttft_s", *BATCH_COLUMNS,
]
# Read from the trace's statistics (`engine.trace.summarize`), as every other surface reads them.
FED_COLUMNS = ("target_forwards_per_token", "draft_forwards_per_token", "draft_flops_per_token",
               "target_flops_per_token")
# Methods whose γ policy varies their drafts: Leviathan's prediction reads their mean drafts per drafting
# round (EGAG's, the mean of the γ it chose).
_VARYING_GAMMA = frozenset(name for name, method in METHODS.items() if method.varies_gamma)


def _reference(group, method: str) -> tuple:
    """(the run of `method` in the group or None, its seconds per target step, its seconds per new token)."""
    ar = next((run for setting, _, run in group if setting.method == method), None)
    if ar is None:
        return None, math.nan, math.nan
    return ar, ratio(ar.stats["verify_seconds"], ar.stats["target_forwards"]), ratio(ar.seconds, len(ar.token_ids))


def group_rows(item, index, repeat, seed, ids, group, greedy) -> list[dict]:
    """The rows of one (prompt, repeat), each compared with AR's run in the group: the pair's AR, or for a
    run on the torch copy of a runtime target, AR on that copy (`models.torch_copy`)."""
    references = {False: _reference(group, REFERENCE), True: _reference(group, TORCH_COPY_AR)}
    rows = []
    for setting, position, run in group:
        stats, result = run.stats, run.result
        on_copy = stats.get("runtime") == TORCH_COPY and setting.method != TORCH_COPY_AR
        ar, ar_step, ar_per_token = references[on_copy]
        new = len(run.token_ids)
        drafted, accepted = stats["drafted"], stats["accepted"]
        alpha = stats["alpha"]
        mean_gamma = stats["mean_gamma"]
        if setting.method == TABLE_DRAFTING:
            slots = sum(r.gamma for r in result.rounds)
            cost = ratio(ratio(stats["draft_seconds"], slots), ar_step)
        elif setting.method in (REFERENCE, TORCH_COPY_AR):
            cost = math.nan
        else:
            cost = ratio(ratio(stats["draft_seconds"], stats["draft_forwards_decoding"]), ar_step)
        gamma = (mean_gamma if setting.method == ENTROPY_GAMMA
                 else _mean_drafts(result) if setting.method in _VARYING_GAMMA
                 else setting.gamma)
        predicted = (leviathan_speedup(alpha, float(gamma), cost) if setting.method not in (REFERENCE, TORCH_COPY_AR)
                     and gamma else math.nan)
        row = {
            "method": setting.method, **setting.values(), "prompt_id": item.id, "repeat": repeat,
            "tokens_per_s": ratio(new, run.seconds),
            "speedup_vs_ar": ratio(ar_per_token, ratio(run.seconds, new)),
            "acceptance_rate": ratio(accepted, drafted), "mean_accepted_tokens": ratio(new, stats["rounds"]),
            "nodes_per_round": ratio(drafted, stats["rounds"]),
            "mean_gamma": mean_gamma, "wasted_drafts_per_token": ratio(drafted - accepted, new),
            **{name: stats[name] for name in FED_COLUMNS},
            "predicted_speedup": predicted,
            "matches_ar": (matches_reference(run.token_ids, result.params, ar.token_ids) if greedy and ar is not None
                           and is_lossless(setting.method) and setting.method != TORCH_COPY_AR else None),
            "setting": setting.key, "label": setting.label, "category": item.category, "prompt_index": index,
            "order": position, "seed": seed, "prompt_tokens": len(ids), "new_tokens": new, "seconds": run.seconds,
            "rounds": stats["rounds"], "copied_rounds": stats["copied_rounds"], "drafted": drafted, "accepted": accepted,
            "rejected_rounds": stats["rejected_rounds"],
            "alpha": alpha, "cost_ratio": cost, "draft_seconds": stats["draft_seconds"],
            "verify_seconds": stats["verify_seconds"], "stop_reason": stats["stop_reason"],
            "target_kv_bytes_peak": stats.get("target_kv_bytes_peak", math.nan),
            "draft_kv_bytes_peak": stats.get("draft_kv_bytes_peak", math.nan),
            "runtime": stats.get("runtime"), "runtime_reason": stats.get("runtime_reason", ""),
            "ttft_s": stats.get("ttft_s", math.nan),
        }
        row["first_divergence"], row["divergence_margin"] = divergence_where_compared(
            row["matches_ar"], run.token_ids, ar.token_ids if ar is not None else [],
            ar.result.top2_margins if ar is not None and ar.result is not None else [])
        rows.append(row)
    return rows


def _mean_drafts(result) -> float:
    drafting = [len(r.drafted) for r in result.rounds if r.drafted]
    return sum(drafting) / len(drafting) if drafting else math.nan


def rows_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """Rows (dicts) as a DataFrame with ROW_COLUMNS; whole-number settings stay whole (3, not 3.0)."""
    frame = pd.DataFrame(list(rows), columns=ROW_COLUMNS)
    return typed_settings(frame)


def typed_settings(frame: pd.DataFrame) -> pd.DataFrame:
    for name in ("gamma", "gamma_max", "ngram_n", "copy_n", "node_budget"):
        frame[name] = pd.to_numeric(frame[name]).astype("Int64")
    for name in ("ema", "adaedl_lambda", "entropy_stop", "specdecpp_threshold"):
        frame[name] = pd.to_numeric(frame[name]).astype(float)
    return frame
