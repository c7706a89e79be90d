"""Phase timings that never make the device wait.

A span (the prefill, or one round) is cut into phases: `start()` opens it, each `lap()`
closes a phase and opens the next, `stop()` closes the last and returns the seconds of
every phase, which add up to the span's wall time.

`stop()` belongs right after the host has read a result of the span's last work (a round's
read-back): the device has nothing left to do then, so host time is device time too. A span
that ends without a read (the prefill) asks `stop(wait=True)`, which waits for the device.

On a GPU, work is queued: when the host reaches a boundary inside a span, the device may
still be busy with the phase before. `WallClock` (CPU) reads the host clock at each
boundary, where the CPU has done the work. `EventClock` (CUDA) records a CUDA event there
instead, which the device timestamps when it gets to it, and reads the events at `stop()`,
when they are done: timing adds no synchronisation.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Hashable, Mapping, TypeVar

import torch

K = TypeVar("K", bound=Hashable)


class WallClock:
    """Host time at each boundary."""

    def __init__(self) -> None:
        self._marks: list[float] = []

    def start(self) -> None:
        self._marks = [time.perf_counter()]

    def lap(self) -> None:
        self._marks.append(time.perf_counter())

    def stop(self, wait: bool = False) -> list[float]:
        self.lap()
        marks = self._marks
        return [b - a for a, b in zip(marks, marks[1:])]


class EventClock:
    """Device time between CUDA events for every phase but the last, which gets the rest of the span.

    The span's total is host time from `start()` to `stop()`. `start()` is meant for an idle
    device (the beginning, or just after a read-back) and `stop()` for just after a read-back:
    at both ends host and device clocks agree.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._start = 0.0
        self._events: list[torch.cuda.Event] = []

    def _record(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        self._events.append(event)
        return event

    def start(self) -> None:
        self._events = []
        self._start = time.perf_counter()
        self._record()

    def lap(self) -> None:
        self._record()

    def stop(self, wait: bool = False) -> list[float]:
        if wait:
            self._record().synchronize()
            self._events.pop()
        last = self._events[-1]
        if not last.query():  # a read-back after the last boundary makes this never wait
            last.synchronize()
        total = time.perf_counter() - self._start
        events = self._events
        timed = [a.elapsed_time(b) / 1000.0 for a, b in zip(events, events[1:])]
        return timed + [max(0.0, total - sum(timed))]


def phase_clock(device: torch.device) -> WallClock | EventClock:
    """The clock for a generation on `device`."""
    return EventClock(device) if device.type == "cuda" else WallClock()


def _synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_medians(calls: Mapping[K, Callable[[], object]], repeats: int, *, warmup: int = 0,
                        between: Callable[[], object] | None = None,
                        device: torch.device | None = None) -> dict[K, float]:
    """Median seconds of each call timed alone. The calls take turns, `repeats` times after
    `warmup` untimed turns, so a machine that others share slows them alike and their ratio
    holds. `between` runs after each turn, untimed (a cache rollback). On a GPU the device is
    synchronised around each call: these are costs of single calls, not of a decode loop."""
    timings: dict[K, list[float]] = {name: [] for name in calls}
    for turn in range(warmup + repeats):
        for name, call in calls.items():
            _synchronize(device)
            start = time.perf_counter()
            call()
            _synchronize(device)
            if turn >= warmup:
                timings[name].append(time.perf_counter() - start)
        if between is not None:
            between()
    return {name: statistics.median(seconds) for name, seconds in timings.items()}
