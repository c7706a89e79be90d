"""Where and why a per-token policy stopped a round early: in the trace."""

from __future__ import annotations

import dataclasses

import pytest

import specdemo
from specdemo.engine import methods
from specdemo.engine.trace import StopNote

# The tiny draft's normalised entropy sits near 0.8, so at these thresholds some rounds stop after
# one or two drafts and others run to γ_max = 3 (and the last one to the room left in the output).
STOPPING = [
    ("egag-token", dict(entropy_stop=0.8)),
    ("adaedl", dict(adaedl_lambda=0.42)),
]


def run_keeping_policy(pair, method: str, params: dict, monkeypatch):
    """A greedy run of `method` and the policy that drafted it."""
    spec = methods.METHODS[method]
    built = []

    def build(pair_, decode):
        drafter, policy = spec.build(pair_, decode)
        built.append(policy)
        return drafter, policy

    monkeypatch.setitem(methods.METHODS, method, dataclasses.replace(spec, build=build))
    result = specdemo.generate(pair, "w5 w6 w7 w8", method=method, max_new_tokens=40, gamma_max=3, copy_n=0,
                               **params)
    (policy,) = built
    return result, policy


@pytest.fixture(scope="module", params=STOPPING, ids=[m for m, _ in STOPPING])
def stopped_run(request, tiny_pair):
    method, params = request.param
    with pytest.MonkeyPatch.context() as monkeypatch:
        return run_keeping_policy(tiny_pair, method, params, monkeypatch)


def test_each_round_records_the_note_its_policy_kept(stopped_run):
    result, policy = stopped_run
    assert [r.early_stop for r in result.rounds] == policy.stops
    stopped = [r for r in result.rounds if r.early_stop is not None]
    assert stopped and len(stopped) < len(result.rounds), "some rounds stopped early and some did not"
    for r in stopped:
        note = r.early_stop
        assert isinstance(note, StopNote) and note.rule == policy.rule and note.threshold == policy.threshold
        assert note.position == len(r.drafted) < r.gamma, "it stopped before the draft it did not make"


def test_a_round_without_a_note_ran_to_its_cap(stopped_run):
    result, _ = stopped_run
    for r in result.rounds:
        if r.early_stop is None:
            room = 40 - sum(len(x.new_tokens) for x in result.rounds[: r.index]) - 1
            assert len(r.drafted) == min(r.gamma, room), r


@pytest.mark.parametrize("method", ["sd", "egag", "nasd"])
def test_policies_without_a_per_token_stop_record_none(tiny_pair, method):
    result = specdemo.generate(tiny_pair, "w5 w6 w7 w8", method=method, max_new_tokens=16)
    assert result.rounds and all(r.early_stop is None for r in result.rounds)
