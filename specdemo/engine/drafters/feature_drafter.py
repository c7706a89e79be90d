"""The drafter around a feature-level head: it reads the target's hidden states.

The decode loop hands it the target's final hidden states (with the intermediate layers that
a fused-feature head asks for, `feature_layers`) at the positions the target has verified (from
the prefill and from each verification forward, which computes them anyway), so drafting costs
only head steps. Bookkeeping by position j (the head's input at j is
(f_j, x_{j+1})):
- the head's cache holds `committed` positions fed with the target's true features, then the
  positions the last round drafted from its own predictions;
- `pending` holds true features the head has not read yet.
Each proposal rolls the cache back to `committed`, reads the pending features in one forward
(whose last output gives the first draft), then drafts one token per head step.
"""

from __future__ import annotations

import torch

from .base import Drafter, DraftPosition, Proposal, draft_positions, draft_round, drafting_steps
from ..trace import FedCounts
from .feature_head import FeatureHead, HeadCache
from ..sampling import SamplingConfig, probabilities, spread
from ..tokens import common_prefix_length
from ..tree import ROOT, DraftTree


class FeatureDrafter(Drafter):
    reads_target_features = True

    def __init__(self, head: FeatureHead):
        self.head = head
        # The target's intermediate layers the head reads beside its final state (none: final only).
        self.feature_layers = tuple(head.config.feature_layers)
        self.cache: HeadCache | None = None
        self.committed = 0
        self.pending: list[torch.Tensor] = []  # [n_i, d] true features for positions committed..
        self._forwards = 0
        self._counts = FedCounts()  # its forwards after the prompt's read: positions fed, one logit row each
        self.kv_peak_sink: tuple[dict, str] | None = None  # where the head's cache records its peak bytes

    def report_kv_peak(self, record: dict, key: str) -> None:
        self.kv_peak_sink = (record, key)

    @property
    def batch_group(self):
        # Rows draft together through a torch head's step over rows (ours, EAGLE's, EAGLE-3's); steps run by
        # another runtime (a subclass's head_step) draft alone.
        if callable(getattr(self.head, "step_rows", None)) and type(self).head_step is FeatureDrafter.head_step:
            return self.head
        return None

    @staticmethod
    def propose_together(drafters, contexts, policies, limits, sampling, generators) -> list[Proposal]:
        return propose_rows(drafters, contexts, policies, limits, sampling, generators)

    @property
    def forwards(self) -> int:
        return self._forwards

    @property
    def counts(self) -> FedCounts:
        return self._counts

    def start(self, prompt_ids: list[int], features: torch.Tensor | None) -> None:
        """features [len(prompt_ids) - 1, d]: the target's states over the prefilled prompt."""
        param = self.head.fc.weight
        self.cache = HeadCache(self.head.config, param.device, param.dtype, capacity=len(prompt_ids) + 64,
                               peak_sink=self.kv_peak_sink)
        self.committed = 0
        self.pending = [features]

    def head_step(self, features: torch.Tensor, next_ids: list[int] | torch.Tensor, first_position: int) -> torch.Tensor:
        ids = torch.as_tensor(next_ids, device=features.device).view(1, -1)
        positions = torch.arange(first_position + 1, first_position + 1 + ids.shape[1], device=features.device)
        self._forwards += 1
        if self.cache.length:  # the first read (the prompt's features) is the head's prefill
            self._counts.add(ids.shape[1], 1)
        return self.head(features.to(self.head.fc.weight.dtype).unsqueeze(0), ids, positions, cache=self.cache)[0]

    def logits_of(self, predicted: torch.Tensor) -> torch.Tensor:
        """The head's logits over its draft vocabulary for predicted features [..., d]."""
        return self.head.draft_logits(predicted)

    def q_of(self, predicted: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
        return draft_q(self.head, self.logits_of(predicted), sampling)

    def positions_of(self, predicted: torch.Tensor, sampling: SamplingConfig) -> list:
        """The DraftPositions of predicted features [B, d] (or [d]: one), reduced over the draft vocabulary."""
        return head_positions(self.head, self.logits_of(predicted), sampling)

    def catch_up(self, context: list[int]) -> torch.Tensor | None:
        """Read the pending true features; the predicted feature at the context's last position
        (from which the first draft comes), or None before the target has run at all."""
        return _caught_up([self], [context])[0]

    def _read_alone(self, context: list[int]) -> torch.Tensor | None:
        """catch_up through head_step, for a head that reads no rows (`read_rows`) or a step run elsewhere."""
        read = self.to_read(context)
        if read is None:
            return None
        known, next_ids = read
        predicted = self.head_step(known, next_ids, self.committed)[-1]
        self.committed = len(context) - 1
        return predicted

    def to_read(self, context: list[int]) -> tuple[torch.Tensor, list[int]] | None:
        """The pending true features [n, d] and the ids they pair with, the cache rolled back to `committed`
        (None before the target has run at all); the caller reads them and moves `committed` on."""
        assert self.cache is not None, "start() first"
        self.cache.rollback(self.committed)
        pending = [f for f in self.pending if f is not None and f.shape[0]]
        if not pending:  # a one-token prompt: no feature to draft from until the target has run
            return None
        known = torch.cat(pending) if len(pending) > 1 else pending[0]
        self.pending = []
        n = len(context)
        # True features cover positions committed .. n-2; the input at j pairs f_j with x_{j+1}.
        assert self.committed + known.shape[0] == n - 1, (self.committed, known.shape, n)
        return known, context[self.committed + 1 : n]

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        predicted = self.catch_up(context)
        if predicted is None:
            return Proposal.empty(0, self.head.fc.weight.device)
        n = len(context)
        state = {"predicted": predicted, "position": n - 1}

        def advance(token: torch.Tensor) -> DraftPosition:
            # The head's own prediction stands in for the target's feature at the drafted position.
            state["predicted"] = self.head_step(state["predicted"].view(1, -1), token.view(1), state["position"])[-1]
            state["position"] += 1
            return self.positions_of(state["predicted"], sampling)[0]

        proposal, _ = draft_round(self.positions_of(predicted, sampling)[0], policy, limit, sampling, generator,
                                  advance)
        return proposal

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None) -> None:
        """target_features [accepted + 1, d]: the target's states at positions
        verified_from - 1 .. verified_from - 1 + accepted, which it verified."""
        assert target_features is not None, "the decode loop must pass the target's features"
        self.pending.append(target_features)

    def close(self) -> None:
        self.cache = None


