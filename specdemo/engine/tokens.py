"""Token-id helpers every layer shares: cutting a sequence after its first EOS, the length of
two sequences' common prefix, and the text one token adds to the ones before it."""

from __future__ import annotations

from typing import Collection, Sequence


def cut_at_eos(ids: Sequence[int], eos_ids: Collection[int]) -> list[int]:
    """ids up to and including the first EOS id (all of them if none is an EOS)."""
    for i, token in enumerate(ids):
        if token in eos_ids:
            return list(ids[: i + 1])
    return list(ids)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids a and b share (a cache holding a keeps that many for b)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


# Tokens of context used to decode one token's text, so multi-byte characters split
# over several tokens come out whole on the last of them.
_TEXT_WINDOW = 6
# What a decoder writes for the bytes of a character whose last bytes are still to come.
_INCOMPLETE = "\ufffd"


def token_text(tokenizer, sequence: list[int], position: int, floor: int = 0) -> str:
    """The text that sequence[position] adds after what comes before it. A token that ends
    inside a character adds nothing: the character is the text of the token that completes it."""
    start = max(floor, position - _TEXT_WINDOW)
    before = tokenizer.decode(sequence[start:position]).rstrip(_INCOMPLETE) if position > start else ""
    upto = tokenizer.decode(sequence[start : position + 1]).rstrip(_INCOMPLETE)
    if upto.startswith(before):
        return upto[len(before) :]
    return tokenizer.decode([sequence[position]])
