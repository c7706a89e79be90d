"""Traces → DataFrames: the comparison table, the per-round trace and the per-token decisions.

The CLI, the page and the benchmark write these same columns to CSV.
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence

import pandas as pd
import torch

from ...engine.targets.seq2seq import decoder_start
from ...engine.methods import METHODS, REFERENCE, is_lossless, matches_reference
from ...engine.sampling import probabilities
from ...engine.targets.kv_policy import lossless_under
from ...engine.divergence import DIVERGENCE_COLUMNS, divergence_where_compared
from ...engine.targets.memory import MEMORY_STATS
from ...engine.trace import GenerationResult, StopNote
from .acceptance import entropy_auc
from .vs_float32 import VS_FLOAT32_COLUMNS, vs_float32
from ...models.torch_copy import TORCH_COPY, TORCH_COPY_AR

TORCH_COPY_AR_LABEL = f"AR ({TORCH_COPY})"

SUMMARY_COLUMNS = [
    "method", "label", "drafter", "new_tokens", "seconds", "tokens_per_s", "speedup_vs_ar", "ttft_s", "acceptance_rate",
    "mean_accepted_tokens", "copied_rounds", "target_forwards", "draft_forwards", "target_forwards_per_token", "mean_gamma",
    "mean_drafted", "mean_entropy", "matches_ar", *DIVERGENCE_COLUMNS, "perplexity", "stop_reason", "temperature", "seed",
    "cache", "compile_seconds", "threads", "alpha", "rounds", "draft_seconds", "verify_seconds", "entropy_auc",
    "entropy_auc_n", "note", "target_kv", "draft_kv", "target_dtype", "draft_dtype", "exactness", "runtime", "runtime_reason", *MEMORY_STATS, *VS_FLOAT32_COLUMNS,
]

# The last four say where a policy stopped a round's drafting before γ: the rule, the value it read, the
# threshold that value crossed and the draft it did not make (1 = the round's first, as in TOKEN_COLUMNS);
# empty for a round that ran to its cap.
ROUND_COLUMNS = [
    "method", "round", "source", "gamma", "entropy", "n_drafted", "accepted", "n_rejected", "drafted_ids", "rejected_ids",
    "next_token", "next_origin", "new_tokens", "draft_entropies", "draft_seconds", "verify_seconds", "end_seconds",
    "tree_nodes", "tree_depth", "accepted_depth",
    "stop_rule", "stop_value", "stop_threshold", "stop_position",
]
# One row per node of every tree round: the tokens-level record of the trees.
NODE_COLUMNS = ["method", "round", "node", "parent", "depth", "token", "q", "p", "state",
                "stop_rule", "stop_value", "stop_threshold", "stop_position"]

# One row per drafted token: what decided it (see `DraftDecision`). `decided` is False after the
# round's first rejection; `point_mass` marks drafts without a q (n-gram tables, copies: q = 1).
TOKEN_COLUMNS = [
    "method", "round", "position", "token", "q", "p", "accept_prob", "accepted", "decided", "point_mass",
    "entropy", "source", "correction", "correction_p",
]


def row_label(result: GenerationResult) -> str:
    """A row's method as tables name it; one that ran on the torch copy of a runtime target says so."""
    if result.method == TORCH_COPY_AR:
        return TORCH_COPY_AR_LABEL
    label = METHODS[result.method].label if result.method in METHODS else result.method
    return f"{label} ({TORCH_COPY})" if result.runtime == TORCH_COPY else label


