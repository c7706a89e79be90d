"""The interleaving every timed comparison shares: on each (repeat, prompt) every contender runs
once, in an order rotated by one step from the last, so that no contender always runs first
(on a warm cache) or last (on a throttled core), and each (repeat, prompt) has its own seed.
"""

from __future__ import annotations

from typing import Iterator, Sequence, TypeVar

T = TypeVar("T")
P = TypeVar("P")


def interleaved(prompts: Sequence[P], contenders: Sequence[T], repeats: int) -> Iterator[tuple[int, int, P, list[T]]]:
    """(repeat, prompt index, prompt, contenders in this turn's order) for every turn."""
    for repeat in range(repeats):
        for index, prompt in enumerate(prompts):
            shift = (repeat + index) % len(contenders)
            yield repeat, index, prompt, list(contenders[shift:]) + list(contenders[:shift])


def turn_seed(base_seed: int, repeat: int, index: int) -> int:
    """The seed of one (repeat, prompt): every contender samples with the same one."""
    return base_seed + 1000 * repeat + index
