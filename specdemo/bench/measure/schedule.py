"""The interleaving every timed comparison shares: on each (repeat, prompt) every contender runs
once, in an order rotated by one step from the last, so that no contender always runs first
(on a warm cache) or last (on a throttled core), and each (repeat, prompt) has its own seed.

`schedule` lays a run's turns out (each (repeat, prompt), or each (repeat, batch) of every size) and
`play` runs each turn's contenders in its order through one callable, a `Step` after each run. The
benchmark's contenders are method names, the sweep's are settings: nothing here knows which.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")
P = TypeVar("P")

DEFAULT_SEED = 1234  # a run's base seed where its parameters leave the seed unset
WARM_UP_TOKENS = 8  # the most tokens a warm-up run decodes


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


def base_seed(seed: int | None) -> int:
    return seed if seed is not None else DEFAULT_SEED


@dataclass(frozen=True)
class Turn(Generic[T]):
    """What each contender of `order` runs once: one prompt, or a batch of them (row r seeded seed + r)."""

    repeat: int
    index: int  # the prompt's place in the whole run; a batch's number among the batches of its size
    prompts: tuple[int, ...]  # positions in the prompts the caller holds: one, or a batch's rows
    places: tuple[int, ...]  # the same prompts' places in the whole run (a cluster task holds a part)
    order: tuple[T, ...]
    seed: int
    part: int = 1  # the turn of a conversation every contender answers here (its own earlier answers before)
    warm: bool = False  # an untimed warm-up: short runs that write no row

    @property
    def size(self) -> int:
        return len(self.prompts)


def warm_up_turn(contenders: Sequence[T], seed: int) -> Turn[T]:
    """One short untimed run of each contender on the first prompt: allocator pools, lazy imports, kernel
    choices and compiled graphs settle before the clock runs."""
    return Turn(0, 0, (0,), (0,), tuple(contenders), seed, warm=True)


def schedule(count: int, contenders: Sequence[T], repeats: int, seed: int, *, sizes: Sequence[int] | None = None,
             indices: Sequence[int] | None = None, parts: Callable[[int], int] | None = None) -> Iterator[Turn[T]]:
    """Every timed turn of `count` prompts. sizes None: each (repeat, prompt) of `interleaved`, `parts(i)`
    turns of a conversation for prompt i, one after the other in one order; else each (repeat, batch) of
    every size (`batching.batch_turns`), a batch's first row seeded as that prompt alone would be."""
    place = (lambda p: indices[p]) if indices is not None else (lambda p: p)
    if sizes is None:
        for repeat, index, prompt, order in interleaved(range(count), contenders, repeats, indices):
            for part in range(1, (parts(prompt) if parts else 1) + 1):
                yield Turn(repeat, index, (prompt,), (index,), tuple(order), turn_seed(seed, repeat, index), part)
        return
    from .batching import batch_turns

    for repeat, size, index, prompts, order in batch_turns(count, sizes, contenders, repeats):
        yield Turn(repeat, index, tuple(prompts), tuple(map(place, prompts)), tuple(order),
                   turn_seed(seed, repeat, index * size))


@dataclass(eq=False)
class Step(Generic[T]):
    """One run of a turn: every run of the turn so far as (contender, position, outcome), this one last."""

    turn: Turn[T]
    ran: tuple[tuple[T, int, Any], ...]
    ask: Callable[[], bool] | None = field(default=None, repr=False)

    @property
    def contender(self) -> T:
        return self.ran[-1][0]

    @property
    def outcome(self) -> Any:
        return self.ran[-1][2]

    @functools.cached_property
    def stopped(self) -> bool:
        """Whether a stop was requested after this run: asked once, when first read, so that a caller asks
        before or after passing the step on, as its events need."""
        return bool(self.ask and self.ask())

    @property
    def last(self) -> bool:
        """The turn's runs end here: its last contender ran, or a stop was requested (asked first, always)."""
        return self.stopped or len(self.ran) == len(self.turn.order)


def play(turns: Iterable[Turn[T]], run: Callable[[Turn[T], int, T], Any],
         should_stop: Callable[[], bool] | None = None) -> Iterator[Step[T]]:
    """Each turn's contenders in its order through run(turn, position, contender), a Step after each run;
    a stop requested after a run ends the play there."""
    for turn in turns:
        ran: tuple[tuple[T, int, Any], ...] = ()
        for position, contender in enumerate(turn.order):
            ran += ((contender, position, run(turn, position, contender)),)
            step = Step(turn, ran, should_stop)
            yield step
            if step.stopped:
                return


def check_count(name: str, value) -> None:
    """A count of repeats or a batch size: a whole number ≥ 1, never a bool."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
