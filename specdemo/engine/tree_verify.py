"""Drawing a node's children and verifying a tree: the pair that keeps trees lossless.

Children of a node are drawn from its q without replacement (greedy: its top tokens), so
siblings differ. Verification walks down from the root; at each node it tries the children
in the order they were drawn, each against the residual left by the ones before
(recursive rejection sampling without replacement):

    p₁ = p, q₁ = q
    child j (token x): keep it with probability min(1, p_j(x) / q_j(x));
    on a rejection:    p_{j+1} = norm(max(p_j − q_j, 0)),  q_{j+1} = q_j without x, renormalised
    every child refused: the next token is drawn from the last residual.

Each step is one ordinary speculative-sampling step of a draft x ~ q_j against p_j, so its
output is distributed as p_j; by induction the node's output is distributed as p. A point-mass
child (an n-gram draft, q_j = δ_x) is the same step: kept with probability p_j(x), and the
residual is p_j without x. The chain is the tree with one child per node, and for it this
is exactly `sampling.verify_on_device` (same draws in the same order: one uniform per draft, then one
multinomial draw).

Under greedy decoding the walk follows the target's argmax: a child is kept iff its token is
the argmax at its parent, so the output equals the target's own greedy tokens.

What may decide a node's number of children: anything known before they are drawn (q, the
node's depth and cumulative probability, other branches). What must not: the drawn tokens
themselves. That is why `draw_children` returns keys from q's sorted probabilities, not from
the drawn tokens: ranking nodes by those keys never selects a draft for its value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingConfig
from .tree import ROOT, DraftTree

_MASS_FLOOR = 1e-12


def draw_children(q: torch.Tensor, width: int, config: SamplingConfig,
                  generator: torch.Generator | None) -> tuple[list[int], list[float]]:
    """Up to `width` distinct tokens from q [V] and their ranking keys, host lists.

    Greedy: q's top tokens. Sampling: a draw without replacement (the Gumbel top-k trick),
    in drawn order. The key of the j-th child is q's j-th largest probability in both cases;
    tokens with q = 0 are never drawn, so a q with a small support gives fewer children.
    """
    width = min(width, q.shape[-1])
    top = torch.topk(q, width)
    if config.greedy:
        tokens = top.indices
    else:
        uniforms = torch.rand(q.shape, generator=generator, device=q.device).clamp_(min=1e-20)
        scores = torch.log(q) - torch.log(-torch.log(uniforms))
        tokens = torch.topk(scores, width).indices
    tokens_list, keys = torch.stack([tokens.double(), top.values.double()]).tolist()
    kept = [(int(t), k) for t, k in zip(tokens_list, keys) if k > 0]
    return [t for t, _ in kept], [k for _, k in kept]


@dataclass(frozen=True)
class TreeVerdict:
    path: list[int]  # the kept drafts as node indices, the root's child first
    next_token: int  # the correction (some child refused) or the bonus (a leaf was reached)
    refused: list[int]  # the children tried and refused at the node where the walk stopped


def verify_tree(target_probs: torch.Tensor, tree: DraftTree, config: SamplingConfig,
                generator: torch.Generator | None = None) -> TreeVerdict:
    """target_probs [n + 1, V]: p at the root (row 0) and after each draft (row i = node i).

    Greedy: target_probs may be logits or probabilities (only argmaxes are read).
    """
    if config.greedy:
        best = target_probs.argmax(-1).tolist()
        node, path = ROOT, []
        while True:
            by_token = {tree.tokens[c]: c for c in tree.children.get(node, [])}
            child = by_token.get(best[node])
            if child is None:
                refused = [c for c in tree.children.get(node, [])]
                return TreeVerdict(path, best[node], refused)
            path.append(child)
            node = child

    uniforms = torch.rand(len(tree), generator=generator, device=target_probs.device).tolist()
    node, path = ROOT, []
    while True:
        p = target_probs[node]
        q = tree.child_q.get(node)
        refused: list[int] = []
        kept = None
        for child in tree.children.get(node, []):
            x = tree.tokens[child]
            q_x = 1.0 if q is None else float(q[x])
            if not uniforms[child - 1] * q_x > float(p[x]):  # u ≤ p/q without dividing by q
                kept = child
                break
            refused.append(child)
            p, q = _after_refusal(p, q, x)
        if kept is None:
            next_token = int(torch.multinomial(p, 1, generator=generator)[0])
            return TreeVerdict(path, next_token, refused)
        path.append(kept)
        node = kept


def _after_refusal(p: torch.Tensor, q: torch.Tensor | None, x: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The residual target and the next child's q after child x was refused."""
    if q is None:  # a point mass on x
        residual = p.clone()
        residual[x] = 0.0
        next_q = None
    else:
        residual = torch.clamp(p - q, min=0.0)
        next_q = q.clone()
        next_q[x] = 0.0
        q_mass = next_q.sum()
        next_q = next_q / q_mass if q_mass > _MASS_FLOOR else next_q
    mass = residual.sum()
    # A refusal implies p(x) < q(x), so the residual has mass unless rounding ate it.
    residual = residual / mass if mass > _MASS_FLOOR else p
    return residual, next_q
