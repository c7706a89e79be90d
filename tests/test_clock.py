"""specdemo.engine.clock: a span's phases add up to its wall time, and timing never waits for a GPU."""

import time

import pytest
import torch

from specdemo.engine.clock import EventClock, WallClock, phase_clock

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _timed_span(clock, phases):
    """Run `phases` (callables) as one span; return the laps and two host times: the span's
    inside (from start() returning to stop() being called) and its outside (around both). The
    clock's total lies between them, however the machine schedules the test."""
    before = time.perf_counter()
    clock.start()
    inside_from = time.perf_counter()
    for i, phase in enumerate(phases):
        if i:
            clock.lap()
        phase()
    inside_to = time.perf_counter()
    laps = clock.stop()
    return laps, inside_to - inside_from, time.perf_counter() - before


def test_the_cpu_clock_laps_add_up_to_the_wall_time():
    laps, inside, outside = _timed_span(WallClock(), [lambda: time.sleep(0.02), lambda: time.sleep(0.01),
                                                      lambda: None])
    assert len(laps) == 3 and all(lap >= 0 for lap in laps)
    assert inside <= sum(laps) <= outside


def test_each_cpu_lap_holds_its_own_phase():
    """Each sleep lands in its own lap, not the next, and no lap carries the ones before it."""
    laps, _, _ = _timed_span(WallClock(), [lambda: time.sleep(0.02), lambda: time.sleep(0.01), lambda: None])
    long_sleep, short_sleep, empty = laps
    assert long_sleep >= 0.02 and short_sleep >= 0.01
    # The empty phase is only compared with the longer sleep: a busy machine may pause the test for
    # a few milliseconds anywhere, so no bound in milliseconds would hold.
    assert empty < long_sleep


def test_a_clock_starts_afresh_at_every_span():
    clock = WallClock()
    _timed_span(clock, [lambda: time.sleep(0.01)])
    laps, _, outside = _timed_span(clock, [lambda: None, lambda: None])
    # A clock that kept the first span's marks would return more laps, and their sum would span
    # the first span's sleep, outside the second span.
    assert len(laps) == 2 and sum(laps) <= outside


def test_each_device_gets_its_clock():
    assert isinstance(phase_clock(torch.device("cpu")), WallClock)
    if torch.cuda.is_available():
        assert isinstance(phase_clock(torch.device("cuda")), EventClock)


def _keep_the_gpu_busy() -> None:
    torch.cuda._sleep(100_000_000)  # cycles: at least 50 ms on any GPU clocked under 2 GHz


@cuda
def test_the_cuda_clock_times_device_work_without_synchronising(monkeypatch):
    """The host queues a long device phase, then a short one; a read-back ends the span. The first
    lap covers the device's work, not the microseconds the host took to queue it."""
    torch.cuda.synchronize()

    def no_sync(*args, **kwargs):
        raise AssertionError("timing must not synchronise")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    flag = torch.zeros(1, device="cuda")
    laps, inside, outside = _timed_span(EventClock(torch.device("cuda")), [
        _keep_the_gpu_busy,
        lambda: flag.add_(1).tolist(),  # the round's read-back
    ])
    assert len(laps) == 2 and all(lap >= 0 for lap in laps)
    assert laps[0] >= 0.04
    assert inside <= sum(laps) <= outside


@cuda
def test_a_span_with_no_read_back_waits_when_asked():
    torch.cuda.synchronize()
    clock = EventClock(torch.device("cuda"))
    clock.start()
    _keep_the_gpu_busy()
    (prefill,) = clock.stop(wait=True)
    assert prefill >= 0.04


def test_interleaved_medians_take_turns_skip_the_warmup_and_run_between_untimed():
    from specdemo.engine.clock import interleaved_medians

    order: list[str] = []
    medians = interleaved_medians({"draft": lambda: order.append("draft"), "verify": lambda: order.append("verify")},
                                  repeats=3, warmup=2, between=lambda: order.append("rollback"))
    assert order == ["draft", "verify", "rollback"] * 5
    assert set(medians) == {"draft", "verify"}
    assert all(seconds >= 0 for seconds in medians.values())


def test_interleaved_medians_are_medians_of_the_timed_turns(monkeypatch):
    from specdemo.engine import clock

    ticks = iter([0.0, 1.0, 10.0, 12.0, 20.0, 29.0])  # turn lengths 1, 2, 9: median 2
    monkeypatch.setattr(clock.time, "perf_counter", lambda: next(ticks))
    assert clock.interleaved_medians({"call": lambda: None}, repeats=3) == {"call": 2.0}
