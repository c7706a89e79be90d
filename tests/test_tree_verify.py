"""specdemo.engine.tree_verify: trees are verified losslessly (greedy walks, χ² under sampling)."""

from functools import cache

import pytest
import torch
from scipy.stats import chisquare

from specdemo.engine.sampling import SamplingConfig, probabilities, verify_on_device
from specdemo.engine.tree import ROOT, DraftTree
from specdemo.engine.tree_verify import draw_children, verify_tree

V = 6
SAMPLES = 6000
# Trees drawn from a q run fewer: judging a refused child's next sibling and the correction against p
# rather than the residual max(p − q, 0) (mutant M2's line in `_after_refusal`) fails every such case below at
# 1,000 samples already, with p-values ≤ 7.6e-15 for generator seeds 1, 2 and 3 (0 for the subset and top-k
# cases), and drafting q's best tokens as if drawn (the companion test) fails at 1,500 with p-values of 0.
# The point masses keep 6,000: their residual is another line, not sized here.
Q_SAMPLES = 1500
# Fixed logits for the target and the drafter after each prefix of up to two tokens.
_GEN = torch.Generator().manual_seed(0)
TARGET_LOGITS = torch.randn(1 + V + V * V, V, generator=_GEN) * 1.5
DRAFT_LOGITS = TARGET_LOGITS + torch.randn(1 + V + V * V, V, generator=_GEN) * 1.2


def _row(prefix: tuple[int, ...]) -> int:
    return 0 if not prefix else 1 + prefix[0] if len(prefix) == 1 else 1 + V + prefix[0] * V + prefix[1]


# p and q depend on the prefix and the sampling settings alone: each is computed once, not once per node
# of every sampled tree. Nothing writes to them (verification clones before it takes a residual).
@cache
def _p(prefix: tuple[int, ...], config: SamplingConfig) -> torch.Tensor:
    return probabilities(TARGET_LOGITS[_row(prefix)], config)


@cache
def _q(prefix: tuple[int, ...], config: SamplingConfig, subset: frozenset[int] | None = None) -> torch.Tensor:
    logits = DRAFT_LOGITS[_row(prefix)].clone()
    if subset is not None:  # the feature head's q: zero outside a vocabulary subset
        outside = torch.ones(V, dtype=torch.bool)
        outside[list(subset)] = False
        logits[outside] = float("-inf")
    return probabilities(logits, config)


def _prefix(tree, node):
    return tuple(tree.tokens[n] for n in tree.path_to(node))


def _grow(config, generator, widths=(3, 2), subset=None, point_masses=False) -> DraftTree:
    """A tree with widths[d] children per node at depth d, drawn as the drafters draw them."""
    tree = DraftTree()
    frontier = [ROOT]
    for width in widths:
        next_frontier = []
        for node in frontier:
            prefix = _prefix(tree, node)
            if point_masses:  # an n-gram table: fixed continuations per context, no q
                tokens = [(sum(prefix) + 2 * j + 1) % V for j in range(width)]
                keys, tree.child_q[node] = [1.0] * width, None
            else:
                q = _q(prefix, config, subset)
                tokens, keys = draw_children(q, width, config, generator)
                tree.child_q[node] = q
            next_frontier += [tree.add(node, t, k) for t, k in zip(tokens, keys)]
        frontier = next_frontier
    return tree


def _target_rows(tree, config):
    return torch.stack([_p(_prefix(tree, node), config) for node in range(len(tree) + 1)])


def _two_tokens(config, generator, **grow):
    """The first two output tokens of a generation that verifies one tree, then (if the tree
    gave only one token) continues with the target alone."""
    tree = _grow(config, generator, **grow)
    verdict = verify_tree(_target_rows(tree, config), tree, config, generator)
    out = [tree.tokens[n] for n in verdict.path] + [verdict.next_token]
    if len(out) == 1:
        out.append(int(torch.multinomial(_p(tuple(out), config), 1, generator=generator)))
    return out[0], out[1]


def _exact_joint(config):
    first = _p((), config)
    return torch.stack([first[a] * _p((a,), config) for a in range(V)]).flatten()


def _p_value(config, samples=SAMPLES, seed=1, **grow):
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V * V)
    for _ in range(samples):
        a, b = _two_tokens(config, generator, **grow)
        counts[a * V + b] += 1
    expected = _exact_joint(config) * samples
    if counts[expected == 0].sum() > 0:
        return 0.0
    frequent = expected >= 5
    observed = torch.cat([counts[frequent], counts[~frequent].sum().view(1)])
    expected = torch.cat([expected[frequent], expected[~frequent].sum().view(1)])
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1]
        expected = expected * observed.sum() / expected.sum()
    return chisquare(observed.numpy(), expected.numpy()).pvalue


