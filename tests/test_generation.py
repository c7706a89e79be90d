"""The training data's one generation loop (specdemo/training/generation.py): prompts answered
together, each as the target would answer it alone, with what distillation and a feature
draft read kept from the same forward."""

from __future__ import annotations

import torch

from specdemo.training.generation import answer_all, answer_batch

PREFIXES = [[1, 5, 9, 12, 7], [1, 30], [1, 44, 21, 8, 8, 3, 17, 60, 11]]


def greedy_alone(model, prefix: list[int], steps: int, stops: set[int]) -> list[int]:
    """The target's greedy answer to one unpadded prefix, a full forward per token."""
    ids = list(prefix)
    for _ in range(steps):
        with torch.no_grad():
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        if token in stops:
            break
    return ids[len(prefix):]


def options(pair, **more):
    return dict(max_new_tokens=10, stops=set(pair.eos_ids), pad_id=0, **more)


def test_prompts_answered_together_get_the_answers_each_gets_alone(tiny_pair):
    answers = answer_batch(tiny_pair.target, PREFIXES, **options(tiny_pair))
    for prefix, answer in zip(PREFIXES, answers):
        assert answer.tokens == greedy_alone(tiny_pair.target, prefix, 10, set(tiny_pair.eos_ids))


def test_each_answer_step_keeps_the_targets_top_k_at_temperature_one(tiny_pair):
    answer = answer_batch(tiny_pair.target, PREFIXES[:1], topk=4, **options(tiny_pair))[0]
    assert answer.top_ids.shape == answer.top_logp.shape == (len(answer.tokens), 4)
    assert answer.top_ids[:, 0].tolist() == answer.tokens  # greedy: the most likely token is the one taken
    with torch.no_grad():
        logits = tiny_pair.target(input_ids=torch.tensor([PREFIXES[0]])).logits[0, -1]
    expected = torch.log_softmax(logits.float(), -1).topk(4)
    assert answer.top_ids[0].tolist() == expected.indices.tolist()
    assert torch.allclose(answer.top_logp[0].float(), expected.values, atol=1e-2)  # stored in half precision


def test_features_are_the_final_hidden_state_at_every_fed_position(tiny_pair):
    answers = answer_batch(tiny_pair.target, PREFIXES, **options(tiny_pair))
    hidden = tiny_pair.target.config.hidden_size
    for prefix, answer in zip(PREFIXES, answers):
        fed = prefix + answer.tokens[:-1]
        assert answer.features.shape == (len(fed), hidden)
        with torch.no_grad():
            alone = tiny_pair.target.get_decoder()(input_ids=torch.tensor([fed])).last_hidden_state[0]
        assert torch.allclose(answer.features.float(), alone.float(), atol=1e-2)
    assert all(a.features is None for a in answer_batch(tiny_pair.target, PREFIXES, features=False,
                                                         **options(tiny_pair)))


def test_answer_all_batches_by_length_and_returns_the_answers_in_the_prompts_order(tiny_pair):
    prefixes = PREFIXES * 2 + [[1, 3]]
    together = answer_all(tiny_pair.target, prefixes, batch=2, features=False, **options(tiny_pair))
    assert [a.tokens for a in together] == [a.tokens for a in answer_batch(tiny_pair.target, prefixes,
                                                                            **options(tiny_pair))]


def test_sampled_answers_follow_the_generator(tiny_pair):
    def sampled(seed):
        generator = torch.Generator().manual_seed(seed)
        return [a.tokens for a in answer_batch(tiny_pair.target, PREFIXES, temperature=1.0, generator=generator,
                                               features=False, **options(tiny_pair))]

    assert sampled(3) == sampled(3)
    assert any(sampled(seed) != sampled(3) for seed in range(4, 8))
