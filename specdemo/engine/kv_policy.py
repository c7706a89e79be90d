"""KV-cache policies: which cached positions a model keeps once its cache outgrows a budget.

  full       every position (the default)
  streaming  StreamingLLM: the first `sinks` positions (attention sinks) and the most recent
             `budget − sinks`
  l2         the first `sinks` positions, the newest RECENT ones, and of the rest those whose keys
             have the smallest L2 norm (low-norm keys draw the most attention), chosen per layer
             and per KV head

A policy applies to one model: the draft's cache (lossless, since the target verifies every
draft) or the target's (lossy: the output may leave full-cache AR's, and the result says so).

When it runs. A `CachedLM` compresses only what is committed: in `logits`, after rolling back
to the sequence it is asked about and before feeding the new tokens; `feed` alone (a draft fed
back, a verification's drafts) never compresses. So the positions a rollback removes, the
drafts of the round, are never among the evicted ones, and a cache holds at most `budget`
positions plus one feed (γ + 1 and a token or two to catch up). A long prompt is prefilled in
chunks of `budget` positions, compressed between chunks, so the prefill stays bounded too.

Positions. Kept positions keep the positions they were computed at, and every new token is
fed at its true position in the sequence (`position_ids` = its index), so a RoPE model sees
the same relative distances as with a full cache between a new token and each key it still
holds; the gaps are simply missing keys. (StreamingLLM re-indexes the kept keys to
consecutive positions instead, to run past the model's trained length; here a run still fits
the model's context, so nothing needs re-indexing, and keys, rotated when computed, are never
rotated again.) The causal mask is built over the physical cache, in which every kept key
precedes every new token.

Only transformers' dynamic cache of decoder-only models is compressed; a static cache, graph
capture and encoder-decoder models are refused with a message, as are trees of drafts (whose
verification indexes the cache by position).

torch only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KV_POLICIES = ("full", "streaming", "l2")
DEFAULT_SINKS = 4
# The newest positions l2 always keeps: what the next token reads most, and the last committed
# position, which `CachedLM.logits` may roll back to recompute its logits.
RECENT = 8


@dataclass(frozen=True)
class KVPolicy:
    kind: str = "full"
    budget: int = 0  # positions kept; 0 with "full"
    sinks: int = DEFAULT_SINKS

    @classmethod
    def of(cls, kind: str, budget: int, sinks: int, who: str = "kv") -> "KVPolicy":
        """A checked policy; `who` ("draft_kv", "target_kv") names the setting in messages."""
        check_policy(kind, budget, sinks, who)
        return cls(kind, budget if kind != "full" else 0, sinks)

    @property
    def compresses(self) -> bool:
        return self.kind != "full"

    def keep_index(self, keys: torch.Tensor) -> torch.Tensor | None:
        """Indices [1, H, budget] (ascending) of the positions of keys [1, H, S, D] to keep, or None
        when S fits the budget. Ascending, so the newest positions stay last (rollbacks crop them)."""
        length = keys.shape[-2]
        if not self.compresses or length <= self.budget:
            return None
        heads, device = keys.shape[1], keys.device
        sinks = torch.arange(self.sinks, device=device)
        if self.kind == "streaming":
            chosen = torch.cat([sinks, torch.arange(length - (self.budget - self.sinks), length, device=device)])
            return chosen.expand(1, heads, -1)
        recent = torch.arange(length - RECENT, length, device=device)
        norms = keys[0, :, self.sinks : length - RECENT].float().norm(dim=-1)  # [H, middle]
        lowest = norms.topk(self.budget - self.sinks - RECENT, dim=-1, largest=False).indices + self.sinks
        chosen = torch.cat([sinks.expand(heads, -1), lowest.sort(dim=-1).values, recent.expand(heads, -1)], dim=-1)
        return chosen.unsqueeze(0)


def check_policy(kind: str, budget: int, sinks: int, who: str = "kv") -> None:
    """ValueError naming the setting when a policy cannot run as asked."""
    if kind not in KV_POLICIES:
        raise ValueError(f"{who} must be one of {', '.join(KV_POLICIES)}, got {kind!r}")
    if kind == "full":
        return
    if sinks < 0:
        raise ValueError(f"kv_sinks must be an integer ≥ 0, got {sinks}")
    least = sinks + (RECENT if kind == "l2" else 1)
    if budget < least:
        what = f"kv_sinks ({sinks}) + the {RECENT} newest positions it always keeps" if kind == "l2" else \
            f"kv_sinks ({sinks}) + 1 recent position"
        raise ValueError(f"{who}={kind}: kv_budget ({budget}) must be at least {what}: raise kv_budget to {least} "
                         "or more, or lower kv_sinks")


def compress(cache, policy: KVPolicy) -> int:
    """Evict from every layer of a dynamic cache what `policy` drops; returns positions evicted."""
    layers = cache.layers
    if not policy.compresses or not layers or not getattr(layers[0], "is_initialized", False):
        return 0
    before = layers[0].keys.shape[-2]
    for layer in layers:
        index = policy.keep_index(layer.keys)
        if index is None:
            return 0
        gather = index.unsqueeze(-1).expand(-1, -1, -1, layer.keys.shape[-1])
        layer.keys = layer.keys.gather(2, gather)
        layer.values = layer.values.gather(2, gather.expand(-1, -1, -1, layer.values.shape[-1]))
    return before - policy.budget


def check_cache_takes(cache, policy: KVPolicy, who: str) -> None:
    """A policy compresses transformers' full-attention dynamic layers only."""
    if not policy.compresses:
        return
    kinds = {type(layer).__name__ for layer in getattr(cache, "layers", [])}
    if kinds != {"DynamicLayer"}:
        raise ValueError(f"{who}={policy.kind}: this model's cache ({', '.join(sorted(kinds)) or type(cache).__name__}) "
                         "cannot be compressed; KV policies run on full-attention layers of a dynamic cache: use "
                         f"{who}=full")


