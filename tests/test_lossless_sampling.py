"""Under sampling, SD, NASD and EGAG draw from the target's own distribution.

On an 8-token model, the first two generated tokens of many seeded runs are compared
with the exact joint distribution p(t1)·p(t2 | t1) by a χ² test (on the dynamic cache;
the static cache is held to the dynamic one's draws seed by seed).
"""

import dataclasses

import pytest
import torch

import specdemo
from specdemo.engine.sampling import SamplingConfig, probabilities
from specdemo.models.loading import load_pair
from tests.chi2 import pooled_chisquare
from tests.tiny import build_tiny_pair, write_model, write_tokenizer

SAMPLES = 1200
# Drafts that are point masses (NASD's table, REST's datastore) run half as many: a correction redrawn
# from p moves their joint far more than a draft model's, so 600 runs still catch it by a wide margin
# (test_a_biased_correction_token_would_fail_this_test: NASD's p-value ≤ 2e-12 over five blocks of 600
# seeds, ≤ 4e-20 with top-p 0.8).
POINT_MASS_SAMPLES = 600
# A draft model's cases run on `far_draft_pair`, whose q lies far enough from p that the same bug, put in
# the engine as mutant M2 (tests/mutations.py), fails every such case here at 600 runs: p-values 1.1e-14,
# 6e-22, 1.4e-26 (seeds 0-599, 600-1199, 1200-1799) for SD and EGAG, 7e-45, 2.8e-37, 0 for SD with top-k 3,
# 1.8e-30, 6.8e-34, 4.6e-42 for EGAG with top-k and top-p, 1.1e-14, 3.4e-10, 4.7e-12 for EGAG after copied
# rounds.
# (On the former pair, a near copy of a flat target, SD gave 0.12 at 600.) SD with copying (copy_n=4) copies
# the first round, so its draft model drafts only after a refused copy, and only the second token shows the bug:
# at temperature 1.0 it gave 3.5e-5 at 600 runs. At temperature 0.5 the copied token (p = 0.16) is refused more
# often and q lies farther from p, so the case runs there at 600: 8.2e-12, 2.9e-9, 2e-10 (seeds 0-599, 600-1199,
# 1200-1799), drafts kept on 15 %.
DRAFT_MODEL_SAMPLES = 600
PADDED_SAMPLES = 600
PROMPT = [3, 4, 5, 3, 4, 5, 3, 4]  # repetitive, so NASD's table drafts from the first round


def build_small_vocab_pair(folder):
    pair = build_tiny_pair(folder, vocab=8, head_scale=1.5, draft_noise=0.6, hidden=32, layers=1)
    # No end-of-sequence token, so every run yields both tokens.
    return dataclasses.replace(pair, eos_ids=frozenset({10_000}))


def build_far_draft_pair(folder):
    pair = build_tiny_pair(folder, vocab=8, draft_noise=1.0, hidden=32, layers=1)
    return dataclasses.replace(pair, eos_ids=frozenset({10_000}))


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory):
    return build_small_vocab_pair(tmp_path_factory.mktemp("vocab8"))


@pytest.fixture(scope="module")
def far_draft_pair(tmp_path_factory):
    """An 8-token target with peaked next-token distributions and a noisier copy as its draft: q often
    puts its peak where p does not, so a correction drawn from the wrong distribution shows within 600
    runs, while drafts are still kept often. Over 600 SD runs, 44-47 % of drafts are kept; of the first
    rounds (two drafts each) 30-32 % keep both and draw the bonus token, 68-70 % refuse one and draw a
    correction (10-14 % and 86-90 % with top-k 3), in each block of seeds above. The target is not
    small_vocab_pair's: there p is flat and the draft a near copy, so q lies close to p everywhere."""
    return build_far_draft_pair(tmp_path_factory.mktemp("vocab8-far"))


def exact_joint(pair, config: SamplingConfig) -> torch.Tensor:
    with torch.inference_mode():
        logits = pair.target(input_ids=torch.tensor([PROMPT])).logits[0, -1]
        first = probabilities(logits, config)
        joint = torch.zeros(8, 8)
        for t1 in range(8):
            if first[t1] > 0:
                next_logits = pair.target(input_ids=torch.tensor([PROMPT + [t1]])).logits[0, -1]
                joint[t1] = first[t1] * probabilities(next_logits, config)
    return joint


