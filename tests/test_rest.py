"""REST: the datastore finds every occurrence, drafts the shared continuation, and stays lossless."""

import json
import random

import numpy as np
import pytest

import specdemo
from specdemo.bench.rest import build_from_corpus, main, read_documents
from specdemo.engine.drafters.policies import FixedGamma
from specdemo.engine.drafters.rest import (RestDrafter, build_datastore, context_occurrences, load_datastore, save_datastore,
                                  shared_continuation)
from tests.test_lossless_sampling import POINT_MASS_SAMPLES, PROMPT, joint_p_value
from tests.test_lossless_sampling import small_vocab_pair  # noqa: F401 (a fixture)
from tests.tiny import write_tokenizer


def brute_occurrences(documents, query):
    return sorted(start + len(query) for doc in documents for start in range(len(doc) - len(query) + 1)
                  if list(doc[start : start + len(query)]) == list(query))


def test_the_suffix_array_finds_every_occurrence_and_none_across_documents():
    rng = random.Random(0)
    documents = [[rng.randrange(5) for _ in range(rng.randrange(1, 40))] for _ in range(12)]
    store = build_datastore(documents, window=6)
    offsets = np.cumsum([0] + [len(d) + 1 for d in documents])
    for _ in range(200):
        query = [rng.randrange(5) for _ in range(rng.randrange(1, 5))]
        expected = [o + p for d, o in zip(documents, offsets) for p in brute_occurrences([d], query)]
        assert sorted(store.occurrences(query, most=10_000).tolist()) == sorted(expected), query


def test_the_draft_follows_the_continuation_most_occurrences_share():
    tokens = np.asarray([1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 5, 1, 2, 9])
    assert shared_continuation(tokens, np.asarray([2, 6, 10, 14]), 5) == [3, 5, 1, 2, 3]
    assert shared_continuation(tokens, np.asarray([15]), 3) == []


def test_the_context_is_searched_too_latest_occurrence_first():
    assert context_occurrences([7, 8, 9, 7, 8, 4, 7, 8], 2).tolist() == [5, 2]
    drafter = RestDrafter(None, vocab_size=16)
    assert drafter.draft([7, 8, 9, 7, 8, 4, 7, 8], 3) == [4, 7, 8]  # a tie goes to the latest occurrence
    assert drafter.matched == 2


def test_the_longest_match_wins_and_none_drafts_nothing(tmp_path):
    store = build_datastore([[1, 2, 3, 4, 5, 6], [9, 3, 4, 7, 7]])
    path = save_datastore(store, tmp_path / "store.npz")
    loaded = load_datastore(path)
    drafter = RestDrafter(loaded, vocab_size=16)
    assert drafter.draft([0, 2, 3, 4], 3) == [5, 6]  # 2,3,4 (three tokens) beats 3,4 (two)
    assert drafter.matched == 3
    assert drafter.draft([0, 11, 12], 3) == [] and drafter.matched == 0
    proposal = drafter.propose([0, 2, 3, 4], FixedGamma(1), 5, None, None)
    assert proposal.tokens.tolist() == [5] and proposal.draft_probs is None


def test_a_datastore_from_another_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocabulary"):
        RestDrafter(build_datastore([[1, 100]]), vocab_size=64)
    with pytest.raises(ValueError, match="python -m specdemo.bench.rest build"):
        load_datastore("/nonexistent/store.npz")


def test_corpora_are_read_as_text_blocks_or_jsonl_text_fields(tmp_path):
    (tmp_path / "a.txt").write_text("w5 w6 w7\nw8\n\nw9 w10\n", encoding="utf-8")
    assert read_documents(tmp_path / "a.txt") == ["w5 w6 w7\nw8", "w9 w10"]
    lines = [{"question_id": 1, "turns": ["w5 w6", "w7"], "category": "x"}, {"text": "w9", "id": "w3"}]
    (tmp_path / "b.jsonl").write_text("\n".join(map(json.dumps, lines)), encoding="utf-8")
    assert read_documents(tmp_path / "b.jsonl") == ["w5 w6", "w7", "w9"]


def test_the_build_command_writes_a_datastore_with_the_pairs_tokenizer(tmp_path, capsys):
    write_tokenizer(tmp_path / "tok")
    (tmp_path / "c.txt").write_text("w5 w6 w7 w8\n\nw5 w6 w9", encoding="utf-8")
    main(["build", str(tmp_path / "c.txt"), str(tmp_path / "store.npz"), "--tokenizer", str(tmp_path / "tok")])
    assert "7 tokens in 2 documents" in capsys.readouterr().out
    store = load_datastore(tmp_path / "store.npz")
    assert store.tokens.tolist() == [5, 6, 7, 8, -1, 5, 6, 9, -1]
    main(["info", str(tmp_path / "store.npz")])
    assert "7 tokens" in capsys.readouterr().out


@pytest.fixture(scope="module")
def ar_tokens(tiny_pair):
    """AR's 40 tokens per prompt and cache, decoded once for the module: the datastore and both greedy
    tests read the same references."""
    references = {}

    def reference(prompt, cache="dynamic"):
        if (prompt, cache) not in references:
            references[prompt, cache] = specdemo.generate(tiny_pair, prompt, method="ar", max_new_tokens=40,
                                                          cache=cache).token_ids
        return references[prompt, cache]

    return reference