def kv_bytes(cache) -> int:
    """Bytes the cache's keys and values hold now (a static cache: its whole allocation)."""
    if cache is None:
        return 0
    parts = [cache.self_attention_cache, cache.cross_attention_cache] if hasattr(cache, "self_attention_cache") else [cache]
    total = 0
    for part in parts:
        for layer in getattr(part, "layers", []):
            for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if isinstance(tensor, torch.Tensor):
                    total += tensor.numel() * tensor.element_size()
    return total


def policies_of(params) -> tuple[KVPolicy, KVPolicy]:
    """The target's and the draft's policies from a `DecodeParams` (checked there already)."""
    return (KVPolicy.of(params.target_kv, params.kv_budget, params.kv_sinks, "target_kv"),
            KVPolicy.of(params.draft_kv, params.kv_budget, params.kv_sinks, "draft_kv"))


def lossless_under(params: dict) -> bool:
    """Whether a run with these recorded params owes AR its tokens as far as caches go: a
    compressed target cache changes what the target computes; a compressed draft cache does not."""
    return params.get("target_kv", "full") == "full"


def prepare_caches(params, pair, writer, drafter) -> dict[str, int]:
    """Give the model that writes (the target) and the drafter's own LM their KV policies, and
    start the run's memory record (`memory.MEMORY_STATS`), which the two LMs keep at their peaks.
    A draft policy where the drafter uses no draft model (AR, NASD) has nothing to compress and is
    ignored; where its draft keeps no cache of its own (a feature head), it is refused."""
    from .memory import model_weight_bytes

    target_policy, draft_policy = policies_of(params)
    draft_lm = drafter.draft_lm
    reads_features = drafter.reads_target_features
    compressing = target_policy.compresses or (draft_policy.compresses and draft_lm is not None)
    if compressing and drafter.drafts_trees:
        raise ValueError("target_kv/draft_kv: trees of drafts index the cache by position and run with the full "
                         "cache only: use a chain method (sd, egag, nasd) or full caches")
    if draft_policy.compresses and draft_lm is None and reads_features:
        raise ValueError(f"draft_kv={draft_policy.kind}: the feature head drafts from the target's states and "
                         "keeps no cache of its own: use draft_kv=full (or target_kv for the target's cache)")
    writes_draft = writer.model is getattr(pair, "draft", None)
    record = {"target_weight_bytes": 0 if writes_draft else model_weight_bytes(writer.model),
              "draft_weight_bytes": model_weight_bytes(pair.draft) if writes_draft or draft_lm is not None
              or reads_features else 0,
              "target_kv_bytes_peak": 0, "draft_kv_bytes_peak": 0}
    writer_policy = draft_policy if writes_draft else target_policy
    if writer_policy.compresses and not hasattr(writer, "set_kv_policy"):
        raise ValueError(f"{'draft_kv' if writes_draft else 'target_kv'}={writer_policy.kind}: this method keeps no "
                         "KV cache to compress: use full")
    if hasattr(writer, "set_kv_policy"):
        writer.set_kv_policy(draft_policy if writes_draft else target_policy,
                             "draft_kv" if writes_draft else "target_kv")
        writer.kv_peak_sink = (record, "draft_kv_bytes_peak" if writes_draft else "target_kv_bytes_peak")
    if draft_lm is not None:
        draft_lm.set_kv_policy(draft_policy, "draft_kv")
        draft_lm.kv_peak_sink = (record, "draft_kv_bytes_peak")
    return record
