"""The interleaving every timed comparison shares: on each (repeat, prompt) every contender runs
once, in an order rotated by one step from the last, so that no contender always runs first
(on a warm cache) or last (on a throttled core), and each (repeat, prompt) has its own seed.
"""

from __future__ import annotations

from typing import Iterator, Sequence, TypeVar

T = TypeVar("T")
P = TypeVar("P")


def interleaved(prompts: Sequence[P], contenders: Sequence[T], repeats: int,
                indices: Sequence[int] | None = None) -> Iterator[tuple[int, int, P, list[T]]]:
    """(repeat, prompt index, prompt, contenders in this turn's order) for every turn. indices: each
    prompt's place in the whole run, where these prompts are a part of it (one task of a cluster run),
    so that a part's turns keep the order and seed the whole run gives them."""
    places = list(indices) if indices is not None else list(range(len(prompts)))
    if len(places) != len(prompts):
        raise ValueError(f"interleaved: {len(places)} indices for {len(prompts)} prompts")
    for repeat in range(repeats):
        for index, prompt in zip(places, prompts):
            shift = (repeat + index) % len(contenders)
            yield repeat, index, prompt, list(contenders[shift:]) + list(contenders[:shift])


def turn_seed(base_seed: int, repeat: int, index: int) -> int:
    """The seed of one (repeat, prompt): every contender samples with the same one."""
    return base_seed + 1000 * repeat + index
