"""A round on the ONNX Runtime target by context length: what its parts cost as the context grows.

    python -m specdemo.bench.runtime_round --lengths 100,500,1000,2000 --threads 1

For each length, a prompt cut from the long suite is prefilled once; then, interleaved and repeated, the
target's one-row step, its verification of γ + 1 rows, the same two as bare runtime calls (the writer's
own work around a forward is the difference), and, with a feature head, one draft step of the head on the
runtime. Every call is rolled back after it, so each one runs at the same context length. Medians in ms
(docs/runtime.md, "A round at long contexts").
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from .long_suite import long_suite


def context_ids(pair, length: int) -> list[int]:
    """`length` ids of a long-suite prompt (the pair's tokenizer)."""
    text = long_suite(pair.tokenizer, (length + 16,), 1)[0].prompt
    ids = pair.tokenizer(text, add_special_tokens=False)["input_ids"][:length]
    if len(ids) < length:
        raise ValueError(f"the long suite gave {len(ids)} tokens, fewer than the {length} asked for")
    return ids


def interleaved_medians(calls: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Each call once as a warm-up, then `repeats` rounds of every call in turn; median ms of each."""
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


def profile_context(pair, ids: list[int], gamma: int = 3, repeats: int = 15) -> dict[str, float]:
    """The parts of a round at len(ids) tokens of context (ms), on the pair's runtime target."""
    runtime, length, rows = pair.target_runtime, len(ids), gamma + 1
    if runtime is None:
        raise ValueError("runtime_round profiles a target on the onnx runtime; this pair's target runs on torch")
    writer = runtime.cached_lm(pair.target, pair.vocab_size, length + rows + 1)
    generator = writer.generator
    one, verified = torch.tensor(ids[-1:]), torch.tensor(ids[-rows:])

    def fed(new: torch.Tensor, hidden: int) -> Callable[[], None]:
        return lambda: (writer.feed(new, new.shape[0], hidden), writer.rollback(length))

    def bare(new: list[int]) -> Callable[[], None]:
        return lambda: (generator.append_tokens(np.asarray([new], dtype=np.int32)), generator.rewind_to(length))

    calls = {"step": fed(one, 0), "verify": fed(verified, rows), "bare step": bare(ids[-1:]),
             "bare verify": bare(ids[-rows:])}
    try:
        with torch.inference_mode():
            states = writer.prefill(ids, hidden=True)
            if pair.draft_kind == "feature-head":
                calls["head step"] = _head_step(pair, ids, states)
            return interleaved_medians(calls, repeats)
    finally:
        writer.close()


def _head_step(pair, ids: list[int], states: torch.Tensor) -> Callable[[], None]:
    """One draft step of the pair's head beside the runtime target, after the whole context is cached."""
    drafter = pair.target_runtime.feature_drafter(pair.draft)
    drafter.start(ids, states[:-1])
    predicted = drafter.catch_up(ids)
    committed = drafter.cache.length

    def step() -> None:
        drafter.head_step(predicted.view(1, -1), [ids[-1]], len(ids) - 1)
        drafter.cache.length = committed

    return step


def main(argv: list[str] | None = None) -> None:
    from specdemo.models import load_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--lengths", default="100,500,1000,2000")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, runtime="onnx")
    print("| context | step ms | verify ms | verify ÷ step | writer's work ms (step, verify) | head step ms |")
    print("|---|---|---|---|---|---|")
    for length in (int(x) for x in args.lengths.split(",")):
        t = profile_context(pair, context_ids(pair, length), args.gamma, args.repeats)
        print(f"| {length} | {t['step']:.2f} | {t['verify']:.2f} | {t['verify'] / t['step']:.2f} | "
              f"{t['step'] - t['bare step']:+.2f}, {t['verify'] - t['bare verify']:+.2f} | "
              f"{t.get('head step', float('nan')):.2f} |", flush=True)


if __name__ == "__main__": main()