def summary_frame(
    results: Sequence[GenerationResult], perplexities: dict[str, float] | None = None, pair=None,
    float32_ar: GenerationResult | None = None,
) -> pd.DataFrame:
    """One row per method, AR first; speed as a ratio to AR (for a method that ran on the torch copy of a
    runtime target, to the torch copy's AR, TORCH_COPY_AR), quality as exact match (greedy,
    lossless methods; empty for the others) or the target's perplexity of the output (sampled,
    when given); each model's precision as the pair was loaded (when given; empty for no draft);
    with `float32_ar` (AR on the target's weights at float32, same prompt), each row's speed and
    output against it (VS_FLOAT32_COLUMNS, see `bench.vs_float32`; empty without it)."""
    target_dtype, draft_dtype = (getattr(getattr(pair, side, None), "name", None)
                                 for side in ("target_precision", "draft_precision"))
    ordered = sorted(results, key=lambda r: (r.method != REFERENCE, r.method != TORCH_COPY_AR))
    references = {name: next((r for r in ordered if r.method == name), None) for name in (REFERENCE, TORCH_COPY_AR)}
    rows = []
    for result in ordered:
        stats = result.stats
        greedy = result.params.get("temperature", 0.0) == 0.0
        row = {name: stats.get(name) for name in SUMMARY_COLUMNS if name in stats}
        row["label"] = row_label(result)
        # A method that ran on the torch copy of a runtime target is set against the torch copy's AR.
        on_copy = result.runtime == TORCH_COPY and result.method != TORCH_COPY_AR
        reference = references[TORCH_COPY_AR if on_copy else REFERENCE]
        row["speedup_vs_ar"] = (
            stats["tokens_per_s"] / reference.stats["tokens_per_s"] if reference is not None else math.nan
        )
        # Only a lossless method owes AR its tokens; beam search and the draft alone are left blank.
        row["matches_ar"] = (
            matches_reference(result.token_ids, result.params, reference.token_ids)
            if reference is not None and greedy and is_lossless(result.method) and lossless_under(result.params)
            else None
        )
        row["first_divergence"], row["divergence_margin"] = divergence_where_compared(
            row["matches_ar"], result.token_ids, reference.token_ids if reference is not None else [],
            reference.top2_margins if reference is not None else [])
        row["perplexity"] = (perplexities or {}).get(result.method, math.nan)
        row["target_kv"], row["draft_kv"] = result.params.get("target_kv"), result.params.get("draft_kv")
        row["target_dtype"], row["draft_dtype"] = target_dtype, draft_dtype
        row["temperature"] = result.params.get("temperature")
        row["seed"] = result.params.get("seed")
        row["entropy_auc"], row["entropy_auc_n"] = entropy_auc(tokens_frame([result]))
        row.update(vs_float32(result, float32_ar))
        rows.append(row)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def rounds_frame(results: Iterable[GenerationResult]) -> pd.DataFrame:
    """One row per round of every result (ROUND_COLUMNS)."""
    rows = []
    for result in results:
        for r in result.rounds:
            rows.append({
                "method": result.method,
                "round": r.index,
                "source": r.source,
                "gamma": r.gamma,
                "entropy": r.entropy if r.entropy is not None else math.nan,
                "n_drafted": len(r.drafted),
                "accepted": r.accepted,
                "n_rejected": len(r.rejected),
                "drafted_ids": " ".join(map(str, r.drafted)),
                "rejected_ids": " ".join(map(str, r.rejected)),
                "next_token": r.next_token if r.next_token is not None else -1,
                "next_origin": r.next_origin if r.next_token is not None else "",
                "new_tokens": len(r.new_tokens),
                "draft_entropies": " ".join(f"{e:.4f}" for e in r.draft_entropies),
                "draft_seconds": r.draft_seconds,
                "verify_seconds": r.verify_seconds,
                "end_seconds": r.end_seconds,
                # A chain round is a tree of one branch: its nodes are its drafts, its depth their number.
                "tree_nodes": r.nodes_drafted,
                "tree_depth": r.tree.depth if r.tree is not None else len(r.drafted),
                "accepted_depth": r.accepted,
                **_stop_cells(r.early_stop),
            })
    frame = pd.DataFrame(rows, columns=ROUND_COLUMNS)
    # A nullable integer, so that a round without a stop writes an empty cell, not a float's NaN.
    frame["stop_position"] = frame["stop_position"].astype("Int64")
    return frame


