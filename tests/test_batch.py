"""A batch of requests: one target forward a round for every row, and each row exactly what it would
be alone — greedy rows equal batch-1 AR, sampled rows follow the target's distribution, and no row
depends on the strangers it shares the batch with."""

import dataclasses

import pytest
import torch

import specdemo
from specdemo.engine.batch import generate_batch
from specdemo.engine.params import DecodeParams
from specdemo.engine.runtimes import runtime_named
from specdemo.engine.sampling import SamplingConfig, probabilities
from specdemo.engine.targets.batched import BatchedLM
from specdemo.models.torch_copy import TORCH_COPY, pair_for
from tests.chi2 import pooled_chisquare
from tests.tiny import build_tiny_pair

CHAIN_METHODS = ["ar", "sd", "egag", "nasd", "rest", "adaedl", "egag-token"]
MAX_NEW = 40


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("batch"), draft_noise=0.3)


def ar_alone(pair, prompt, max_new_tokens=MAX_NEW):
    return specdemo.generate(pair, prompt, "ar", max_new_tokens=max_new_tokens, temperature=0.0).token_ids


@pytest.fixture(scope="module")
def ragged_prompts(pair):
    """Prompts of different lengths whose greedy answers end at different points: two stop at the EOS
    (at different lengths), the others run to the limit."""
    generator = torch.Generator().manual_seed(0)
    stopping, running = {}, []
    for _ in range(300):
        prompt = torch.randint(3, 64, (int(torch.randint(1, 12, (1,), generator=generator)),),
                               generator=generator).tolist()
        n = len(ar_alone(pair, prompt))
        if n < MAX_NEW and n not in stopping and len(stopping) < 2:
            stopping[n] = prompt
        elif n == MAX_NEW and len(running) < 3 and len(prompt) not in {len(p) for p in running}:
            running.append(prompt)
        if len(stopping) == 2 and len(running) == 3:
            return [running[0], stopping[min(stopping)], running[1], stopping[max(stopping)], running[2]]
    pytest.fail("no prompts with ragged greedy answers found")


@pytest.mark.parametrize("method", CHAIN_METHODS)
def test_greedy_rows_equal_ar_alone(pair, ragged_prompts, method):
    rows = generate_batch(pair, ragged_prompts, method, max_new_tokens=MAX_NEW, temperature=0.0)
    assert [r.token_ids for r in rows] == [ar_alone(pair, p) for p in ragged_prompts]
    assert [r.batch_row for r in rows] == list(range(len(ragged_prompts)))
    assert {r.stats["batch"] for r in rows} == {len(ragged_prompts)}
    assert sorted({r.stop_reason for r in rows}) == ["eos", "max_new_tokens"]


def test_drafting_rows_accept_apart(pair, ragged_prompts):
    rows = generate_batch(pair, ragged_prompts, "sd", max_new_tokens=MAX_NEW, temperature=0.0, copy_n=0)
    accepted = [[r.accepted for r in row.rounds] for row in rows]
    assert len({tuple(a) for a in accepted}) > 1
    assert all(row.stats["drafted"] > 0 for row in rows)


def test_a_finished_row_leaves_the_batch(pair, ragged_prompts):
    rows = generate_batch(pair, ragged_prompts, "ar", max_new_tokens=MAX_NEW, temperature=0.0)
    short = min(rows, key=lambda r: len(r.token_ids))
    assert short.stop_reason == "eos"
    assert short.target_forwards == len(short.rounds) < max(r.target_forwards for r in rows)


def test_a_row_does_not_depend_on_its_batch_mates(pair):
    """The same prompt at the same place, among two different sets of strangers, sampled with the same seed."""
    prompt = [5, 9, 11, 12]
    params = dict(max_new_tokens=MAX_NEW, temperature=1.0, seed=7, copy_n=0)
    first = generate_batch(pair, [[30, 31], prompt, [7] * 11], "sd", **params)[1]
    second = generate_batch(pair, [[40, 41, 42, 43, 44, 45, 46], prompt, [8, 9]], "sd", **params)[1]
    assert first.token_ids == second.token_ids
    assert [r.accepted for r in first.rounds] == [r.accepted for r in second.rounds]