@pytest.fixture(scope="module")
def tiny_store(ar_tokens, tmp_path_factory):
    """A datastore of the target's own greedy answers to a few prompts (drafts that are often kept)."""
    answers = [ar_tokens(prompt) for prompt in ("w5 w6 w7", "w11 w12", "w30 w31 w32 w33")]
    noisy = [[(t + 1) % 64 if i % 7 == 3 else t for i, t in enumerate(a)] for a in answers]  # some refused
    return str(save_datastore(build_datastore(noisy), tmp_path_factory.mktemp("rest") / "store.npz"))


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("prompt", ["w5 w6 w7", "w11 w12", "w40 w41", "w10 w20 w30 w10 w20 w30 w10 w20"])
def test_greedy_output_is_exactly_ars(tiny_pair, tiny_store, ar_tokens, prompt, cache):
    reference = ar_tokens(prompt, cache)
    for gamma in (1, 4):
        for store in ("", tiny_store):
            result = specdemo.generate(tiny_pair, prompt, method="rest", max_new_tokens=40, gamma=gamma,
                                       rest_datastore=store, cache=cache)
            assert result.token_ids == reference, (prompt, gamma, store)


def test_the_datastore_drafts_and_some_drafts_are_kept_and_some_refused(tiny_pair, tiny_store):
    result = specdemo.generate(tiny_pair, "w5 w6 w7", method="rest", max_new_tokens=40, gamma=4,
                               rest_datastore=tiny_store)
    assert 0 < result.stats["accepted"] < result.stats["drafted"]


# REST's drafts are point masses, as NASD's are: a correction redrawn from p (test_lossless_sampling's
# biased correction; in a tree, the next child and the correction judged against p, not the residual)
# gives p-values ≤ 4e-14 on the chain and ≤ 1.4e-10 on the tree below, over five blocks of 600 seeds.
def test_sampling_follows_the_target_distribution(small_vocab_pair, tmp_path):  # noqa: F811
    rng = random.Random(1)
    documents = [PROMPT[:4] + [rng.randrange(8) for _ in range(6)] for _ in range(30)]
    store = str(save_datastore(build_datastore(documents), tmp_path / "store.npz"))
    p_value = joint_p_value(small_vocab_pair, "rest", {"temperature": 1.0, "rest_datastore": store},
                            samples=POINT_MASS_SAMPLES)
    assert p_value > 1e-3, f"χ² p-value {p_value:.2g}"


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("policy", [dict(tree_policy="dynamic", max_width=3), dict(tree_policy="static", tree_shape="2,2,1")])
def test_a_tree_of_the_matchs_continuations_writes_ars_tokens(tiny_pair, tiny_store, ar_tokens, policy, cache):
    for prompt in ("w5 w6 w7", "w10 w20 w30 w10 w20 w30 w10 w20", "w40 w41"):
        reference = ar_tokens(prompt, cache)
        for budget in (1, 6):
            result = specdemo.generate(tiny_pair, prompt, method="rest", max_new_tokens=40, rest_tree=True,
                                       node_budget=budget, rest_datastore=tiny_store, cache=cache, **policy)
            assert result.token_ids == reference, (prompt, budget, policy)
            assert result.stats["tree_rounds"] == len(result.rounds)


def test_the_tree_branches_where_the_occurrences_disagree_most_shared_first():
    from specdemo.engine.params import DecodeParams
    from specdemo.engine.drafters.rest import RestStepper
    from specdemo.engine.drafters.tree_drafting import DynamicTree, grow_tree

    store = build_datastore([[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 5, 6], [9, 9]])
    stepper = RestStepper(RestDrafter(store, 16), [7, 1, 2], DecodeParams().sampling)
    tree, entropy = grow_tree(stepper, DynamicTree(max_width=2, max_depth=3, budget=5), 3, DecodeParams().sampling,
                              None)
    assert entropy is None  # point masses: no drafter entropy
    # Under the match "1 2": 3 (twice) before 5 (once); each then continues as its occurrences do.
    assert [tree.tokens[n] for n in tree.children[0]] == [3, 5]
    assert [tree.tokens[n] for n in tree.path_to(tree.tokens.index(4))] == [3, 4]
    assert sorted(tree.tokens[1:]) == [3, 4, 5, 6]


def test_a_sampled_tree_follows_the_target_distribution(small_vocab_pair, tmp_path):  # noqa: F811
    rng = random.Random(2)
    documents = [PROMPT[:4] + [rng.randrange(8) for _ in range(6)] for _ in range(30)]
    store = str(save_datastore(build_datastore(documents), tmp_path / "store.npz"))
    p_value = joint_p_value(small_vocab_pair, "rest", {"temperature": 1.0, "rest_datastore": store, "rest_tree": True,
                                                       "node_budget": 6, "max_width": 3}, samples=POINT_MASS_SAMPLES)
    assert p_value > 1e-3, f"χ² p-value {p_value:.2g}"
