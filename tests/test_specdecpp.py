"""SpecDec++: the stopping rule, the acceptance head's training and files, and losslessness."""

import pandas as pd
import pytest
import torch

import specdemo
from specdemo.engine.drafters.acceptance_head import (DEFAULT_HEAD, FEATURES, AcceptanceHead, load_acceptance_head,
                                             round_features)
from specdemo.engine.drafters.policies import PredictedRejectionStop
from specdemo.engine.trace import DraftDecision, Round
from specdemo.training.specdecpp import auc, evaluate, round_examples, split, train_head
from specdemo.training.specdecpp_card import card_text
from tests.test_lossless_sampling import DRAFT_MODEL_SAMPLES, far_draft_pair, joint_p_value  # noqa: F401 (a fixture)


class ConstantHead:
    def __init__(self, reject: float):
        self.reject = reject
        self.seen = []

    def reject_probability(self, features):
        self.seen.append(features)
        return self.reject


def test_the_round_stops_before_the_draft_that_lifts_any_rejection_above_the_threshold():
    head = ConstantHead(0.2)  # P(any rejection through position i) = 1 − 0.8^(i+1): 0.2, 0.36, 0.488, 0.59
    policy = PredictedRejectionStop(8, head, round_features, threshold=0.5)
    assert policy.round_gamma(None) == 8 and policy.reads_first_token
    assert [policy.keep_drafting(0.1, 0.9, position=i, last_q=0.9 if i else None) for i in range(4)] == [
        True, True, True, False]
    note = policy.stops[-1]
    assert note.position == 3 and note.value == pytest.approx(1 - 0.8**4) and note.rule == "predicted rejection"
    policy.round_gamma(None)  # a new round starts from certainty again
    assert policy.keep_drafting(0.1, 0.9, position=0) and policy.kept == pytest.approx(0.8)


def test_the_head_reads_the_rounds_lowest_top_probability_so_far():
    head = ConstantHead(0.0)
    policy = PredictedRejectionStop(8, head, round_features)
    policy.round_gamma(None)
    for i, top in enumerate((0.9, 0.4, 0.7)):
        policy.keep_drafting(0.2, top, position=i, last_q=None)
    assert [f[FEATURES.index("min_top_prob")] for f in head.seen] == [0.9, 0.4, 0.4]


def _round(qs, accepted, entropies):
    decisions = [DraftDecision(t, q, 0.5, 1.0, i < accepted, decided=i <= accepted) for i, (t, q) in
                 enumerate(zip(range(len(qs)), qs))]
    return Round(0, len(qs), None, list(range(len(qs))), accepted, 7, entropies, 0.0, 0.0, 0.0, decisions=decisions)


def test_examples_are_the_decided_drafts_with_the_hooks_features():
    examples = round_examples(_round([0.9, 0.6, 0.8, 0.5], accepted=1, entropies=[0.1, 0.3, 0.2, 0.4]))
    assert [e["rejected"] for e in examples] == [0, 1]  # the third and fourth were never decided
    assert [e["last_q"] for e in examples] == [1.0, 0.9]
    assert examples[1]["position"] == 1 and examples[1]["min_top_prob"] == 0.6 and examples[1]["entropy"] == 0.3


def _synthetic(n=600, seed=0):
    g = torch.Generator().manual_seed(seed)
    entropy = torch.rand(n, generator=g)
    rejected = (torch.rand(n, generator=g) < entropy).int()
    rows = [dict(zip(FEATURES, round_features(float(h), float(1 - h), i % 6, None, float(1 - h))), rejected=int(r),
                 request=i // 5) for i, (h, r) in enumerate(zip(entropy, rejected))]
    return pd.DataFrame(rows)


def test_the_head_learns_what_predicts_rejection_and_survives_a_round_trip(tmp_path):
    train, heldout = split(_synthetic())
    assert not set(train.request) & set(heldout.request)
    head = train_head(train, hidden=8, steps=300)
    report = evaluate(head, heldout)
    assert report["auc"] > 0.7 and report["log_loss"] < report["constant_log_loss"]
    head.save(tmp_path / "head", recipe={})
    loaded = load_acceptance_head(tmp_path / "head")
    features = round_features(0.3, 0.7, 2, 0.8, 0.6)
    assert loaded.reject_probability(features) == pytest.approx(head.reject_probability(features))
    with pytest.raises(ValueError, match="python -m specdemo.training.specdecpp"):
        load_acceptance_head(tmp_path / "nothing")


def test_auc_counts_ties_as_half():
    assert auc(pd.Series([0.1, 0.9, 0.5, 0.5]), pd.Series([0, 1, 0, 1])) == pytest.approx(0.875)


def test_the_shipped_head_loads_and_its_card_reports_it():
    head = load_acceptance_head()
    assert sum(p.numel() for p in head.parameters()) < 10_000
    card = (DEFAULT_HEAD / "README.md").read_text(encoding="utf-8")
    assert "## Evaluation" in card and "python -m specdemo.training.specdecpp" in card


def test_the_card_is_made_from_the_numbers():
    values = dict(examples=10, rejected_share=0.3, log_loss=0.5, constant_log_loss=0.6, auc=0.7, entropy_auc=0.65)
    recipe = dict(parameters=2737, pair="embedded", gamma=8, requests=5, pool=9, request_seed=1, max_new_tokens=16,
                  steps=10, train_seconds=1.0)
    text = card_text(recipe, {"train": values, "heldout": values})
    assert "A 2,737-parameter MLP" in text and "| held-out | 10 | 0.300 | 0.500 | 0.600 | 0.700 | 0.650 |" in text


@pytest.fixture(scope="module")
def random_head(tmp_path_factory):
    """A head whose predictions depend on the position, so rounds stop at several lengths."""
    torch.manual_seed(0)
    head = AcceptanceHead(8)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.5)
        head.net[-1].bias.fill_(-1.5)
    return str(head.save(tmp_path_factory.mktemp("specdecpp") / "head", recipe={}))


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_output_is_exactly_ars(tiny_pair, random_head, cache):
    short = 0
    for prompt in ("w5 w6 w7 w8", [1, 40, 41, 42, 43], "w10 w20 w30 w10 w20 w30"):
        reference = specdemo.generate(tiny_pair, prompt, method="ar", max_new_tokens=40, cache=cache).token_ids
        for threshold, copy_n in ((0.3, 0), (0.7, 0), (0.5, 4)):
            result = specdemo.generate(tiny_pair, prompt, method="specdecpp", max_new_tokens=40, gamma_max=6,
                                       copy_n=copy_n, specdecpp_threshold=threshold, specdecpp_head=random_head,
                                       cache=cache)
            assert result.token_ids == reference, (prompt, threshold, copy_n)
            short += sum(0 < len(r.drafted) < r.gamma for r in result.rounds if r.source != "copy")
    assert short


# A correction redrawn from p (mutant M2) fails this at 600 runs on far_draft_pair in every block of seeds
# tried (0-599, 600-1199, 1200-1799): p-values 1.5e-10, 2.5e-14, 1.1e-11. Its rounds stop after one draft,
# as on the former pair; 51-53 % of the first rounds keep it and draw the bonus token, the rest a correction.
def test_sampling_follows_the_target_distribution(far_draft_pair, random_head):  # noqa: F811
    params = dict(temperature=1.0, copy_n=0, specdecpp_threshold=0.4, specdecpp_head=random_head)
    p_value = joint_p_value(far_draft_pair, "specdecpp", params, DRAFT_MODEL_SAMPLES)
    assert p_value > 1e-3, f"χ² p-value {p_value:.2g}"
