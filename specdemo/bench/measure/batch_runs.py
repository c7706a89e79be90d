"""The benchmark at several batch sizes: the prompts cut into batches of each size (`batching`), every
batch run by every method in an order rotated per batch, each batch through `specdemo.generate_batch`
(batch 1 through the same timed call as the single benchmark), one row per request.

Peers that take one request at a time (transformers' generate and assisted generation, the runtime's own
loops) run at batch 1 only; `BATCH_ONE_ONLY` says why. A question of several turns is asked its first turn.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Sequence

from .batching import cut_into_batches
from .runners import HF_METHODS, RUNTIME_PEERS, TORCH_AR, Run, run_batch
from .schedule import WARM_UP_TOKENS, play, schedule

BATCH_ONE_ONLY = {
    **{name: "transformers' generate pads a batch to its longest prompt and assisted generation takes one "
             "request; it runs at batch 1 only" for name in HF_METHODS},
    **{name: "the runtime's own loop decodes one request; it runs at batch 1 only"
       for name in RUNTIME_PEERS if name != TORCH_AR},
}


def batch_one_only(names: Sequence[str], sizes: Sequence[int]) -> dict[str, str]:
    """The methods among `names` that skip the batch sizes above 1, each with the reason; {} at batch 1 alone."""
    return {n: BATCH_ONE_ONLY[n] for n in names if n in BATCH_ONE_ONLY} if max(sizes) > 1 else {}


def runs_planned(prompts: int, sizes: Sequence[int], names: Sequence[str], repeats: int) -> int:
    """How many rows the batched benchmark writes: every request of every batch, each method that runs there."""
    skipped = batch_one_only(names, sizes)
    return repeats * sum(len(cut_into_batches(prompts, size)) * size * len([n for n in names
                                                                          if size == 1 or n not in skipped])
                         for size in sizes)


def warm_up_batches(session, ids: list[list[int]], seed: int) -> None:
    """One short batch of two per method that runs batched: its first batched forward is not timed."""
    short = {**session.decode_values, "max_new_tokens": min(WARM_UP_TOKENS, session.decode.max_new_tokens)}
    session.total += 1
    for method in session.names:
        if method not in BATCH_ONE_ONLY:
            with contextlib.suppress(Exception):  # the timed run says what failed, in its row
                run_batch(session.pair, method, ids, short, seed)
    session.tick("warm-up batches")


def play_batches(session, items, encoded: list[list[int]], sizes: Sequence[int], base_seed: int) -> None:
    """Every batch of every size, each method in its turn's order; each request's row compared with AR's row
    for the same prompt in the same batch."""
    skipped = batch_one_only(session.names, sizes)
    turns = (replace(turn, order=tuple(m for m in turn.order if turn.size == 1 or m not in skipped))
             for turn in schedule(len(items), session.names, session.repeats, base_seed, sizes=sizes))
    for step in play(turns, lambda turn, _, method: _run_batch(session, method, [encoded[i] for i in turn.prompts],
                                                               turn.seed)):
        if not step.last:
            continue
        turn = step.turn
        for row_index, prompt in enumerate(turn.prompts):
            group = {}
            for method, position, (outcome, batch_seconds) in step.ran:
                row = session.row(method, position, turn, row_index, items[prompt])
                row.update(prompt_tokens=len(encoded[prompt]), batch=turn.size, batch_index=turn.index,
                           batch_row=row_index, batch_seconds=batch_seconds)
                run = outcome[row_index] if isinstance(outcome, list) else None
                if run is None:
                    row["error"] = outcome
                group[method] = (row, run, encoded[prompt])
            session.record(group, turn.repeat, prompt, items[prompt], 1)
            session.tick(f"batch {turn.size} #{turn.index + 1} row {row_index + 1} "
                         f"(repeat {turn.repeat + 1}/{session.repeats})")


def _run_batch(session, method: str, ids: list[list[int]], seed: int) -> tuple[list[Run] | str, float]:
    """(one Run per row, or the error as text; the batch's wall seconds). Batch 1 is the single benchmark's call."""
    try:
        if len(ids) == 1:
            run = session.run(method, ids[0], seed)
            return [run], run.seconds
        threads = session.threads.applied(method) if session.threads is not None else contextlib.nullcontext()
        with threads:
            return run_batch(session.pair, method, ids, session.decode_values, seed)
    except Exception as error:  # one broken method must not sink a long run
        return f"{type(error).__name__}: {error}", float("nan")
