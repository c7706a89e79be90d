"""OSD as a method: an online copy of the pair's feature head drafts, learns from each finished
request off the clock, and the outputs stay the target's (greedy: AR's; sampled: its distribution)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import specdemo
from specdemo.engine.drafters import online
from specdemo.engine.runtimes import refusal
from tests.test_feature_drafter import head_pair, with_head  # noqa: F401 (a fixture)
from tests.test_lossless_sampling import joint_p_value, small_vocab_pair  # noqa: F401 (a fixture)

PROMPTS = ["w5 w6 w7 w8", "w10 w11 w12", "w5 w6 w7 w9", "w20 w21", "w5 w6 w7 w8 w9", "w30 w31 w32 w33"]


@pytest.fixture()
def fresh(head_pair):  # noqa: F811
    online.forget_online(head_pair.draft)
    yield head_pair
    online.forget_online(head_pair.draft)


def parameters(head) -> list[torch.Tensor]:
    return [p.detach().clone() for p in head.parameters()]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_osd_writes_ars_tokens_while_its_head_learns_between_requests(fresh, cache):
    loaded = parameters(fresh.draft)
    drafted = 0
    for index, prompt in enumerate(PROMPTS):
        ar = specdemo.generate(fresh, prompt, method="ar", max_new_tokens=16, cache=cache)
        ours = specdemo.generate(fresh, prompt, method="osd", max_new_tokens=16, gamma=3, copy_n=0, osd_lr=1e-2,
                                 cache=cache)
        assert ours.token_ids == ar.token_ids, f"request {index + 1}"
        assert ours.lesson.request == index + 1 and ours.lesson.tokens == len(ours.token_ids)
        drafted += ours.stats["drafted"]
    assert drafted > 0
    learnt = online.online_head(fresh.draft, fresh.target, 1e-2).head
    assert any(not torch.equal(a, b) for a, b in zip(loaded, learnt.parameters())), "the online copy learnt"
    assert all(torch.equal(a, b) for a, b in zip(loaded, fresh.draft.parameters())), "the loaded head is untouched"


def test_the_lesson_comes_after_the_last_round_and_stays_off_the_clock(fresh, monkeypatch):
    seen = {}
    learn = online.OnlineHead.learn

    def watched(self, target, ids, answer_start, steps, **kwargs):
        seen.update(rounds=len(result_box[0].rounds), seconds=result_box[0].seconds, done=result_box[0].done)
        return learn(self, target, ids, answer_start, steps, **kwargs)

    monkeypatch.setattr(online.OnlineHead, "learn", watched)
    result_box = []
    for result in specdemo.iter_generate(fresh, PROMPTS[0], method="osd", max_new_tokens=10, copy_n=0):
        result_box[:] = [result]
    assert seen == {"rounds": len(result.rounds), "seconds": result.seconds, "done": True}
    assert result.seconds == pytest.approx(result.prefill_seconds + sum(r.draft_seconds + r.verify_seconds
                                                                        for r in result.rounds))
    assert result.lesson.seconds > 0 and "not counted in tokens/s" in result.note


def test_the_stream_reports_acceptance_at_both_ends_once_it_is_long_enough(fresh):
    results = [specdemo.generate(fresh, p, method="osd", max_new_tokens=12, copy_n=0) for p in PROMPTS]
    assert "first 5 requests" not in results[4].note
    last = results[5].lesson
    assert f"first {online.STREAM_WINDOW} requests" in results[5].note
    firsts = results[:online.STREAM_WINDOW]
    drafted = sum(r.stats["drafted"] for r in firsts)
    assert last.first_acceptance == pytest.approx(sum(r.stats["accepted"] for r in firsts) / drafted)


def test_zero_steps_keep_the_head_frozen(fresh):
    before = parameters(online.online_head(fresh.draft, fresh.target, 1e-2).head)
    result = specdemo.generate(fresh, PROMPTS[0], method="osd", max_new_tokens=10, osd_steps=0, osd_lr=1e-2)
    assert result.lesson.request == 1
    assert all(torch.equal(a, b) for a, b in zip(before, online.online_head(fresh.draft, fresh.target, 1e-2).head
                                                 .parameters()))


def test_a_pair_with_a_draft_model_is_told_osd_needs_a_feature_head(tiny_pair):
    assert "feature head" in refusal(tiny_pair, "osd")
    with pytest.raises(ValueError, match="adapts the pair's feature head"):
        specdemo.generate(tiny_pair, "w1 w2", method="osd", max_new_tokens=4)


@pytest.mark.parametrize("bad, message", [({"osd_lr": 0}, "osd_lr"), ({"osd_steps": -1}, "osd_steps")])
def test_bad_learning_settings_read_as_messages(fresh, bad, message):
    with pytest.raises(ValueError, match=message):
        specdemo.generate(fresh, PROMPTS[0], method="osd", max_new_tokens=4, **bad)


def test_sampled_osd_follows_the_targets_distribution_while_its_head_learns(small_vocab_pair):  # noqa: F811
    pair = with_head(small_vocab_pair, list(range(8)))
    pair = dataclasses.replace(pair, eos_ids=small_vocab_pair.eos_ids)
    online.forget_online(pair.draft)
    try:
        p_value = joint_p_value(pair, "osd", {"temperature": 1.0, "copy_n": 0, "osd_lr": 1e-2, "osd_steps": 1},
                                samples=800)
        assert p_value > 1e-3, f"χ² p-value {p_value:.2g}"
        assert len(online.online_head(pair.draft, pair.target, 1e-2).lessons) == 800
    finally:
        online.forget_online(pair.draft)


def test_a_benchmarks_clock_leaves_the_learning_out(fresh, monkeypatch):
    from specdemo.bench.measure import runners

    real = runners.generate

    def slow_lesson(*args, **kwargs):
        result = real(*args, **kwargs)
        result.lesson.seconds = 2.0  # as if learning had taken two seconds, inside the timed call
        result.compile_seconds = 0.5
        return result

    monkeypatch.setattr(runners, "generate", slow_lesson)
    run = runners.run_ours(fresh, "osd", [5, 6, 7, 8], {"max_new_tokens": 6, "copy_n": 0}, seed=0)
    assert run.result.off_clock_seconds == 2.5
    assert -2.5 <= run.seconds < -2.0  # the call's wall time less both: the decode's own seconds, minus 2.5
