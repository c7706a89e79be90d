"""specdemo.engine.sampling: distributions, entropy and verification, checked with statistics."""

import math

import pytest
import torch
from scipy.stats import chisquare

from specdemo.engine.sampling import SamplingConfig, normalized_entropy, probabilities, verify_on_device

# Ten times what the bugs need: with 400 draws, over eight generator seeds, a correction redrawn
# from p (test_a_correction_redrawn_from_p_would_be_caught) still gives p ≤ 2e-15 against its 1e-6,
# mutant M2 (the same bug with a model draft) p ≤ 2e-7 against 1e-3, and mutants M4 and M5
# p < 1e-300; at 4,000 all of them are below 1e-300.
SAMPLES = 4000


def _distribution(values):
    return torch.tensor(values, dtype=torch.float32)


def test_greedy_probabilities_are_the_plain_softmax():
    logits = torch.tensor([1.0, 2.0, 0.5])
    assert torch.allclose(probabilities(logits, SamplingConfig(0.0, top_k=1)), torch.softmax(logits, -1))


def test_temperature_top_k_and_top_p_follow_their_definitions():
    logits = torch.log(_distribution([0.5, 0.25, 0.15, 0.1]))
    assert torch.allclose(probabilities(logits, SamplingConfig(1.0)), _distribution([0.5, 0.25, 0.15, 0.1]))
    top2 = probabilities(logits, SamplingConfig(1.0, top_k=2))
    assert torch.allclose(top2, _distribution([2 / 3, 1 / 3, 0, 0]))
    # top_p 0.7: 0.5 alone is short of 0.7, 0.5 + 0.25 reaches it.
    nucleus = probabilities(logits, SamplingConfig(1.0, top_p=0.7))
    assert torch.allclose(nucleus, _distribution([2 / 3, 1 / 3, 0, 0]))
    # The top token always survives, however small top_p.
    assert probabilities(logits, SamplingConfig(1.0, top_p=0.01))[0] == 1.0
    hot = probabilities(logits, SamplingConfig(2.0))
    expected = torch.softmax(logits / 2.0, -1)
    assert torch.allclose(hot, expected)


def test_normalized_entropy_spans_zero_to_one():
    assert float(normalized_entropy(_distribution([1, 0, 0, 0]))) == pytest.approx(0.0)
    assert float(normalized_entropy(_distribution([0.25] * 4))) == pytest.approx(1.0)
    half = float(normalized_entropy(_distribution([0.5, 0.5, 0, 0])))
    assert half == pytest.approx(math.log(2) / math.log(4))


def test_greedy_verification_keeps_the_argmax_prefix_and_returns_the_argmax():
    # The chain round's own rule (`verify_on_device`): (accepted, next token) on the device.
    # argmax at each position: 2, 0, 1, then 3 after the last draft.
    target = torch.tensor([[0, 1, 5, 0], [5, 0, 0, 1], [0, 5, 1, 0], [0, 0, 1, 5]], dtype=torch.float32)
    config = SamplingConfig(0.0)
    assert verify_on_device(target, torch.tensor([2, 0, 1]), None, config).tolist() == [3, 3]
    assert verify_on_device(target, torch.tensor([2, 3, 1]), None, config).tolist() == [1, 0]
    assert verify_on_device(target, torch.tensor([1, 0, 1]), None, config).tolist() == [0, 2]
    assert verify_on_device(target[:1], torch.tensor([], dtype=torch.long), None, config).tolist() == [0, 2]


P = _distribution([0.4, 0.3, 0.2, 0.1, 0.0])
Q = _distribution([0.1, 0.2, 0.3, 0.2, 0.2])
P_NEXT = _distribution([0.05, 0.15, 0.2, 0.3, 0.3])


def _first_token_counts(draw_round, samples=SAMPLES):
    generator = torch.Generator().manual_seed(1234)
    counts = torch.zeros(5)
    for _ in range(samples):
        counts[draw_round(generator)] += 1
    return counts


def _model_round(generator):
    draft = torch.multinomial(Q, 1, generator=generator)
    accepted, next_token = verify_on_device(torch.stack([P, P_NEXT]), draft, Q.unsqueeze(0), SamplingConfig(1.0), generator).tolist()
    return int(draft) if accepted else next_token


def _point_mass_round(generator, draft_token=0):
    accepted, next_token = verify_on_device(torch.stack([P, P_NEXT]), torch.tensor([draft_token]), None, SamplingConfig(1.0), generator).tolist()
    return draft_token if accepted else next_token


def _assert_distributed_as(counts, expected):
    support = expected > 0
    assert counts[~support].sum() == 0, "a token with zero target probability was emitted"
    _, p_value = chisquare(counts[support].numpy(), (expected[support] * counts.sum()).numpy())
    assert p_value > 1e-3, f"output frequencies {counts / counts.sum()} differ from p {expected} (p={p_value:.2g})"


def test_model_draft_verification_samples_exactly_from_p():
    _assert_distributed_as(_first_token_counts(_model_round), P)


@pytest.mark.parametrize("draft_token", [0, 3, 4])
def test_point_mass_verification_samples_exactly_from_p(draft_token):
    counts = _first_token_counts(lambda g: _point_mass_round(g, draft_token))
    _assert_distributed_as(counts, P)


def test_a_correction_redrawn_from_p_would_be_caught():
    """The bug of several NASD implementations: on rejection, sample from p again.
    The test above must be able to see it, or it proves nothing."""

    def biased_round(generator):
        accepted, next_token = verify_on_device(torch.stack([P, P_NEXT]), torch.tensor([0]), None, SamplingConfig(1.0), generator).tolist()
        return 0 if accepted else int(torch.multinomial(P, 1, generator=generator))

    counts = _first_token_counts(biased_round)
    _, p_value = chisquare(counts[:4].numpy(), (P[:4] * counts.sum()).numpy())
    assert p_value < 1e-6


def test_bonus_token_is_sampled_from_the_next_position_when_every_draft_is_kept():
    target = torch.stack([_distribution([0, 1, 0, 0, 0]), P_NEXT])
    generator = torch.Generator().manual_seed(7)
    counts = torch.zeros(5)
    for _ in range(SAMPLES // 2):
        accepted, next_token = verify_on_device(target, torch.tensor([1]), _distribution([0, 1, 0, 0, 0]).unsqueeze(0), SamplingConfig(1.0), generator).tolist()
        assert accepted == 1
        counts[next_token] += 1
    _assert_distributed_as(counts, P_NEXT)