def test_rows_time_from_the_batch_start(pair, ragged_prompts):
    rows = generate_batch(pair, ragged_prompts, "sd", max_new_tokens=MAX_NEW, temperature=0.0)
    for row in rows:
        ends = [r.end_seconds for r in row.rounds]
        assert ends == sorted(ends) and row.seconds == pytest.approx(ends[-1])
        assert row.prefill_seconds == rows[0].prefill_seconds  # one prefill for all
        assert row.stats["ttft_s"] == ends[0]
        assert sum(r.draft_seconds + r.verify_seconds for r in row.rounds) + row.prefill_seconds == pytest.approx(row.seconds)
    assert max(r.seconds for r in rows) == pytest.approx(max(r.rounds[-1].end_seconds for r in rows))


def test_one_prompt_is_the_single_request_path(pair):
    (row,) = generate_batch(pair, [[5, 9, 11]], "sd", max_new_tokens=12, temperature=0.0)
    assert row.token_ids == ar_alone(pair, [5, 9, 11], 12)
    assert (row.batch_size, row.batch_row, row.stats["batch"]) == (1, 0, 1)


@pytest.mark.parametrize("method, message", [("sd-tree", "tree"), ("beam", "one request"),
                                             ("ar-nocache", "one request")])
def test_methods_that_cannot_batch_are_refused(pair, method, message):
    with pytest.raises(ValueError, match=message):
        generate_batch(pair, [[5, 9], [6, 7]], method, max_new_tokens=8)


@pytest.mark.parametrize("prompts, message", [([], "at least one prompt"), ([[5, 9], "   "], "prompt 2 of 2: prompt is empty"),
                                              ([[5, 9], [6, 7]], "target_kv")])
def test_bad_input_is_refused_before_decoding(pair, prompts, message):
    extra = dict(target_kv="streaming") if message == "target_kv" else {}
    with pytest.raises(ValueError, match=message):
        generate_batch(pair, prompts, "sd", max_new_tokens=8, **extra)


def test_the_runtime_that_rewinds_rows_together_runs_a_batch_on_the_torch_copy(pair):
    assert "rewinds every row of a batch together" in runtime_named("onnx").reason(batch=True)
    assert runtime_named("torch").reason(batch=True) is None
    stand_in = type("RuntimeTarget", (), {"eos_ids": pair.eos_ids, "precision": "float32"})()
    as_if_on_runtime = dataclasses.replace(pair, runtime="onnx", target_runtime=stand_in)
    runs_on, why = pair_for(as_if_on_runtime, "sd", DecodeParams(), batch=True)
    assert runs_on.target_runtime is None and runs_on.runtime == "torch"
    assert why.startswith(f"on the {TORCH_COPY} of the target") and "batch" in why
    with pytest.raises(ValueError, match="rewinds every row"):
        generate_batch(as_if_on_runtime, [[5, 9], [6, 7]], "sd", max_new_tokens=4)


