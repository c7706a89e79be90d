"""The reference a head's q is checked against: its draft-vocabulary logits over the whole vocabulary."""

from __future__ import annotations

import torch


def full_logits(head, predicted: torch.Tensor) -> torch.Tensor:
    """[..., d] -> [..., V]: the head's logits at their draft ids (`draft_ids`; None: every id), −inf elsewhere,
    so a softmax of them is q with zeros outside the draft vocabulary."""
    logits = head.draft_logits(predicted)
    ids = head.draft_ids
    if ids is None:
        return logits
    full = logits.new_full((*logits.shape[:-1], head.vocab_size), float("-inf"))
    full[..., ids] = logits
    return full
