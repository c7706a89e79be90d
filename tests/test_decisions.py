"""The trace's per-draft decision (p, q, acceptance probability, correction) is what the models say."""

import math

import pytest
import torch

import specdemo
from specdemo.engine.sampling import SamplingConfig, probabilities
from specdemo.engine.trace import COPIED

PROMPT = "w5 w6 w7 w8 w9 w10"


def _next_distributions(model, ids: list[int], start: int, vocab: int | None, config: SamplingConfig):
    """The model's filtered next-token distributions after ids[:start], ids[:start+1], … ids[:len]."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids])).logits[0, start - 1 :]
    if vocab is not None:
        logits = logits[..., :vocab]
    return probabilities(logits, config)


def _recompute(pair, result, config: SamplingConfig):
    """For each drafting round: (round, p over its positions, q over its drafts), from the models."""
    output = []
    for r in result.rounds:
        context = list(result.prompt_ids) + output
        output += r.new_tokens
        if not r.drafted:
            continue
        ids = context + r.drafted
        p = _next_distributions(pair.target, ids, len(context), pair.vocab_size, config)
        q = _next_distributions(pair.draft, ids[:-1], len(context), pair.vocab_size, config)
        yield r, p, q


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_p_q_and_acceptance_probability_are_the_models(tiny_pair, temperature):
    config = SamplingConfig(temperature, top_k=20 if temperature else 0)
    result = specdemo.generate(tiny_pair, PROMPT, method="sd", max_new_tokens=24, gamma=3, seed=3, copy_n=0,
                               temperature=temperature, top_k=config.top_k)
    checked = rejected = 0
    for r, p, q in _recompute(tiny_pair, result, config):
        assert [d.token for d in r.decisions] == r.drafted
        for i, decision in enumerate(r.decisions):
            x = decision.token
            assert decision.p == pytest.approx(float(p[i, x]), abs=1e-5)
            assert decision.q == pytest.approx(float(q[i, x]), abs=1e-5)
            if config.greedy:
                assert decision.accept_prob == (1.0 if x == int(p[i].argmax()) else 0.0)
            else:
                assert decision.accept_prob == pytest.approx(min(1.0, float(p[i, x] / q[i, x])), abs=1e-5)
            assert decision.accepted == (i < r.accepted)
            assert decision.decided == (i <= r.accepted)
            assert not decision.point_mass
            checked += 1
        if r.rejected:
            rejected += 1
            decision = r.decisions[r.accepted]
            assert decision.correction == r.next_token
            assert decision.correction_p == pytest.approx(float(p[r.accepted, r.next_token]), abs=1e-5)
            assert r.next_p == decision.correction_p
            if config.greedy:  # the target's correction is its own top token
                assert r.next_token == int(p[r.accepted].argmax())
                assert decision.accept_prob == 0.0
        elif r.next_token is not None:  # the bonus, after the last draft
            assert r.next_p == pytest.approx(float(p[len(r.drafted), r.next_token]), abs=1e-5)
        assert all(d.correction is None for i, d in enumerate(r.decisions) if i != r.accepted)
    assert checked >= 6 and rejected >= 1, (checked, rejected)


def test_greedy_accepted_drafts_are_the_targets_argmax(tiny_pair):
    result = specdemo.generate(tiny_pair, PROMPT, method="egag", max_new_tokens=24, gamma_max=4, copy_n=0)
    kept = [d for r in result.rounds for d in r.decisions if d.accepted]
    assert kept and all(d.accept_prob == 1.0 for d in kept)


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_point_mass_drafts_have_q_one_and_are_kept_with_probability_p(tiny_pair, temperature):
    config = SamplingConfig(temperature)
    prompt = "w10 w20 w30 w10 w20 w30 w10 w20"
    for method, params in (("nasd", {}), ("sd", {"copy_n": 2})):
        result = specdemo.generate(tiny_pair, prompt, method=method, max_new_tokens=20, gamma=3, seed=1,
                                   temperature=temperature, **params)
        point_rounds = [r for r in result.rounds if r.drafted and (method == "nasd" or r.source == COPIED)]
        assert point_rounds, method
        output = []
        by_index = {r.index: r for r in point_rounds}
        for r in result.rounds:
            context = list(result.prompt_ids) + output
            output += r.new_tokens
            if r.index not in by_index:
                continue
            p = _next_distributions(tiny_pair.target, context + r.drafted, len(context), tiny_pair.vocab_size, config)
            for i, decision in enumerate(r.decisions):
                assert decision.point_mass and decision.q == 1.0
                assert decision.p == pytest.approx(float(p[i, decision.token]), abs=1e-5)
                expected = (float(decision.token == int(p[i].argmax())) if config.greedy
                            else float(p[i, decision.token]))
                assert decision.accept_prob == pytest.approx(expected, abs=1e-5)


def test_ar_rounds_decide_nothing_but_keep_their_tokens_p(tiny_pair):
    result = specdemo.generate(tiny_pair, PROMPT, method="ar", max_new_tokens=5)
    assert all(r.decisions == [] for r in result.rounds)
    assert all(0.0 < r.next_p <= 1.0 and not math.isnan(r.next_p) for r in result.rounds)


def test_a_feature_heads_q_is_its_subset_distribution(tiny_pair):
    """The head's q is zero outside its vocabulary subset; a draft is always inside it, with q > 0."""
    from tests.test_feature_drafter import with_head

    subset = list(range(0, 64, 2)) + [3, 5, 7, 9]
    head_pair = with_head(tiny_pair, subset)
    result = specdemo.generate(head_pair, PROMPT, method="sd", max_new_tokens=24, gamma=3, seed=5, temperature=0.8,
                               copy_n=0)
    decisions = [d for r in result.rounds for d in r.decisions]
    assert decisions and all(d.token in subset and 0.0 < d.q <= 1.0 for d in decisions)
    assert all(d.accept_prob == pytest.approx(min(1.0, d.p / d.q), abs=1e-6) for d in decisions)


def test_a_tree_rounds_drafts_carry_the_trees_p_and_q(tiny_pair):
    """A tree round reads as a chain in the decisions: its kept path, then the first child refused,
    each with the p and q its node holds, and the target's p checked against the model."""
    config = SamplingConfig(0.0)
    result = specdemo.generate(tiny_pair, PROMPT, method="sd-tree", max_new_tokens=24, seed=0, copy_n=0)
    checked = 0
    for r, p, _ in _recompute(tiny_pair, result, config):
        assert r.tree is not None and [d.token for d in r.decisions] == r.drafted
        assert [d.accepted for d in r.decisions] == [i < r.accepted for i in range(len(r.drafted))]
        tree_p = {(parent, token): value for parent, token, value in zip(r.tree.parents, r.tree.tokens, r.tree.p)}
        parent = 0
        for i, d in enumerate(r.decisions):
            assert d.accept_prob == float(d.accepted)
            assert math.isclose(d.p, float(p[i, d.token]), rel_tol=1e-4, abs_tol=1e-6)
            assert any(math.isclose(d.p, value, rel_tol=1e-6) for (par, tok), value in tree_p.items()
                       if tok == d.token)
            checked += 1
        if r.rejected:
            assert r.decisions[r.accepted].correction == r.next_token
    assert checked > 0