def propose_rows(drafters: list[FeatureDrafter], contexts: list[list[int]], policies: list, limits: list[int],
                 sampling: SamplingConfig, generators: list) -> list[Proposal]:
    """Every row's proposal of a batch, as each drafter would propose alone, with one head forward per
    draft step over the rows still drafting: a row whose γ policy stopped leaves the step's rows.
    The rows' pending true features are read first, in one forward where the head reads rows of different
    lengths (`read_rows`), else one forward a row; each step's q and what the policies read of it are
    computed once over the step's rows."""
    proposals: list[Proposal | None] = [None] * len(drafters)
    steps, predicted, positions, tokens = {}, {}, {}, {}
    caught = _caught_up(drafters, contexts)
    for row, first in enumerate(caught):
        if first is None:
            proposals[row] = Proposal.empty(0, drafters[row].head.fc.weight.device)
        else:
            predicted[row], positions[row] = first, len(contexts[row]) - 1
    rows = list(predicted)
    if not rows:
        return proposals
    head = drafters[rows[0]].head
    for row, first in zip(rows, head_positions(head, head.draft_logits(torch.stack([predicted[row] for row in rows])),
                                               sampling)):
        steps[row] = drafting_steps(first, policies[row], limits[row], sampling, generators[row])
        _advance(row, steps, tokens, proposals, None)
    while tokens:
        rows = list(tokens)
        for row in rows:
            drafter = drafters[row]
            drafter._forwards += 1
            drafter._counts.add(1, 1)
        outputs = head.step_rows(torch.stack([predicted[row] for row in rows]),
                                 torch.cat([tokens[row].view(1) for row in rows]),
                                 [positions[row] + 1 for row in rows], [drafters[row].cache for row in rows])
        for row, output, position in zip(rows, outputs, head_positions(head, head.draft_logits(outputs), sampling)):
            predicted[row] = output
            positions[row] += 1
            _advance(row, steps, tokens, proposals, position)
    return proposals


