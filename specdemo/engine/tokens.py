"""Token-id helpers every layer shares: cutting a sequence after its first EOS."""

from __future__ import annotations

from typing import Collection, Sequence


def cut_at_eos(ids: Sequence[int], eos_ids: Collection[int]) -> list[int]:
    """ids up to and including the first EOS id (all of them if none is an EOS)."""
    for i, token in enumerate(ids):
        if token in eos_ids:
            return list(ids[: i + 1])
    return list(ids)
