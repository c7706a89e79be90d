"""torch's CPU threads per method: one count for all, or `auto`.

On a small CPU a method that writes one token a step (AR, transformers' plain `generate`) is
bound by memory, and a second OpenMP thread only spins at the barrier after each operator; a
method that verifies several drafts at once gains from every core. `auto` gives the first kind
one thread and the second every core. The page's Playground and `bench --threads auto` decode by
this plan; the page's suites (`for_suites`) run on one thread under auto, and the page benchmark
runs `bench` by the same plan as the Benchmark tab.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

import torch

from ...engine.methods import METHODS
from .runners import ONE_TOKEN_BASELINES

AUTO = "auto"


def drafts(name: str) -> bool:
    """Whether the method verifies drafted tokens (else it writes one token a step)."""
    if name in METHODS:
        return METHODS[name].drafts
    return name not in ONE_TOKEN_BASELINES


@dataclass(frozen=True)
class ThreadPlan:
    """`count` threads for every method, or, with no count (auto), one for a method that writes
    one token a step and `cores` for one that verifies drafts."""

    count: int | None = None
    cores: int = 1

    @classmethod
    def parse(cls, value: int | str, cores: int | None = None) -> "ThreadPlan":
        """A plan from a count or "auto" (`cores`: this machine's, unless given); ValueError otherwise."""
        if str(value).strip().lower() == AUTO:
            return cls(count=None, cores=cores if cores is not None else os.cpu_count() or 1)
        try:
            count = int(value)
        except (TypeError, ValueError):
            count = 0
        if count < 1 or isinstance(value, float) and value != count:
            raise ValueError(f"threads must be an integer ≥ 1 or {AUTO}, got {value!r}")
        return cls(count=count)

    def for_method(self, name: str) -> int:
        if self.count is not None:
            return self.count
        return self.cores if drafts(name) else 1

    def for_runtime(self, runtime: str) -> "ThreadPlan":
        """The plan for a target on `runtime`: auto's one thread for AR is torch's measured choice; the
        onnx target's AR gains from every core (31.7 against 43.2 tok/s at 1 and 2 threads on a 2-core
        machine, docs/runtime.md), so there auto gives every method every core. A count stays a count."""
        return ThreadPlan(count=self.cores) if self.count is None and runtime != "torch" else self

    @property
    def default(self) -> int:
        """The count for work that is not one Playground decode (the Benchmark and Sweep tabs)."""
        return self.for_suites().count

    def for_suites(self) -> "ThreadPlan":
        """The plan for a suite the page runs (the Benchmark and Sweep tabs): a count stays a count;
        auto runs every method on one thread. A suite decodes for minutes beside the browser and
        the server's event loop, and there two threads gave the drafting methods no more than one
        thread gives them alone (docs/benchmark.md), while the barrier between two threads made
        every run wait on any other work. The Benchmark tab takes `for_runtime` first, so that on a runtime
        target auto gives every method every core, as the Playground does."""
        return self if self.count is not None else ThreadPlan(count=1)

    def describe(self) -> str:
        """The plan in the words the page's status line uses for a run's threads (`threads_sentence`)."""
        if self.count is not None:
            return threads_sentence(self.count, self.count)
        return f"auto: {threads_sentence(1, self.cores)}"

    @contextlib.contextmanager
    def applied(self, name: str) -> Iterator[int]:
        """torch's thread count set for one decode of `name`, and set back after it."""
        before = torch.get_num_threads()
        count = self.for_method(name)
        torch.set_num_threads(count)
        try:
            yield count
        finally:
            torch.set_num_threads(before)


def threads_sentence(one_token: int, drafting: int) -> str:
    """The threads of a run as the server's log and the page say them: "2 torch threads" where every method
    had the same count, else "1 torch thread for AR, 2 for the drafting methods"."""
    first = f"{one_token} torch thread{'s' if one_token != 1 else ''}"
    return first if one_token == drafting else f"{first} for AR, {drafting} for the drafting methods"


def threads_text(threads: int | dict[str, int] | None) -> str:
    """A run's threads as a report says them: "2 threads", or per count the methods that ran on it."""
    if not isinstance(threads, dict):
        return f"{threads} threads"
    by_count: dict[int, list[str]] = {}
    for name, count in threads.items():
        by_count.setdefault(count, []).append(name)
    return "; ".join(f"{count} thread{'s' if count != 1 else ''}: {', '.join(names)}"
                     for count, names in sorted(by_count.items()))
