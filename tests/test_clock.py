"""specdemo.engine.clock: a span's phases add up to its wall time, and timing never waits for a GPU."""

import time

import pytest
import torch

from specdemo.engine.clock import EventClock, WallClock, phase_clock

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _timed_span(clock, phases):
    """Run `phases` (callables) as one span; return the laps and the wall time around it."""
    before = time.perf_counter()
    clock.start()
    for i, phase in enumerate(phases):
        if i:
            clock.lap()
        phase()
    laps = clock.stop()
    return laps, time.perf_counter() - before


def test_the_cpu_clock_laps_add_up_to_the_wall_time():
    laps, wall = _timed_span(WallClock(), [lambda: time.sleep(0.02), lambda: time.sleep(0.01), lambda: None])
    assert len(laps) == 3
    assert laps[0] >= 0.02 and laps[1] >= 0.01 and laps[2] < 0.01
    assert 0.03 <= sum(laps) <= wall


def test_a_clock_starts_afresh_at_every_span():
    clock = WallClock()
    _timed_span(clock, [lambda: time.sleep(0.01)])
    laps, _ = _timed_span(clock, [lambda: None, lambda: None])
    assert len(laps) == 2 and sum(laps) < 0.01


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
    laps, wall = _timed_span(EventClock(torch.device("cuda")), [
        _keep_the_gpu_busy,
        lambda: flag.add_(1).tolist(),  # the round's read-back
    ])
    assert laps[0] >= 0.04
    assert sum(laps) == pytest.approx(wall, abs=0.005)


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