def draft_q(head, logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """q over the whole vocabulary [..., V] from a head's logits over its draft vocabulary [..., S] (its
    `draft_ids`; None: the whole vocabulary), exactly zero outside it. The softmax runs over the S columns
    alone: a filter or softmax over V where V − S logits are −inf gives the same q at V ÷ S times the cost."""
    probs = probabilities(logits, sampling)
    ids = head.draft_ids
    return probs if ids is None else spread(probs, ids, head.vocab_size)


def head_positions(head, logits: torch.Tensor, sampling: SamplingConfig) -> list[DraftPosition]:
    """`draft_positions` of a head's logits [B, S] (or [S]) over its draft vocabulary: each row's q is
    draft_q's, and what the policy reads of it comes from the S columns alone."""
    return draft_positions(probabilities(logits, sampling), head.draft_ids, head.vocab_size)


def _caught_up(drafters: list[FeatureDrafter], contexts: list[list[int]]) -> list[torch.Tensor | None]:
    """Each row's predicted feature at its context's last position, its pending features read."""
    head = drafters[0].head
    if drafters[0].batch_group is None or not callable(getattr(head, "read_rows", None)):
        return [drafter._read_alone(context) for drafter, context in zip(drafters, contexts)]
    reads = [drafter.to_read(context) for drafter, context in zip(drafters, contexts)]
    reading = [i for i, read in enumerate(reads) if read is not None]
    caught: list[torch.Tensor | None] = [None] * len(drafters)
    if not reading:
        return caught
    device = head.fc.weight.device
    outputs = head.read_rows([reads[i][0] for i in reading],
                             [torch.as_tensor(reads[i][1], dtype=torch.long, device=device) for i in reading],
                             [drafters[i].committed for i in reading], [drafters[i].cache for i in reading])
    for i, output in zip(reading, outputs):
        drafter = drafters[i]
        drafter._forwards += 1
        if drafter.committed:  # the prompt's first read is the head's prefill
            drafter._counts.add(len(reads[i][1]), 1)
        drafter.committed = len(contexts[i]) - 1
        caught[i] = output
    return caught


def _advance(row: int, steps: dict, tokens: dict, proposals: list, position: DraftPosition | None) -> None:
    """Hand a row its next drafting position (None: its first step); keep the draft it wants fed back,
    or its finished proposal."""
    try:
        tokens[row] = next(steps[row]) if position is None else steps[row].send(position)
    except StopIteration as done:
        tokens.pop(row, None)
        proposals[row] = done.value[0]


class FeatureStepper:
    """A feature head's trees (`tree_drafting`): a drafted node's input is its parent's predicted
    feature, so each expanded node keeps its own prediction."""

    point_masses = False

    def __init__(self, drafter: FeatureDrafter, context: list[int], sampling: SamplingConfig):
        self.drafter, self.sampling = drafter, sampling
        predicted = drafter.catch_up(context)
        self.features = {ROOT: predicted}
        self.fed: list[int] = []
        self.root_q = None if predicted is None else drafter.q_of(predicted, sampling)

    def q_at(self, tree: DraftTree, node: int) -> torch.Tensor:
        d = self.drafter
        path = tree.path_to(node)
        common = common_prefix_length(self.fed, path)
        d.cache.rollback(d.committed + common)
        # The head's prediction at each parent stands in for the target's feature there.
        inputs = torch.stack([self.features[tree.parents[n]] for n in path[common:]])
        outputs = d.head_step(inputs, [tree.tokens[n] for n in path[common:]], d.committed + common)
        for n, predicted in zip(path[common:], outputs):
            self.features[n] = predicted
        self.fed = path
        return d.q_of(outputs[-1], self.sampling)

    def finish(self) -> None:
        pass  # the next proposal rolls the head back to what the target verified


FeatureDrafter.tree_stepper = FeatureStepper
