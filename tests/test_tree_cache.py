"""CachedLM trees: one forward scores every node; afterwards the cache holds exactly the kept path."""

import pytest
import torch

from specdemo.engine.targets.lm import CachedLM
from specdemo.engine.tree import ROOT, DraftTree


def _tree() -> DraftTree:
    """root ─ 11 ─ 13 ─ 15
            ├ 12 ─ 14
            └ 16"""
    tree = DraftTree()
    a, b = tree.add(ROOT, 11, 0.5), tree.add(ROOT, 12, 0.3)
    c = tree.add(a, 13, 0.9)
    tree.add(b, 14, 0.9)
    tree.add(c, 15, 0.9)
    tree.add(ROOT, 16, 0.1)
    return tree


def _teacher_forced(model, ids: list[int]) -> torch.Tensor:
    """Next-token logits after ids, from a forward with no cache at all."""
    return model(input_ids=torch.tensor([ids])).logits[0, -1]


def _feed_tree(lm, sequence, tree, hidden=False):
    return lm.tree_logits(sequence, torch.tensor(tree.draft_tokens()), tree.ancestor_mask(),
                          torch.tensor(tree.depths[1:]), n_hidden=hidden)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_every_node_gets_the_logits_of_its_own_path(tiny_pair, cache, attention, monkeypatch):
    model = tiny_pair.target
    monkeypatch.setattr(model.config, "_attn_implementation", attention)
    lm = CachedLM(model, tiny_pair.vocab_size, cache=cache, max_length=64)
    tree, sequence = _tree(), [1, 5, 6, 7, 8]
    with torch.inference_mode():
        lm.prefill(sequence[:-1])
        logits = _feed_tree(lm, sequence, tree, hidden=True)
        assert logits.shape[0] == len(tree) + 1 and lm.hidden.shape[0] == len(tree) + 1
        for node in range(len(tree) + 1):
            path = [tree.tokens[n] for n in tree.path_to(node)]
            # Eager attention takes its softmax in float32: over more keys it rounds differently.
            torch.testing.assert_close(logits[node], _teacher_forced(model, sequence + path), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kept", [[], [1], [2, 4], [1, 3, 5], [6]])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_after_a_round_the_cache_is_the_context_and_the_kept_path(tiny_pair, cache, kept):
    """The next step's logits equal a teacher-forced pass over the context, the kept path and the next token."""
    model = tiny_pair.target
    lm = CachedLM(model, tiny_pair.vocab_size, cache=cache, max_length=64)
    tree, sequence = _tree(), [1, 5, 6, 7, 8]
    with torch.inference_mode():
        lm.prefill(sequence[:-1])
        _feed_tree(lm, sequence, tree)
        lm.keep_tree_path([node - 1 for node in kept])
        path = [tree.tokens[n] for n in kept]
        lm.note_fed(path)
        assert lm.length == len(lm) == len(sequence) + len(kept)
        following = sequence + path + [20]
        torch.testing.assert_close(lm.logits(following, 1)[0], _teacher_forced(model, following))
        assert lm.length == len(following)  # only the one new token was fed


def test_a_second_tree_round_reuses_the_kept_path(tiny_pair):
    lm = CachedLM(tiny_pair.target, tiny_pair.vocab_size, cache="static", max_length=64)
    tree, sequence = _tree(), [1, 5, 6, 7, 8]
    with torch.inference_mode():
        lm.prefill(sequence[:-1])
        _feed_tree(lm, sequence, tree)
        lm.keep_tree_path([1, 3])
        lm.note_fed([12, 14])
        sequence = sequence + [12, 14, 30]
        forwards = lm.forwards
        logits = _feed_tree(lm, sequence, tree)
        assert lm.forwards == forwards + 1
        torch.testing.assert_close(logits[5], _teacher_forced(tiny_pair.target, sequence + [11, 13, 15]))


def test_a_tree_that_overflows_the_static_cache_is_refused(tiny_pair):
    lm = CachedLM(tiny_pair.target, tiny_pair.vocab_size, cache="static", max_length=8)
    with torch.inference_mode(), pytest.raises(ValueError, match="max_length"):
        lm.prefill([1, 5, 6, 7])
        _feed_tree(lm, [1, 5, 6, 7, 8], _tree())
