"""One causal LM and its KV cache. Every transformers cache detail lives here.

A `CachedLM` belongs to one generation: the model weights are shared between
requests, the cache never is.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class CachedLM:
    """A causal LM that remembers which token ids its KV cache holds.

    `logits(sequence, n)` feeds only the part of `sequence` the cache does not already
    hold (after rolling the cache back to the longest common prefix) and returns the
    logits of the last n positions. Rolling back costs a slice; nothing is recomputed.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None):
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        self.cached_ids: list[int] = []
        self.forwards = 0

    def __len__(self) -> int:
        return len(self.cached_ids)

    def rollback(self, length: int) -> None:
        """Forget every cached position from `length` on."""
        surplus = len(self.cached_ids) - length
        if surplus > 0:
            # transformers 5 counts the tokens to remove as a negative number.
            self.cache.crop(-surplus)
            del self.cached_ids[length:]

    def feed(self, new_ids: torch.Tensor, n_logits: int) -> torch.Tensor:
        """Append new_ids [n] (on the model's device) to the cache; logits [n_logits, V]."""
        output = self.model(
            input_ids=new_ids.view(1, -1),
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=n_logits,
        )
        self.forwards += 1
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
