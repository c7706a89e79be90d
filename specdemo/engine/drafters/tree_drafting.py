"""Growing a tree of drafts: tree policies, and a stepper for each kind of drafter.

One builder (`grow_tree`) serves every policy: nodes are added best first, ranked by their
cumulative draft probability, until the node budget is spent. A policy decides only how many
children a node gets and how deep the tree may go:

  static    `StaticTree`: a fixed shape, children per depth (e.g. 3,2,1,1);
  dynamic   `DynamicTree` (EAGLE-2): max_width children per node to depth max_depth, so the
            budget goes to the nodes the drafter believes most;
  entropy   `EntropyTree`: the depth bound follows the drafter's smoothed entropy at the root
            (EGAG's rule for γ), and a node's width its own entropy: exp(H) children, the
            number of tokens the drafter hesitates between (see docs/trees.md).

A stepper answers "q at this node?" for one drafter, and lives beside it (the drafter's
`tree_stepper`); the cache of a draft model or feature head holds the path to the node it
answered last, so moving to a sibling or a child feeds one or a few tokens after a rollback
(positions are indexed, so rollback is free):
  `model.ModelStepper`              a draft LM (`ModelDrafter`);
  `feature_drafter.FeatureStepper`  a feature head (`FeatureDrafter`): a drafted node's input is
                                    its parent's predicted feature, so each expanded node keeps
                                    its own prediction;
  `ngram.NgramStepper`              NASD's table: the continuations seen after the node's
                                    context, each a point mass (no q), ranked by count;
  `rest.RestStepper`                REST: the continuations of the longest match's occurrences
                                    along the node's path, point masses ranked by how many
                                    occurrences share them;
  `published.medusa.MedusaStepper`  Medusa's heads: one q per depth.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import torch

from .base import Drafter, WrappedDrafter
from .policies import Policy, gamma_from_entropy
from ..sampling import SamplingConfig, normalized_entropy
from ..trace import DRAFTED, StopNote
from ..tree import ROOT, DraftTree
from ..tree_verify import draw_children


# -- policies --------------------------------------------------------------------------------
class _TreePolicy(Policy):
    budget: int

    def begin_round(self, root_entropy: float) -> int:
        """The depth bound of this round, given the drafter's normalised entropy at the root."""
        return self.max_depth

    def width(self, depth: int, entropy_nats: float) -> int:
        raise NotImplementedError

    def stop_note(self, depth: int, entropy_nats: float) -> StopNote | None:
        """Why a node at this depth, with q of this entropy, gets no children (None: it may have some)."""
        return None


@dataclass
class StaticTree(_TreePolicy):
    shape: tuple[int, ...]
    budget: int

    @property
    def max_depth(self) -> int:
        return len(self.shape)

    def width(self, depth: int, entropy_nats: float) -> int:
        return self.shape[depth] if depth < len(self.shape) else 0


@dataclass
class DynamicTree(_TreePolicy):
    max_width: int
    max_depth: int
    budget: int

    def width(self, depth: int, entropy_nats: float) -> int:
        return self.max_width


@dataclass
class EntropyTree(_TreePolicy):
    """Depth bound D_t = clamp(floor((1 − Ĥ_t)·depth_max), depth_min, depth_max), Ĥ_t the EMA of the
    root's normalised entropy (EGAG's γ rule); width at a node = clamp(round(exp H), 1, max_width),
    H the node's entropy in nats (exp H is q's perplexity: 1 for a sure drafter, k for k even guesses)."""

    depth_min: int
    depth_max: int
    ema: float
    max_width: int
    budget: int
    smoothed: float | None = field(default=None, init=False)
    needs_first_entropy = True

    def begin_round(self, root_entropy: float) -> int:
        self.smoothed = root_entropy if self.smoothed is None else self.ema * self.smoothed + (1 - self.ema) * root_entropy
        return gamma_from_entropy(self.smoothed, self.depth_min, self.depth_max)

    def width(self, depth: int, entropy_nats: float) -> int:
        return max(1, min(self.max_width, math.floor(math.exp(entropy_nats) + 0.5)))


