"""KV-cache policies: which cached positions a model keeps once its cache outgrows a budget.

  full       every position (the default)
  streaming  StreamingLLM: the first `sinks` positions (attention sinks) and the most recent
             `budget − sinks`
  l2         the first `sinks` positions, the newest RECENT ones, and of the rest those whose keys
             have the smallest L2 norm (low-norm keys draw the most attention), chosen per layer
             and per KV head
  head       H2O (heavy hitters): the first `sinks` positions, the newest RECENT ones, and of the
             rest those that have drawn the most attention so far, chosen per layer and per KV head
             from that head's own attention

The budget. `budget` counts the positions each KV head of each layer keeps, under every policy,
so equal budgets mean equal cache bytes. Under `head` every head gets an equal share, the same
`budget` slots, and fills it by its own scores: a head that reads the last few tokens keeps
those, one that retrieves from far back keeps what it retrieves, and the two keep different
positions. (Unequal shares, a long window for retrieval heads and a short one for the others,
would need a ragged cache, a mask per head and one more forward to classify the heads; an equal
share keeps the cache one rectangular tensor per layer and the mask shared.)

Attention mass (`head`). A head's score for a cached position is the attention weight its
queries gave that position, summed over every query that has read it since it entered the
cache (every query head of the KV head's group, prompt and decoded tokens alike, a round's
drafts included, even those a rollback removes afterwards) — H2O's accumulated attention. sdpa
returns no weights, so while a `head` cache is in use its model's sdpa attention also computes
softmax(q·kᵀ) for the queries it is given (`AttentionMass`): a [heads, queries, cache]
product per layer and forward, small beside the layer's matmuls at the budgets used here.
Models with other attention implementations are refused with a message.

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

import weakref
from dataclasses import dataclass

import torch

KV_POLICIES = ("full", "streaming", "l2", "head")
SCORED = ("l2", "head")  # sinks, the RECENT newest, and the best-scored of the rest
DEFAULT_SINKS = 4
# The newest positions l2 and head always keep: what the next token reads most, and the last committed
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

    def keep_index(self, keys: torch.Tensor, attention: torch.Tensor | None = None) -> torch.Tensor | None:
        """Indices [1, H, budget] (ascending) of the positions of keys [1, H, S, D] to keep, or None
        when S fits the budget. Ascending, so the newest positions stay last (rollbacks crop them).
        `head` needs `attention` [H, S], each position's attention mass per KV head."""
        length = keys.shape[-2]
        if not self.compresses or length <= self.budget:
            return None
        heads, device = keys.shape[1], keys.device
        sinks = torch.arange(self.sinks, device=device)
        if self.kind == "streaming":
            chosen = torch.cat([sinks, torch.arange(length - (self.budget - self.sinks), length, device=device)])
            return chosen.expand(1, heads, -1)
        recent = torch.arange(length - RECENT, length, device=device)
        if self.kind == "l2":
            scores = -keys[0, :, self.sinks : length - RECENT].float().norm(dim=-1)  # [H, middle]: low norm first
        else:
            if attention is None or attention.shape != (heads, length):
                raise RuntimeError(f"head: the attention mass ({None if attention is None else tuple(attention.shape)}) "
                                   f"does not cover the cache ({heads} heads × {length} positions)")
            scores = attention[:, self.sinks : length - RECENT]
        best = scores.topk(self.budget - self.sinks - RECENT, dim=-1).indices + self.sinks
        chosen = torch.cat([sinks.expand(heads, -1), best.sort(dim=-1).values, recent.expand(heads, -1)], dim=-1)
        return chosen.unsqueeze(0)


def check_policy(kind: str, budget: int, sinks: int, who: str = "kv") -> None:
    """ValueError naming the setting when a policy cannot run as asked."""
    if kind not in KV_POLICIES:
        raise ValueError(f"{who} must be one of {', '.join(KV_POLICIES)}, got {kind!r}")
    if kind == "full":
        return
    if sinks < 0:
        raise ValueError(f"kv_sinks must be an integer ≥ 0, got {sinks}")
    least = sinks + (RECENT if kind in SCORED else 1)
    if budget < least:
        what = f"kv_sinks ({sinks}) + the {RECENT} newest positions it always keeps" if kind in SCORED else \
            f"kv_sinks ({sinks}) + 1 recent position"
        raise ValueError(f"{who}={kind}: kv_budget ({budget}) must be at least {what}: raise kv_budget to {least} "
                         "or more, or lower kv_sinks")


def compress(cache, policy: KVPolicy, masses: list["AttentionMass"] | None = None) -> int:
    """Evict from every layer of a dynamic cache what `policy` drops; returns positions evicted.
    `masses` (from `track_attention`, one per layer) score the positions under `head`, and are
    cut to the kept positions alike."""
    layers = cache.layers
    if not policy.compresses or not layers or not getattr(layers[0], "is_initialized", False):
        return 0
    before = layers[0].keys.shape[-2]
    for i, layer in enumerate(layers):
        mass = masses[i] if masses else None
        index = policy.keep_index(layer.keys, mass.over(layer.keys.shape[-2]) if mass is not None else None)
        if index is None:
            return 0
        gather = index.unsqueeze(-1).expand(-1, -1, -1, layer.keys.shape[-1])
        layer.keys = layer.keys.gather(2, gather)
        layer.values = layer.values.gather(2, gather.expand(-1, -1, -1, layer.values.shape[-1]))
        if mass is not None:
            mass.keep(index[0])
    return before - policy.budget