# copy_n=0: the draft model drafts every round. Otherwise the prompt repeats itself, so the
# first round is copied from the context (a point mass) and the draft model drafts later ones.
# The last field is the number of runs (see DRAFT_MODEL_SAMPLES).
CASES = [
    ("sd", dict(temperature=1.0, copy_n=0), DRAFT_MODEL_SAMPLES),
    ("nasd", dict(temperature=1.0), POINT_MASS_SAMPLES),
    ("egag", dict(temperature=1.0, copy_n=0), DRAFT_MODEL_SAMPLES),
    ("sd", dict(temperature=1.0, top_k=3, copy_n=0), DRAFT_MODEL_SAMPLES),
    ("nasd", dict(temperature=0.8, top_p=0.8), POINT_MASS_SAMPLES),
    ("egag", dict(temperature=1.3, top_k=5, top_p=0.9, copy_n=0), DRAFT_MODEL_SAMPLES),
    ("sd", dict(temperature=0.5, copy_n=4), DRAFT_MODEL_SAMPLES),
    ("egag", dict(temperature=0.9, top_k=4, top_p=0.9, copy_n=2), DRAFT_MODEL_SAMPLES),
]
SAMPLING_FIELDS = ("temperature", "top_k", "top_p")


def sampled_run(pair, method, sampling, seed, cache="dynamic"):
    """One seeded generation from PROMPT, as every case here decodes it (three tokens, γ = 2)."""
    return specdemo.generate(pair, PROMPT, method=method, max_new_tokens=3, gamma=2, gamma_min=2, gamma_max=3,
                             ngram_n=3, seed=seed, cache=cache, **sampling)


def seed_draw(result) -> tuple[list[int], list[tuple[list[int], int]]]:
    """What a seed decided: the tokens, and each round's drafts and how many were kept."""
    return result.token_ids, [(r.drafted, r.accepted) for r in result.rounds]


def joint_p_value(pair, method, sampling, samples=SAMPLES, cache="dynamic", draws=None, first_seed=0):
    """χ² p-value of the observed (t1, t2) frequencies against the exact joint of the target, over the
    seeds first_seed .. first_seed + samples − 1. `draws`, a list, receives each seed's `seed_draw` in seed order."""
    counts = torch.zeros(8, 8)
    drafted = accepted = copied = 0
    for seed in range(first_seed, first_seed + samples):
        result = sampled_run(pair, method, sampling, seed, cache)
        t1, t2 = result.token_ids[:2]
        counts[t1, t2] += 1
        drafted += result.stats["drafted"]
        accepted += result.stats["accepted"]
        copied += result.stats["copied_rounds"]
        if draws is not None:
            draws.append(seed_draw(result))
    # The test means something only if drafts were both kept and refused.
    assert 0 < accepted < drafted
    assert bool(copied) == bool(sampling.get("copy_n")), "copied rounds exactly when copying is on"

    config = SamplingConfig(**{"top_k": 0, "top_p": 1.0, **{k: v for k, v in sampling.items() if k in SAMPLING_FIELDS}})
    expected = exact_joint(pair, config).flatten() * samples
    observed = counts.flatten()
    if observed[expected == 0].sum() > 0:
        return 0.0  # emitted a pair the target gives probability 0
    return pooled_chisquare(observed, expected)


CASE_IDS = [f"{m}-{'-'.join(f'{k}{v}' for k, v in s.items())}" for m, s, _ in CASES]
SAME_SEEDS = 150
# Each case's dynamic-cache draws for its first SAME_SEEDS seeds, kept by the χ² test that made them:
# the static cache's test holds its own draws to these rather than decoding them a second time.
DYNAMIC_DRAWS: dict[tuple[str, str], list] = {}


def _case_key(method, sampling) -> tuple[str, str]:
    return method, repr(sorted(sampling.items()))


def case_pair(method, small_vocab_pair, far_draft_pair):
    """NASD drafts from its table, not the draft model: its cases keep the flat target they were sized on."""
    return small_vocab_pair if method == "nasd" else far_draft_pair


@pytest.mark.parametrize("method, sampling, samples", CASES, ids=CASE_IDS)
def test_first_two_tokens_follow_the_target_distribution(small_vocab_pair, far_draft_pair, method, sampling, samples):
    draws = []
    pair = case_pair(method, small_vocab_pair, far_draft_pair)
    p_value = joint_p_value(pair, method, sampling, samples, draws=draws)
    DYNAMIC_DRAWS[_case_key(method, sampling)] = draws[:SAME_SEEDS]
    assert p_value > 1e-3, f"{method} {sampling}: χ² p-value {p_value:.2g}"