@dataclass
class StopRuleTree(DynamicTree):
    """A dynamic tree pruned by a per-token rule (AdaEDL's bound, EGAG's entropy per token): a node
    whose q crosses the rule's threshold gets no children, as a chain would stop drafting there.
    The root is exempt unless the rule reads the first token too (as a chain's first draft is)."""

    rule: Policy = None
    vocab: int = 0

    def stop_note(self, depth: int, entropy_nats: float) -> StopNote | None:
        if depth == 0 and not self.rule.reads_first_token:
            return None
        entropy = entropy_nats / math.log(self.vocab) if self.vocab > 1 else entropy_nats
        value = self.rule.node_value(entropy, self.vocab)
        # As in a chain: the draft not made would have been the round's (depth + 1)-th.
        return StopNote(self.rule.rule, value, self.rule.threshold, depth) if self.rule.crosses(value) else None


# -- growing a tree from a drafter's stepper -------------------------------------------------
def _expand(stepper, q, width_of, depth: int, sampling, generator):
    """(tokens, keys, q kept for verification, normalised entropy or None) for one node."""
    if stepper.point_masses:
        total = sum(q.values())
        probs = [c / total for c in q.values()]
        entropy_nats = -sum(p * math.log(p) for p in probs)
        # Most frequent first; among equal counts, the continuation seen first (dict order).
        ranked = sorted(q.items(), key=lambda item: -item[1])[: width_of(depth, entropy_nats)]
        return [t for t, _ in ranked], [c / total for _, c in ranked], None, None
    entropy = float(normalized_entropy(q))
    width = width_of(depth, entropy * math.log(q.shape[-1]))
    tokens, keys = draw_children(q, width, sampling, generator)
    return tokens, keys, (None if sampling.greedy else q), entropy


def _widths(policy: _TreePolicy, tree: DraftTree, node: int):
    """The policy's width at `node`, noting in the tree why it is 0 when a stop rule says so."""
    def width(depth: int, entropy_nats: float) -> int:
        note = policy.stop_note(depth, entropy_nats)
        if note is not None:
            tree.stops[node] = note
            return 0
        return policy.width(depth, entropy_nats)
    return width


def grow_tree(stepper, policy: _TreePolicy, limit: int, sampling: SamplingConfig,
              generator: torch.Generator | None) -> tuple[DraftTree, float | None]:
    """Add nodes best first (cumulative draft probability; ties in the order they were offered)
    until policy.budget nodes, depth ≤ min(the policy's bound, limit). Returns the tree and the
    root's normalised entropy (None for point masses).

    A node's children are offered with keys non-increasing in drawn order, so the ones added
    are always the first drawn: the tree never picks a draft for its value (see tree_verify).
    """
    tree = DraftTree()
    if stepper.root_q is None or limit <= 0 or policy.budget <= 0:
        return tree, None
    order = 0
    heap: list = [(-1.0, order, "expand", ROOT, None)]
    root_entropy = None
    max_depth = None
    while heap and len(tree) < policy.budget:
        negative, _, kind, node, offer = heapq.heappop(heap)
        if kind == "expand":
            q = stepper.root_q if node == ROOT else stepper.q_at(tree, node)
            if q is None:
                continue
            tokens, keys, tree.child_q[node], entropy = _expand(stepper, q, _widths(policy, tree, node),
                                                                 tree.depths[node], sampling, generator)
            if entropy is not None:
                tree.entropies[node] = entropy
            if node == ROOT:
                root_entropy = entropy
                max_depth = min(limit, policy.begin_round(entropy if entropy is not None else 0.0))
            for token, key in zip(tokens, keys):
                order += 1
                heapq.heappush(heap, (negative * key, order, "add", node, (token, key)))
        else:
            child = tree.add(node, *offer)
            if tree.depths[child] < max_depth:
                order += 1
                heapq.heappush(heap, (-tree.cumulative[child], order, "expand", child, None))
    stepper.finish()
    return tree, root_entropy


@dataclass
class TreeProposal:
    tree: DraftTree
    gamma: int  # the depth bound of the round
    round_entropy: float | None
    source: str = DRAFTED


class TreeDrafter(WrappedDrafter):
    """A drafter that proposes a tree each round (`propose_tree`); everything else is `inner`'s."""

    drafts_trees = True

    def __init__(self, inner: Drafter):
        super().__init__(inner)
        self.stepper = inner.tree_stepper
        if self.stepper is None:
            raise ValueError(f"trees: no tree drafting for {type(inner).__name__}")

    def propose_tree(self, context, policy: _TreePolicy, limit, sampling, generator) -> TreeProposal:
        stepper = self.stepper(self.inner, context, sampling)
        tree, entropy = grow_tree(stepper, policy, limit, sampling, generator)
        return TreeProposal(tree, tree.depth, entropy)