class AttentionMass:
    """One attention layer's accumulated attention per KV head and cached position, [H, S] float32.

    Aligned with the layer's cache by length: a forward of n queries over S keys appends n
    positions after the first S − n it already scored (a rollback crops the cache, and the
    scores past its length are dropped here on the next forward); `compress` keeps the same
    positions of both."""

    def __init__(self) -> None:
        self.scores: torch.Tensor | None = None

    def over(self, length: int) -> torch.Tensor:
        """The scores of the first `length` cached positions (0 for positions never scored)."""
        scores = self.scores if self.scores is not None else torch.zeros(0, 0)
        if scores.shape[-1] >= length:
            return scores[:, :length]
        return torch.nn.functional.pad(scores, (0, length - scores.shape[-1]))

    def add(self, weights: torch.Tensor, new: int) -> None:
        """Add the attention weights [H, S] of a forward that appended `new` positions."""
        older = self.over(weights.shape[-1] - new) if self.scores is not None else None
        if older is None or older.shape[0] != weights.shape[0]:
            older = torch.zeros(weights.shape[0], weights.shape[-1] - new, device=weights.device)
        self.scores = torch.nn.functional.pad(older.to(weights.device), (0, new)) + weights

    def keep(self, index: torch.Tensor) -> None:
        """Keep the scores of positions `index` [H, budget], as the cache keeps their keys."""
        self.scores = self.over(int(index.max()) + 1).gather(1, index)


def attention_weights(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None,
                      scaling: float | None) -> torch.Tensor:
    """softmax(q·kᵀ) for query [1, Hq, n, D] over key [1, H, S, D] (Hq a multiple of H), summed over
    the n queries and the query heads of each KV head: [H, S]. `mask` as sdpa takes it: boolean
    (True = may attend), additive, or None (causal, the n queries being the last n positions)."""
    _, query_heads, n, dim = query.shape
    heads, length = key.shape[1], key.shape[2]
    group = query_heads // heads
    scaling = dim ** -0.5 if scaling is None else scaling
    scores = (query.float().reshape(1, heads, group * n, dim) @ key.float().transpose(-1, -2)) * scaling
    scores = scores.view(1, heads, group, n, length)
    if mask is not None:
        mask = mask[:, :, None, -n:, :length]  # [1, 1, 1, n, S]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask.float()
    elif n > 1:
        allowed = torch.ones(n, length, dtype=torch.bool, device=key.device).tril(length - n)
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1).sum(dim=(2, 3))[0]


_sdpa = None  # the sdpa attention registered before `_sdpa_keeping_mass`, which it calls
_CARRYING: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()  # attention modules that carry a mass now


def _sdpa_keeping_mass(module, query, key, value, attention_mask, *args, **kwargs):
    """transformers' sdpa attention, and for a module that carries an `AttentionMass`, its weights added to it."""
    output = _sdpa(module, query, key, value, attention_mask, *args, **kwargs)
    mass = getattr(module, "kv_attention_mass", None)
    if mass is not None:
        mass.add(attention_weights(query, key, attention_mask, kwargs.get("scaling")), query.shape[-2])
    return output


def _attention_modules(model) -> list:
    """The model's self-attention modules, in layer order."""
    found = {m.layer_idx: m for m in model.modules()
             if type(m).__name__.endswith("Attention") and isinstance(getattr(m, "layer_idx", None), int)}
    return [found[i] for i in sorted(found)]


def track_attention(model, policy: KVPolicy, who: str = "kv") -> list[AttentionMass] | None:
    """Under `head`: give each attention module of `model` a fresh `AttentionMass` (one per layer,
    returned); under any other policy, take them away (None). One cache per model at a time."""
    global _sdpa
    if policy.kind != "head" and not _CARRYING:
        return None  # no module carries a mass to take away: spares walking every module on each run
    modules = _attention_modules(model)
    for module in modules:
        module.__dict__.pop("kv_attention_mass", None)
        _CARRYING.discard(module)
    if policy.kind != "head":
        return None
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != "sdpa":
        raise ValueError(f"{who}=head scores positions by the attention weights that sdpa attention computes; this "
                         f"model uses {implementation!r}: load it with attn_implementation='sdpa' or use {who}=l2")
    if _sdpa is None:
        from transformers import AttentionInterface
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        # Whatever is registered now (row-by-row attention for an int8 target wraps sdpa too), so
        # that tracking the draft's attention leaves the target's rows as they were computed.
        _sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
        AttentionInterface.register("sdpa", _sdpa_keeping_mass)
    masses = [AttentionMass() for _ in modules]
    for module, mass in zip(modules, masses):
        module.kv_attention_mass = mass
        _CARRYING.add(module)
    return masses


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
    writes_draft = writer.model is pair.draft
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
    elif not writes_draft:
        drafter.report_kv_peak(record, "draft_kv_bytes_peak")  # a head's own cache, on torch or on the runtime
    return record
