"""specdemo.engine.drafters.context_copy: rounds where the text repeats itself are copied, the rest go
to the wrapped drafter, which still sees every verification."""

import pytest
import torch

import specdemo
from specdemo.engine.drafters.context_copy import CopyFirstDrafter
from specdemo.engine.drafters.base import Drafter, Proposal
from specdemo.engine.params import DecodeParams
from specdemo.engine.drafters.policies import EntropyGamma, FixedGamma
from specdemo.engine.sampling import SamplingConfig
from specdemo.engine.trace import COPIED

GREEDY = SamplingConfig(temperature=0.0)


class RecordingDrafter(Drafter):
    """Drafts [99] every time it is asked, and records what it was told."""

    def __init__(self):
        self.started, self.asked, self.observed = None, [], []

    def start(self, prompt_ids, features=None):
        self.started = (list(prompt_ids), features)

    def propose(self, context, policy, limit, sampling, generator):
        self.asked.append(list(context))
        return Proposal(policy.round_gamma(None), torch.tensor([99]), None, None, None)

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None):
        self.observed.append((list(sequence), verified_from, target_features, target_top))


def test_a_repeated_context_is_copied_as_a_point_mass_with_zero_entropy():
    inner = RecordingDrafter()
    drafter = CopyFirstDrafter(inner, n=3)
    prompt = [5, 6, 7, 8, 5, 6]
    drafter.start(prompt)
    proposal = drafter.propose(prompt, FixedGamma(3), limit=10, sampling=GREEDY, generator=None)
    # [5, 6] occurred before, followed by 7, 8, then 5: the copy follows that span.
    assert proposal.tokens.tolist() == [7, 8, 5]
    assert proposal.source == COPIED and proposal.draft_probs is None
    assert proposal.entropies.tolist() == [0.0, 0.0, 0.0]
    assert inner.asked == []


def test_a_context_never_seen_goes_to_the_wrapped_drafter():
    inner = RecordingDrafter()
    drafter = CopyFirstDrafter(inner, n=3)
    prompt = [5, 6, 7, 8]
    drafter.start(prompt)
    proposal = drafter.propose(prompt, FixedGamma(2), limit=10, sampling=GREEDY, generator=None)
    assert proposal.tokens.tolist() == [99] and proposal.source == "draft"
    assert inner.asked == [prompt]


def test_copies_never_run_past_the_limit():
    drafter = CopyFirstDrafter(RecordingDrafter(), n=2)
    prompt = [1, 2, 3, 1]
    drafter.start(prompt)
    assert drafter.propose(prompt, FixedGamma(5), limit=2, sampling=GREEDY, generator=None).tokens.tolist() == [2, 3]


def test_the_wrapped_drafter_sees_every_verification_and_the_table_learns_the_output():
    inner = RecordingDrafter()
    drafter = CopyFirstDrafter(inner, n=3)
    drafter.start([1, 2, 3], "features")
    assert inner.started == ([1, 2, 3], "features")
    drafter.observe([1, 2, 3, 4, 9], 3, None, target_features="f")
    assert inner.observed == [([1, 2, 3, 4, 9], 3, "f", None)]
    # [3, 4] → 9 came from the output: the next time the context ends in [3, 4], 9 is copied.
    proposal = drafter.propose([1, 2, 3, 4, 9, 3, 4], FixedGamma(1), limit=5, sampling=GREEDY, generator=None)
    assert proposal.tokens.tolist() == [9] and proposal.source == COPIED


def test_egag_drafts_its_longest_gamma_from_a_copy_whose_entropy_is_zero():
    drafter = CopyFirstDrafter(RecordingDrafter(), n=2)
    prompt = [4, 5, 6, 7, 8, 4]
    drafter.start(prompt)
    proposal = drafter.propose(prompt, EntropyGamma(1, 4, ema=0.0), limit=10, sampling=GREEDY, generator=None)
    assert proposal.gamma == 4 and proposal.round_entropy == 0.0 and proposal.tokens.tolist() == [5, 6, 7, 8]


def test_a_context_of_no_tokens_is_refused_everywhere():
    with pytest.raises(ValueError, match="copy_n must be at least 2"):
        CopyFirstDrafter(RecordingDrafter(), n=1)
    with pytest.raises(ValueError, match=r"copy_n must be 0 \(off\) or an integer from 2 to 16, got 1"):
        DecodeParams(copy_n=1)
    with pytest.raises(ValueError, match="copy_n"):
        DecodeParams.from_values(copy_n="17")
    assert DecodeParams(copy_n=0).copy_n == 0


def test_copying_is_traced_round_by_round(tiny_pair):
    prompt = "w10 w20 w30 w10 w20 w30 w10 w20"
    result = specdemo.generate(tiny_pair, prompt, method="sd", max_new_tokens=30, gamma=3, copy_n=3)
    sources = {r.source for r in result.rounds}
    assert COPIED in sources and result.stats["copied_rounds"] == sum(r.source == COPIED for r in result.rounds)
    assert result.drafter.endswith("+ context copy (n=3)")
    plain = specdemo.generate(tiny_pair, prompt, method="sd", max_new_tokens=30, gamma=3, copy_n=0)
    assert plain.stats["copied_rounds"] == 0 and "copy" not in plain.drafter
    assert plain.token_ids == result.token_ids
