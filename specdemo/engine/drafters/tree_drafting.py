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

A stepper answers "q at this node?" for one drafter; the cache of a draft model or feature
head holds the path to the node it answered last, so moving to a sibling or a child feeds one
or a few tokens after a rollback (positions are indexed, so rollback is free):
  `ModelStepper`    a draft LM (`ModelDrafter`);
  `FeatureStepper`  a feature head (`FeatureDrafter`): a drafted node's input is its parent's
                    predicted feature, so each expanded node keeps its own prediction;
  `NgramStepper`    NASD's table: the continuations seen after the node's context, each a point
                    mass (no q), ranked by count;
  `RestStepper`     REST: the continuations of the longest match's occurrences along the node's
                    path, point masses ranked by how many occurrences share them.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import torch

from .base import Drafter, WrappedDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .feature_drafter import FeatureDrafter
from .policies import _Policy, gamma_from_entropy
from .rest import RestDrafter, follow, next_counts
from ..sampling import SamplingConfig, normalized_entropy, probabilities
from ..trace import DRAFTED, StopNote
from ..tree import ROOT, DraftTree
from ..tree_verify import draw_children


# -- policies --------------------------------------------------------------------------------
class _TreePolicy(_Policy):
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

    rule: _Policy = None
    vocab: int = 0

    def stop_note(self, depth: int, entropy_nats: float) -> StopNote | None:
        if depth == 0 and not self.rule.reads_first_token:
            return None
        entropy = entropy_nats / math.log(self.vocab) if self.vocab > 1 else entropy_nats
        value = self.rule.node_value(entropy, self.vocab)
        # As in a chain: the draft not made would have been the round's (depth + 1)-th.
        return StopNote(self.rule.rule, value, self.rule.threshold, depth) if self.rule.crosses(value) else None


# -- steppers --------------------------------------------------------------------------------
def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class ModelStepper:
    point_masses = False

    def __init__(self, drafter: ModelDrafter, context: list[int], sampling: SamplingConfig):
        self.lm, self.sampling, self.base = drafter.lm, sampling, len(context)
        self.fed: list[int] = []  # the nodes fed after the context
        drafter._fed = 0  # the cache ends at the context (see `finish`): nothing for observe to note
        self.root_q = probabilities(self.lm.logits(context, 1)[0], sampling)

    def q_at(self, tree: DraftTree, node: int) -> torch.Tensor:
        path = tree.path_to(node)
        common = _common_prefix(self.fed, path)
        self.lm.rollback(self.base + common)
        ids = [tree.tokens[n] for n in path[common:]]
        logits = self.lm.feed(torch.tensor(ids, dtype=torch.long, device=self.lm.device), 1)[0]
        self.lm.note_fed(ids)
        self.fed = path
        return probabilities(logits, self.sampling)

    def finish(self) -> None:
        self.lm.rollback(self.base)


class FeatureStepper:
    point_masses = False

    def __init__(self, drafter: FeatureDrafter, context: list[int], sampling: SamplingConfig):
        self.drafter, self.sampling = drafter, sampling
        predicted = drafter.catch_up(context)
        self.features = {ROOT: predicted}
        self.fed: list[int] = []
        self.root_q = None if predicted is None else drafter._probs(predicted, sampling)

    def q_at(self, tree: DraftTree, node: int) -> torch.Tensor:
        d = self.drafter
        path = tree.path_to(node)
        common = _common_prefix(self.fed, path)
        d.cache.rollback(d.committed + common)
        # The head's prediction at each parent stands in for the target's feature there.
        inputs = torch.stack([self.features[tree.parents[n]] for n in path[common:]])
        outputs = d._step(inputs, [tree.tokens[n] for n in path[common:]], d.committed + common)
        for n, predicted in zip(path[common:], outputs):
            self.features[n] = predicted
        self.fed = path
        return d._probs(outputs[-1], self.sampling)

    def finish(self) -> None:
        pass  # the next proposal rolls the head back to what the target verified


class NgramStepper:
    point_masses = True

    def __init__(self, drafter: NgramDrafter, context: list[int], sampling: SamplingConfig):
        self.table, self.context = drafter.table, list(context)
        self.root_q = self._counts(self.context)

    def _counts(self, context: list[int]) -> dict[int, int] | None:
        return self.table.continuations(context[-(self.table.n - 1) :] if self.table.n > 1 else []) or None

    def q_at(self, tree: DraftTree, node: int) -> dict[int, int] | None:
        return self._counts(self.context + [tree.tokens[n] for n in tree.path_to(node)])

    def finish(self) -> None:
        pass


class RestStepper:
    """REST's tree: the continuations of the longest match's occurrences, a trie ranked by how
    many occurrences share each branch (point masses, as NASD's table)."""

    point_masses = True

    def __init__(self, drafter: RestDrafter, context: list[int], sampling: SamplingConfig):
        self.tokens, self.starts = drafter.match(context)
        self.root_q = self._counts(self.starts)

    def _counts(self, starts) -> dict[int, int] | None:
        return dict(next_counts(self.tokens, starts)) or None

    def q_at(self, tree: DraftTree, node: int) -> dict[int, int] | None:
        starts = self.starts
        for token in (tree.tokens[n] for n in tree.path_to(node)):
            starts = follow(self.tokens, starts, token)
        return self._counts(starts)

    def finish(self) -> None:
        pass


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


_STEPPERS = ((FeatureDrafter, FeatureStepper), (ModelDrafter, ModelStepper), (NgramDrafter, NgramStepper),
             (RestDrafter, RestStepper))


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
        self.stepper = inner.tree_stepper or next((s for kind, s in _STEPPERS if isinstance(inner, kind)), None)
        if self.stepper is None:
            raise ValueError(f"trees: no tree drafting for {type(inner).__name__}")

    def propose_tree(self, context, policy: _TreePolicy, limit, sampling, generator) -> TreeProposal:
        stepper = self.stepper(self.inner, context, sampling)
        tree, entropy = grow_tree(stepper, policy, limit, sampling, generator)
        return TreeProposal(tree, tree.depth, entropy)
