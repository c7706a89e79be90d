"""specdemo.engine.drafters.ngram.NgramTable and NgramDrafter: NASD's table."""

import torch

from specdemo.engine.drafters.ngram import NgramDrafter, NgramTable
from specdemo.engine.drafters.policies import FixedGamma
from specdemo.engine.sampling import SamplingConfig


def test_longest_matching_context_wins():
    table = NgramTable(3, "basic")
    table.add_sequence([1, 2, 3, 9, 2, 4])
    # (9, 2) → 4 beats the bigram context (2,), whose 3/4 tie goes to 3, seen first
    assert table.continuation([9, 2]) == 4
    assert table.continuation([1, 2]) == 3  # trigram context (1, 2) → 3
    assert table.continuation([7, 2]) == 3  # no (7, 2): fall back to (2,)


def test_ties_go_to_the_continuation_that_reached_the_count_first():
    table = NgramTable(2, "basic")
    table.add_sequence([5, 8, 5, 6, 5, 8, 5, 6])
    assert table.continuation([5]) == 8
    table.add([5], 6)
    assert table.continuation([5]) == 6  # more frequent now


def test_most_frequent_continuation_beats_the_most_recent():
    table = NgramTable(2, "basic")
    table.add_sequence([5, 6, 5, 6, 5, 7])
    assert table.continuation([5]) == 6


def test_onelevel_table_only_uses_full_contexts():
    table = NgramTable(3, "onelevel")
    table.add_sequence([1, 2, 3])
    assert table.continuation([1, 2]) == 3
    assert table.continuation([8, 2]) is None
    assert table.continuation([2]) is None


def test_drafting_chains_continuations_and_stops_when_nothing_matches():
    table = NgramTable(3, "basic")
    table.add_sequence([1, 2, 3, 4, 5])
    assert table.draft([1, 2], 10) == [3, 4, 5]
    assert table.draft([1, 2], 2) == [3, 4]
    assert table.draft([42], 4) == []


def test_a_fallback_table_continues_where_the_table_knows_nothing():
    own, corpus = NgramTable(3), NgramTable(3)
    own.add_sequence([1, 2, 3])
    corpus.add_sequence([1, 2, 9, 3, 4, 5])
    assert own.draft([1, 2], 4) == [3]
    # The table's own continuation wins (2 -> 3, not the corpus's 9); the corpus goes on after it.
    assert own.draft([1, 2], 4, fallback=corpus) == [3, 4, 5]


def test_prompts_shorter_than_the_context_are_fine():
    drafter = NgramDrafter(n=5, storage="basic")
    drafter.start([7])
    proposal = drafter.propose([7], FixedGamma(4), 4, SamplingConfig(), None)
    assert proposal.tokens.tolist() == [] and proposal.draft_probs is None
    onelevel = NgramDrafter(n=5, storage="onelevel")
    onelevel.start([7, 8])
    assert onelevel.propose([7, 8], FixedGamma(4), 4, SamplingConfig(), None).tokens.tolist() == []


def test_verification_adds_accepted_tokens_and_the_targets_top_k():
    drafter = NgramDrafter(n=2, storage="basic", top_k_filler=2)
    drafter.start([1, 2])
    logits = torch.full((2, 10), -10.0)
    logits[0, 3], logits[0, 8] = 5.0, 4.0  # after [1, 2]: top-2 are 3, 8
    logits[1, 6], logits[1, 7] = 5.0, 4.0  # after [1, 2, 3]: top-2 are 6, 7
    drafter.observe([1, 2, 3, 5], verified_from=2, target_logits=logits)
    table = drafter.table
    assert table.continuation([2]) == 3  # seen for real and predicted top-1
    assert table.continuation([3]) in (5, 6)
    assert table._counts[(2,)] == {3: 2, 8: 1}
    assert table._counts[(3,)] == {5: 1, 6: 1, 7: 1}
    # On equal counts the token the text really continued with, seen first, wins.
    assert table.continuation([3]) == 5


def test_tables_are_per_drafter():
    first, second = NgramDrafter(3), NgramDrafter(3)
    first.start([1, 2, 3])
    assert len(second.table) == 0