CASES = {
    "full-q": dict(config=SamplingConfig(1.0), samples=Q_SAMPLES),
    "subset-q": dict(config=SamplingConfig(1.0), subset=frozenset({0, 2, 3, 5}), samples=Q_SAMPLES),
    "point-masses": dict(config=SamplingConfig(1.0), point_masses=True),
    "temperature": dict(config=SamplingConfig(0.6), samples=Q_SAMPLES),
    "top-k": dict(config=SamplingConfig(1.0, top_k=4), samples=Q_SAMPLES),
    "top-p": dict(config=SamplingConfig(1.2, top_p=0.8), samples=Q_SAMPLES),
    "point-masses-top-k-top-p": dict(config=SamplingConfig(0.9, top_k=4, top_p=0.9), point_masses=True),
    "wider-than-the-subset": dict(config=SamplingConfig(1.0), subset=frozenset({1, 4}), widths=(3, 3),
                                  samples=Q_SAMPLES),
}


@pytest.mark.parametrize("case", CASES)
def test_tree_output_is_distributed_as_the_target(case):
    p_value = _p_value(**CASES[case])
    assert p_value > 1e-3, f"{case}: χ² p-value {p_value:.2g}"


def test_children_drawn_as_the_top_tokens_under_sampling_would_be_caught(monkeypatch):
    """Draft q's best tokens but verify as if they were drawn from q: the χ² test must notice."""
    import specdemo.engine.tree_verify as tv

    greedy_draw = tv.draw_children
    monkeypatch.setattr(tv, "draw_children", lambda q, w, config, g: greedy_draw(q, w, SamplingConfig(0.0), g))
    monkeypatch.setitem(globals(), "draw_children", tv.draw_children)
    assert _p_value(SamplingConfig(1.0), samples=Q_SAMPLES, widths=(2, 1)) < 1e-3


def test_draws_are_distinct_and_never_outside_q():
    generator = torch.Generator().manual_seed(3)
    q = torch.tensor([0.5, 0.0, 0.3, 0.0, 0.2, 0.0])
    for _ in range(50):
        tokens, keys = draw_children(q, 5, SamplingConfig(1.0), generator)
        assert sorted(tokens) == [0, 2, 4] and keys == pytest.approx([0.5, 0.3, 0.2])
    assert draw_children(q, 2, SamplingConfig(0.0), generator)[0] == [0, 2]


def test_greedy_follows_the_target_argmax_down_the_tree():
    tree = DraftTree()
    a, b = tree.add(ROOT, 1, 0.5), tree.add(ROOT, 2, 0.4)
    c = tree.add(b, 3, 0.9)
    tree.add(b, 4, 0.1)
    # argmax: root → 2 (b), b → 4 (node 4), node 4 → 5 (the bonus), elsewhere 0.
    rows = torch.zeros(5, V)
    rows[0, 2] = rows[b, 4] = rows[4, 5] = 1.0
    rows[a, 0] = rows[c, 0] = 1.0
    verdict = verify_tree(rows, tree, SamplingConfig(0.0))
    assert verdict.path == [b, 4] and verdict.next_token == 5 and verdict.refused == []
    # Rejection at the root: the argmax is no child's token.
    rows[0] = torch.eye(V)[0]
    verdict = verify_tree(rows, tree, SamplingConfig(0.0))
    assert verdict.path == [] and verdict.next_token == 0 and verdict.refused == [a, b]


@pytest.mark.parametrize("config", [SamplingConfig(0.0), SamplingConfig(1.0), SamplingConfig(0.7, top_k=4)])
@pytest.mark.parametrize("point_masses", [False, True])
def test_on_a_chain_tree_verification_is_chain_verification(config, point_masses):
    """The same verdict as `verify_on_device` from the same generator state, draw for draw."""
    for seed in range(200):
        gen = torch.Generator().manual_seed(seed)
        k = seed % 4
        drafts = torch.randint(0, V, (k,), generator=gen)
        target = torch.softmax(torch.randn(k + 1, V, generator=gen) * 2, -1)
        q = None if point_masses else torch.softmax(torch.randn(k, V, generator=gen), -1)
        state = gen.get_state()
        chain = verify_on_device(target, drafts, q, config, gen).tolist()
        gen.set_state(state)
        verdict = verify_tree(target, DraftTree.chain(drafts.tolist(), q), config, gen)
        assert [len(verdict.path), verdict.next_token] == chain
        assert verdict.path == list(range(1, len(verdict.path) + 1))