@pytest.mark.parametrize("method, sampling, samples", CASES, ids=CASE_IDS)
def test_the_static_cache_draws_what_the_dynamic_cache_draws_seed_by_seed(small_vocab_pair, far_draft_pair, method,
                                                                         sampling, samples):
    """The static cache holds the same keys and values as the dynamic one, so a seed gives the same tokens,
    drafts and verdicts on either: the χ² above then holds for it too. Equality seed by seed is the
    stronger check of the claim (identity) and needs far fewer runs than a χ² of its own."""
    pair = case_pair(method, small_vocab_pair, far_draft_pair)
    dynamic_draws = DYNAMIC_DRAWS.get(_case_key(method, sampling))  # absent where the χ² test did not run first
    if dynamic_draws is None:
        dynamic_draws = [seed_draw(sampled_run(pair, method, sampling, seed)) for seed in range(SAME_SEEDS)]
    assert len(dynamic_draws) == SAME_SEEDS
    for seed, (dynamic_tokens, dynamic_rounds) in enumerate(dynamic_draws):
        static_tokens, static_rounds = seed_draw(sampled_run(pair, method, sampling, seed, "static"))
        assert static_tokens == dynamic_tokens, (seed, static_tokens, dynamic_tokens)
        assert static_rounds == dynamic_rounds, (seed, static_rounds, dynamic_rounds)


def _correction_redrawn_from_p(monkeypatch):
    """Put the bug in the chain's verification: after a refusal, the next token is drawn from p, not the residual."""
    import specdemo.engine.chain_round as chain_round
    from specdemo.engine.sampling import verify_on_device

    def biased_verify(target_probs, drafts, draft_probs, config, generator=None):
        accepted, next_token = verify_on_device(target_probs, drafts, draft_probs, config, generator)
        redrawn = torch.multinomial(target_probs[accepted], 1, generator=generator)[0]
        return torch.stack([accepted, torch.where(accepted < len(drafts), redrawn, next_token)])

    monkeypatch.setattr(chain_round, "verify_on_device", biased_verify)


def test_a_biased_correction_token_would_fail_this_test(small_vocab_pair, monkeypatch):
    """Redraw the correction from p instead of the residual (a known NASD bug): the test must notice."""
    _correction_redrawn_from_p(monkeypatch)
    assert joint_p_value(small_vocab_pair, "nasd", {"temperature": 1.0}, POINT_MASS_SAMPLES) < 1e-3


def test_a_biased_correction_token_would_fail_the_draft_models_cases_at_their_size(far_draft_pair, monkeypatch):
    """The same bug after a draft model's refusal, on the pair and at the size the draft model's cases run."""
    _correction_redrawn_from_p(monkeypatch)
    p_value = joint_p_value(far_draft_pair, "sd", {"temperature": 1.0, "copy_n": 0}, DRAFT_MODEL_SAMPLES)
    assert p_value < 1e-8, f"χ² p-value {p_value:.2g}"


@pytest.fixture(scope="module")
def padded_draft_pair(tmp_path_factory):
    """An 8-token target beside an unrelated draft whose output layer pads the vocabulary to 12.
    The padding's logits are random, not −∞: uncut, they would take real draft mass."""
    root = tmp_path_factory.mktemp("padded-draft")
    write_model(root / "target", seed=0, hidden=32, layers=1, vocab=8, head_scale=1.5)
    write_tokenizer(root / "target", 8)
    write_model(root / "draft", seed=1, hidden=32, layers=1, vocab=12, head_scale=1.5)
    pair = load_pair(str(root / "target"), str(root / "draft"), device="cpu", dtype="float64")
    with torch.inference_mode():
        padded_probs = torch.softmax(pair.draft(input_ids=torch.tensor([PROMPT])).logits[0, -1], -1)
    assert pair.vocab_size == 8 and padded_probs[8:].sum() > 0.1
    return dataclasses.replace(pair, eos_ids=frozenset({10_000}))


PADDED_CASES = [
    dict(temperature=1.0, copy_n=0),
    dict(temperature=0.7, top_k=3, copy_n=0),
    dict(temperature=1.2, top_p=0.7, copy_n=0),
]


@pytest.mark.parametrize("sampling", PADDED_CASES, ids=["temperature", "top_k", "top_p"])
def test_a_draft_that_pads_the_vocabulary_leaves_sd_lossless_under_sampling(padded_draft_pair, sampling):
    """The draft's q and the target's p are compared on the 8 real tokens only."""
    p_value = joint_p_value(padded_draft_pair, "sd", sampling, samples=PADDED_SAMPLES)
    assert p_value > 1e-3, f"{sampling}: χ² p-value {p_value:.2g}"
