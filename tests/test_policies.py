"""specdemo.engine.drafters.policies: how γ is chosen each round."""

import pytest

from specdemo.engine.drafters.policies import ConfidenceStop, StopNote, EntropyGamma, FixedGamma, HeuristicGamma, gamma_from_entropy


@pytest.mark.parametrize(
    "entropy, expected",
    [(0.0, 6), (0.1, 5), (0.5, 3), (0.51, 2), (0.9, 1), (1.0, 1)],
)
def test_egag_maps_entropy_to_floor_of_confidence_times_gamma_max(entropy, expected):
    assert gamma_from_entropy(entropy, gamma_min=1, gamma_max=6) == expected


def test_egag_clamps_to_gamma_min():
    assert gamma_from_entropy(0.95, gamma_min=2, gamma_max=6) == 2


def test_egag_smooths_entropy_with_an_ema_seeded_by_the_first_round():
    policy = EntropyGamma(gamma_min=1, gamma_max=10, ema=0.5)
    assert policy.round_gamma(0.2) == 8  # Ĥ1 = H1 = 0.2
    assert policy.round_gamma(0.6) == 6  # Ĥ2 = 0.5·0.2 + 0.5·0.6 = 0.4
    assert policy.smoothed == pytest.approx(0.4)
    assert policy.round_gamma(0.0) == 8  # Ĥ3 = 0.2


def test_egag_without_smoothing_follows_each_round():
    policy = EntropyGamma(gamma_min=1, gamma_max=10, ema=0.0)
    assert [policy.round_gamma(h) for h in (0.05, 0.75, 0.3)] == [9, 2, 7]


def test_fixed_gamma_never_changes():
    policy = FixedGamma(4)
    policy.update(4, 0)
    assert policy.round_gamma(None) == 4


def test_heuristic_schedule_adds_two_after_a_full_accept_and_drops_one_otherwise():
    policy = HeuristicGamma(4)
    policy.update(4, 4)
    assert policy.round_gamma(None) == 6
    policy.update(6, 2)
    assert policy.round_gamma(None) == 5
    for _ in range(10):
        policy.update(5, 0)
    assert policy.round_gamma(None) == 1


def test_confidence_stop_drafts_while_the_drafter_is_sure():
    policy = ConfidenceStop(gamma_max=8, threshold=0.4)
    assert policy.needs_token_stats and not policy.reads_first_token  # asked before each draft after the first
    assert policy.round_gamma(None) == 8
    assert policy.keep_drafting(entropy=0.1, top_prob=0.9, position=1)
    assert not policy.keep_drafting(entropy=0.8, top_prob=0.2, position=2)
    assert policy.early_stop() == StopNote("top probability", 0.2, 0.4, 2)
