"""The benchmark at several batch sizes: the prompts cut into batches of each size (`batching`), every
batch run by every method in an order rotated per batch, each batch through `specdemo.generate_batch`
(batch 1 through the same timed call as the single benchmark), one row per request.

Peers that take one request at a time (transformers' generate and assisted generation, the runtime's own
loops) run at batch 1 only; `BATCH_ONE_ONLY` says why. A question of several turns is asked its first turn.
"""

from __future__ import annotations

import contextlib
import time
from typing import Sequence

from ...engine.params import DecodeParams
from ...models.torch_copy import TORCH_COPY, generate_batch, on_torch
from .batching import batch_turns, cut_into_batches
from .runners import HF_METHODS, RUNTIME_PEERS, TORCH_AR, Run, bench_methods, quiet_gc
from .schedule import turn_seed

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
    short = DecodeParams.from_values(**{**session.decode.as_dict(), "max_new_tokens": min(8, session.decode.max_new_tokens)})
    session.total += 1
    for method in session.names:
        if method not in BATCH_ONE_ONLY:
            with contextlib.suppress(Exception):  # the timed run says what failed, in its row
                _timed_batch(session.pair, method, ids, seed, short)
    session.tick("warm-up batches")


def play_batches(session, items, encoded: list[list[int]], sizes: Sequence[int], base_seed: int) -> None:
    """Every batch of every size, each method in its turn's order; each request's row compared with AR's row
    for the same prompt in the same batch."""
    skipped = batch_one_only(session.names, sizes)
    for repeat, size, index, prompts, order in batch_turns(len(items), sizes, session.names, session.repeats):
        order = [m for m in order if size == 1 or m not in skipped]
        # Row r samples with seed + r, so an unwrapped prompt keeps the seed it has at batch 1.
        seed = turn_seed(base_seed, repeat, index * size)
        ids = [encoded[i] for i in prompts]
        runs = {method: _run_batch(session, method, ids, seed) for method in order}
        for row_index, prompt in enumerate(prompts):
            group = {}
            for position, method in enumerate(order):
                outcome, batch_seconds = runs[method]
                row = _row(session, method, position, items[prompt], prompt, repeat, seed + row_index, ids[row_index])
                row.update(batch=size, batch_index=index, batch_row=row_index, batch_seconds=batch_seconds)
                run = outcome[row_index] if isinstance(outcome, list) else None
                if run is None:
                    row["error"] = outcome
                group[method] = (row, run, ids[row_index])
            session.record(group, repeat, prompt, items[prompt], 1)
            session.tick(f"batch {size} #{index + 1} row {row_index + 1} (repeat {repeat + 1}/{session.repeats})")


def _row(session, method: str, position: int, item, prompt_index: int, repeat: int, seed: int, ids) -> dict:
    return {"repeat": repeat, "prompt_index": prompt_index, "prompt_id": item.id, "turn": 1,
            "category": item.category, "method": method, "label": bench_methods()[method], "order": position,
            "seed": seed, "threads": session.threads_of(method), "error": "", "prompt_tokens": len(ids),
            **session.where}


def _run_batch(session, method: str, ids: list[list[int]], seed: int) -> tuple[list[Run] | str, float]:
    """(one Run per row, or the error as text; the batch's wall seconds). Batch 1 is the single benchmark's call."""
    try:
        if len(ids) == 1:
            run = session.run(method, ids[0], seed)
            return [run], run.seconds
        threads = session.threads.applied(method) if session.threads is not None else contextlib.nullcontext()
        with threads:
            return _timed_batch(session.pair, method, ids, seed, session.decode)
    except Exception as error:  # one broken method must not sink a long run
        return f"{type(error).__name__}: {error}", float("nan")


def time_batch(pair, ids: list[list[int]], method: str, **params) -> tuple[list[Run], float]:
    """One `generate_batch` call timed as a whole: a Run per row (its seconds its latency from the batch's
    start) and the batch's wall seconds."""
    with quiet_gc():
        _sync(pair.device)
        start = time.perf_counter()
        results = generate_batch(pair, ids, method, **params)
        _sync(pair.device)
        seconds = time.perf_counter() - start
    runs = []
    for result in results:
        stats = dict(result.stats)
        stats["engine_seconds"] = stats.pop("seconds")
        stats["prefill_s"] = result.prefill_seconds
        runs.append(Run(result.token_ids, result.seconds, stats,
                        [(len(r.drafted), r.accepted) for r in result.rounds], result))
    return runs, seconds


def _timed_batch(pair, method: str, ids: list[list[int]], seed: int, decode: DecodeParams) -> tuple[list[Run], float]:
    runs_on, name = (on_torch(pair), "ar") if method == TORCH_AR else (pair, method)
    runs, seconds = time_batch(runs_on, ids, name, decode=decode, seed=seed)
    if method == TORCH_AR:
        for run in runs:
            run.stats["runtime"] = TORCH_COPY
    return runs, seconds


def _sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
