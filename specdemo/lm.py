"""One causal LM and its KV cache. Every transformers cache detail lives here.

A `CachedLM` belongs to one generation: the model weights are shared between
requests, the cache never is.

Two cache kinds:
  dynamic  transformers' `DynamicCache`: keys and values grow by concatenation;
           rolling back slices them (`crop`).
  static   transformers' `StaticCache`: keys and values are preallocated for
           `max_length` positions [1, kv_heads, max_length, head_dim] per layer and
           written in place at the cache's length. Rolling back only moves that
           length (an in-place fill of a device scalar): nothing is copied or
           reallocated, and stale positions past the length are hidden by the causal
           mask (a query at position t attends to keys 0..t only).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer

CACHE_KINDS = ("dynamic", "static")


def default_cache_kind(device: torch.device | str) -> str:
    """Static on CUDA (where launch overhead and cache copies dominate), dynamic elsewhere."""
    return "static" if torch.device(device).type == "cuda" else "dynamic"


class CachedLM:
    """A causal LM that remembers which token ids its KV cache holds.

    `logits(sequence, n)` feeds only the part of `sequence` the cache does not already
    hold (after rolling the cache back to the longest common prefix) and returns the
    logits of the last n positions. Rolling back never recomputes anything.

    cache: "dynamic" or "static"; a static cache needs `max_length`, the most
    positions the generation can ever hold (prompt + new tokens + padding slack).
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None, cache: str = "dynamic",
                 max_length: int | None = None):
        if cache not in CACHE_KINDS:
            raise ValueError(f"cache: {cache!r} is not one of {', '.join(CACHE_KINDS)}")
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.kind = cache
        self.max_length = max_length
        self.cached_ids: list[int] = []
        self.length = 0  # positions the cache holds (cached_ids may lag behind until `note_fed`)
        self.forwards = 0
        if cache == "static":
            if not max_length or max_length < 1:
                raise ValueError("cache: a static cache needs max_length ≥ 1")
            self.cache = StaticCache(config=model.config, max_cache_len=max_length)
            if not all(type(layer) is StaticLayer for layer in self.cache.layers):
                kinds = sorted({type(layer).__name__ for layer in self.cache.layers})
                raise ValueError(f"cache: static rollback supports full-attention layers only, not {', '.join(kinds)};"
                                 " use cache='dynamic' for this model")
            # Keys and values are allocated by the first forward (prefill), with the
            # model's own head shapes and dtype; from then on their addresses never change.
        else:
            self.cache = DynamicCache(config=model.config)

    def __len__(self) -> int:
        return len(self.cached_ids)

    def rollback(self, length: int) -> None:
        """Forget every cached position from `length` on."""
        surplus = self.length - length
        if surplus > 0:
            if self.kind == "static":
                self._set_length(length)
            else:
                # transformers 5 counts the tokens to remove as a negative number.
                self.cache.crop(-surplus)
            self.length = length
        del self.cached_ids[length:]

    def _set_length(self, length: int) -> None:
        # In place: the length tensors keep their addresses (a captured graph reads them).
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)

    def feed(self, new_ids: torch.Tensor, n_logits: int) -> torch.Tensor:
        """Append new_ids [n] (on the model's device) to the cache; logits [n_logits, V]."""
        n = new_ids.shape[0]
        if self.kind == "static" and self.length + n > self.max_length:
            raise ValueError(f"static cache: {self.length} + {n} positions exceed its max_length {self.max_length}")
        output = self.model(
            input_ids=new_ids.view(1, -1),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=n_logits,
        )
        self.forwards += 1
        self.length += n
        logits = output.logits[0, -n_logits:]
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        return logits

    def note_fed(self, ids: list[int]) -> None:
        """Record ids that `feed` appended from a device tensor (read back later in one go)."""
        self.cached_ids.extend(ids)

    def logits(self, sequence: list[int], n_logits: int = 1) -> torch.Tensor:
        """Logits [n_logits, V] at the last n_logits positions of `sequence`."""
        keep = _common_prefix_length(self.cached_ids, sequence)
        # At least n_logits tokens must go through the model to get their logits.
        keep = min(keep, len(sequence) - n_logits)
        self.rollback(keep)
        new = sequence[keep:]
        logits = self.feed(torch.tensor(new, device=self.device), n_logits)
        self.cached_ids.extend(new)
        return logits

    def prefill(self, sequence: list[int]) -> None:
        """Cache every position of `sequence` (no logits needed)."""
        if len(sequence) > len(self.cached_ids) or sequence[: len(self.cached_ids)] != self.cached_ids:
            self.logits(sequence, 1)


def _common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i