def _stop_cells(note: StopNote | None) -> dict:
    if note is None:
        return {"stop_rule": "", "stop_value": math.nan, "stop_threshold": math.nan, "stop_position": None}
    return {"stop_rule": note.rule, "stop_value": note.value, "stop_threshold": note.threshold,
            "stop_position": note.position + 1}


def tokens_frame(results: Iterable[GenerationResult]) -> pd.DataFrame:
    """One row per drafted token of every round (position 1 is the round's first draft).
    A point mass's entropy is 0 where its drafter gave one (copies) and NaN otherwise (n-gram)."""
    rows = []
    for result in results:
        for r in result.rounds:
            for i, d in enumerate(r.decisions):
                rows.append({
                    "method": result.method, "round": r.index, "position": i + 1, "token": d.token,
                    "q": d.q, "p": d.p, "accept_prob": d.accept_prob, "accepted": d.accepted,
                    "decided": d.decided, "point_mass": d.point_mass,
                    "entropy": r.draft_entropies[i] if i < len(r.draft_entropies) else math.nan,
                    "source": r.source,
                    "correction": d.correction if d.correction is not None else -1,
                    "correction_p": d.correction_p if d.correction_p is not None else math.nan,
                })
    return pd.DataFrame(rows, columns=TOKEN_COLUMNS)


def nodes_frame(results: Iterable[GenerationResult]) -> pd.DataFrame:
    """Every node of every tree round: parent (0 = the root, the context's last token), depth, token,
    the drafter's q and the target's p of it, its state: kept, refused (tried where the walk
    went and refused) or unreached (its branch was cut above it), and, where a stop rule (a rule
    tree's) gave it no children, the rule's note as the rounds CSV writes one."""
    rows = []
    for result in results:
        for r in result.rounds:
            if r.tree is None:
                continue
            tree = r.tree
            on_path, reached = set(tree.path), {0, *tree.path}
            for node, (parent, depth, token, q, p) in enumerate(
                    zip(tree.parents, tree.depths, tree.tokens, tree.q, tree.p), start=1):
                state = "kept" if node in on_path else "refused" if parent in reached else "unreached"
                rows.append({"method": result.method, "round": r.index, "node": node, "parent": parent,
                             "depth": depth, "token": token, "q": math.nan if q is None else q, "p": p, "state": state,
                             **_stop_cells(tree.stops.get(node))})
    frame = pd.DataFrame(rows, columns=NODE_COLUMNS)
    frame["stop_position"] = frame["stop_position"].astype("Int64")
    return frame


def target_perplexity(pair, result: GenerationResult) -> float:
    """exp of the mean negative log-likelihood of the generated tokens under the target,
    with the same sampling transform the run used (temperature, top-k, top-p)."""
    ids = result.token_ids
    if not ids:
        return math.nan
    with torch.inference_mode():
        if getattr(pair, "is_encoder_decoder", False):  # the prompt is the source; the decoder scores the output
            prefix = decoder_start(pair.target)
            source = torch.tensor([result.prompt_ids], device=pair.device)
            decoder = torch.tensor([prefix + ids], device=pair.device)
            logits = pair.target(input_ids=source, decoder_input_ids=decoder).logits[0, len(prefix) - 1 : -1]
        else:
            sequence = torch.tensor([result.prompt_ids + ids], device=pair.device)
            logits = pair.target(input_ids=sequence).logits[0, len(result.prompt_ids) - 1 : -1]
    if pair.vocab_size is not None:
        logits = logits[..., : pair.vocab_size]
    params = result.params
    from ...engine.sampling import SamplingConfig

    config = SamplingConfig(params.get("temperature", 0.0), params.get("top_k", 0), params.get("top_p", 1.0))
    if config.greedy:
        config = SamplingConfig(1.0)
    probs = probabilities(logits, config)
    chosen = probs[torch.arange(len(ids)), torch.tensor(ids, device=probs.device)].clamp_min(1e-12)
    return float(torch.exp(-torch.log(chosen).mean()))
