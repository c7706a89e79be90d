"""specdemo.engine.tree: the tree's shape, its attention mask and its position ids."""

import torch

from specdemo.engine.tree import ROOT, DraftTree


def _sample_tree() -> DraftTree:
    """root ─ a(1) ─ c(3) ─ e(5)
            └ b(2) ─ d(4)"""
    tree = DraftTree()
    a = tree.add(ROOT, 10, 0.6)
    b = tree.add(ROOT, 11, 0.3)
    c = tree.add(a, 12, 0.5)
    tree.add(b, 13, 0.9)
    tree.add(c, 14, 1.0)
    return tree


def test_nodes_know_their_parent_depth_children_and_cumulative_probability():
    tree = _sample_tree()
    assert len(tree) == 5 and tree.draft_tokens() == [10, 11, 12, 13, 14]
    assert tree.parents[1:] == [ROOT, ROOT, 1, 2, 3]
    assert tree.depths[1:] == [1, 1, 2, 2, 3] and tree.depth == 3
    assert tree.children == {ROOT: [1, 2], 1: [3], 2: [4], 3: [5]}
    assert tree.cumulative[5] == 0.6 * 0.5 * 1.0
    assert tree.path_to(5) == [1, 3, 5] and tree.path_to(ROOT) == []


def test_each_node_attends_to_itself_and_its_ancestors_only():
    mask = _sample_tree().ancestor_mask()
    expected = torch.tensor([
        [1, 0, 0, 0, 0],  # a
        [0, 1, 0, 0, 0],  # b
        [1, 0, 1, 0, 0],  # c under a
        [0, 1, 0, 1, 0],  # d under b
        [1, 0, 1, 0, 1],  # e under c under a
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_position_ids_follow_depth_not_row():
    assert _sample_tree().positions(root_position=7).tolist() == [8, 8, 9, 9, 10]


def test_a_chain_is_the_tree_with_one_child_per_node():
    tree = DraftTree.chain([5, 6, 7])
    assert tree.parents[1:] == [ROOT, 1, 2] and tree.depths[1:] == [1, 2, 3]
    assert torch.equal(tree.ancestor_mask(), torch.ones(3, 3, dtype=torch.bool).tril())
