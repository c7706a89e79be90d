"""A sweep at one batch size above 1: the prompts cut into batches of that size
(`measure.batching.cut_into_batches`), each batch run by AR and every setting in an order rotated per
batch, through `specdemo.generate_batch`; one row per request, compared with AR's row for the same
prompt in the same batch.

A batch's forwards feed every row at once, so the per-row FLOP estimates are left empty; the forwards
per token are each row's own (`GenerationResult.target_forwards`, `draft_forwards`), as its trace's
statistics give them.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

from ...engine.params import DecodeParams
from ..measure.batching import batch_turns
from ..measure.batch_runs import time_batch
from ..measure.runners import Run
from ..measure.schedule import turn_seed
from .grid import Setting
from .rows import group_rows


def sweep_in_batches(pair, items, encoded: list[list[int]], runs: Sequence[Setting], repeats: int, batch: int,
                     base: DecodeParams, should_stop: Callable[[], bool] | None, where: dict, events,
                     token_rows) -> Iterator:
    """Every batch, each setting in its turn's order; `events(message, new_rows, new_tokens, stopped)` makes the
    SweepEvent to yield after each batch run, and `token_rows(group, item, repeat)` one request's drafted tokens."""
    shared = {k: v for k, v in base.as_dict().items() if k != "seed"}
    base_seed = base.seed if base.seed is not None else 1234
    greedy = base.sampling.greedy
    for repeat, _, index, prompts, order in batch_turns(len(items), [batch], runs, repeats):
        seed = turn_seed(base_seed, repeat, index * batch)
        ids = [encoded[i] for i in prompts]
        done: dict[Setting, tuple[int, list[Run], float]] = {}
        for position, setting in enumerate(order):
            done[setting] = (position, *timed_batch(pair, setting, ids, seed, shared))
            stop = bool(should_stop and should_stop())
            new, drafted = [], []
            if len(done) == len(order) or stop:
                for item, group, rows in _rows(items, prompts, index, repeat, seed, ids, runs, done, greedy, batch,
                                               where):
                    new += rows
                    drafted += token_rows(group, item, repeat)
            message = f"batch {index + 1} {setting.label} (batch {batch}, repeat {repeat + 1}/{repeats})"
            yield events(message, new, drafted, stop)
            if stop:
                return


def timed_batch(pair, setting: Setting, ids: list[list[int]], seed: int, shared: dict) -> tuple[list[Run], float]:
    """One setting on one batch: a Run per row (its seconds its latency from the batch's start) and the
    batch's wall seconds."""
    return time_batch(pair, ids, setting.method, **{**shared, **setting.params(), "seed": seed})


def _rows(items, prompts, index, repeat, seed, ids, runs, done, greedy, batch, where) -> list[tuple]:
    """Per request of the batch: (its prompt, its runs as group_rows takes them, its rows: every setting that
    ran, in grid order, marked with the batch)."""
    out = []
    ranked = sorted(done, key=runs.index)
    for row_index, prompt in enumerate(prompts):
        group = []
        for setting in ranked:
            position, batch_runs, _ = done[setting]
            group.append((setting, position, batch_runs[row_index]))
        rows = group_rows(items[prompt], prompt, repeat, seed + row_index, ids[row_index], group, greedy)
        for row in rows:
            row.update(where, batch=batch, batch_index=index, batch_row=row_index,
                       batch_seconds=done[next(s for s in ranked if s.key == row["setting"])][2])
        out.append((items[prompt], group, rows))
    return out