def test_holes_are_compacted_without_changing_a_row(pair):
    """Rolled-back slots stay as holes until the cache gathers each row's live slots to the front."""
    target = BatchedLM(pair.target, 2, pair.vocab_size)
    with torch.inference_mode():
        target.prefill({0: [5, 6, 7], 1: [8]})
        drafts = torch.tensor([9, 10, 11])
        target.forward({0: ([5, 6, 7, 8], drafts), 1: ([8, 9], drafts[:1])}, {0: 4, 1: 2})
        before, _ = target.forward({0: [5, 6, 7, 8, 12], 1: [8, 9, 13]}, {0: 1, 1: 1})
        holes = target.live.shape[1] - max(len(target.slots[r]) for r in target.members)
        assert holes > 0
        target.compact()
        assert target.live.shape[1] == max(len(target.slots[r]) for r in target.members)
        for row in (0, 1):  # roll the last token back and feed it again: the same logits from the compacted cache
            sequence = target.cached_ids[row][:-1]
            target.forward({row: sequence + [target.cached_ids[row][-1]]}, {row: 1})
        after, _ = target.forward({0: [5, 6, 7, 8, 12], 1: [8, 9, 13]}, {0: 1, 1: 1})
    for row in (0, 1):
        torch.testing.assert_close(before[row], after[row])


# Under sampling: two prompts of different lengths, each repeated, every row its own seed (seed + row).
SAMPLED_PROMPTS = ([3, 4, 5, 3, 4, 5, 3, 4], [6, 7])
SAMPLED_ROWS = 500


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    pair = build_tiny_pair(tmp_path_factory.mktemp("vocab8"), vocab=8, head_scale=1.5, draft_noise=0.6,
                           hidden=32, layers=1)
    return dataclasses.replace(pair, eos_ids=frozenset({10_000}))


def exact_joint(pair, prompt, config: SamplingConfig) -> torch.Tensor:
    with torch.inference_mode():
        first = probabilities(pair.target(input_ids=torch.tensor([prompt])).logits[0, -1], config)
        joint = torch.zeros(8, 8)
        for t1 in range(8):
            if first[t1] > 0:
                joint[t1] = first[t1] * probabilities(pair.target(input_ids=torch.tensor([prompt + [t1]])).logits[0, -1], config)
    return joint


@pytest.mark.parametrize("method, sampling", [("sd", dict(temperature=1.0, copy_n=0)),
                                              ("egag", dict(temperature=0.8, top_k=5, copy_n=0)),
                                              ("nasd", dict(temperature=1.0))])
def test_sampled_rows_follow_the_target_distribution(small_vocab_pair, method, sampling):
    prompts = [SAMPLED_PROMPTS[i % 2] for i in range(2 * SAMPLED_ROWS)]
    rows = generate_batch(small_vocab_pair, prompts, method, max_new_tokens=2, seed=11, **sampling)
    config = SamplingConfig(**{k: v for k, v in sampling.items() if k != "copy_n"})
    for which, prompt in enumerate(SAMPLED_PROMPTS):
        counts = torch.zeros(8, 8)
        for row in rows[which::2]:
            counts[row.token_ids[0], row.token_ids[1]] += 1
        expected = exact_joint(small_vocab_pair, prompt, config) * SAMPLED_ROWS
        assert pooled_chisquare(counts.flatten(), expected.flatten()) > 1e-3, f"prompt {which}"


@pytest.mark.slow
def test_the_embedded_pair_batch_of_four_equals_ar_alone(embedded_pair):
    """Prompts of different lengths whose answers end at different points (three at the EOS, one at the limit)."""
    prompts = ["Write a haiku about caches.", "What is 17 times 23? Answer with the number only.",
               "Explain in three sentences why the sky is blue, for a child.", "Say hi."]
    # Alone, the answers end at the EOS after 22, 12 and 24 tokens and at the limit: the longest row runs its
    # last 8 tokens with every other slot of the batch finished (64 new tokens ran 40, for nothing more).
    params = dict(max_new_tokens=32, temperature=0.0, chat=True)
    alone = [specdemo.generate(embedded_pair, p, "ar", **params).token_ids for p in prompts]
    lengths = sorted(len(a) for a in alone)
    assert len(set(lengths)) == len(prompts) and lengths[-1] == params["max_new_tokens"] >= lengths[-2] + 8
    for method in ("sd", "egag", "nasd"):
        rows = generate_batch(embedded_pair, prompts, method, **params)
        assert [r.token_ids for r in rows] == alone, method
