"""A small LM that drafts (`ModelDrafter`), with its own KV cache kept across rounds: a causal LM,
or an encoder-decoder model that encodes the source once, in `read_source`.

In a batch, the rows' draft LMs are rows of one batched cache (`targets.batched.BatchedLM`, the target's
own batching): one forward a draft step for every row still drafting, each at its own positions, each
rolled back by its own count. A row joins at `join_batch` and reads its prompt at its first proposal.
"""

from __future__ import annotations

import torch

from ..sampling import SamplingConfig, probabilities
from ..tokens import common_prefix_length
from ..tree import DraftTree
from ..targets.batched import BatchedLM
from ..targets.seq2seq import cached_lm, is_encoder_decoder
from ..trace import FedCounts
from .base import Drafter, DraftPosition, Proposal, draft_positions, draft_round, drafting_steps


class ModelDrafter(Drafter):
    """A small LM that drafts, with its own KV cache kept across rounds."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None, cache: str = "dynamic",
                 max_length: int | None = None, lm_factory=None):
        """lm_factory(model, vocab_size, cache=, max_length=, compile=, buckets=): what runs the draft's
        forwards (torch's `cached_lm` by default; a runtime's beside a runtime target)."""
        self.lm_factory = lm_factory or cached_lm
        self.lm = self.lm_factory(model, vocab_size, cache=cache, max_length=max_length)
        self.source: list[int] | None = None
        self._fed = 0  # drafts of the last proposal fed back into the cache
        self.seat: _Seat | None = None  # its row of a batch's shared cache, once it joined one

    def use_cache(self, cache: str, max_length: int | None, compile: bool = False,
                  buckets: tuple[int, ...] = (1,)) -> None:
        """Switch to a fresh cache of this kind (before `start`)."""
        self.lm.close()
        self.lm = self.lm_factory(self.lm.model, self.lm.vocab_size, cache=cache, max_length=max_length,
                                  compile=compile, buckets=buckets)
        if self.source is not None:
            self.lm.set_source(self.source)

    def read_source(self, source_ids: list[int]) -> None:
        """The encoder's input, for an encoder-decoder draft (encoded once, at `start`)."""
        self.source = list(source_ids)
        self.lm.set_source(self.source)

    @property
    def batch_group(self):
        # Rows share one batched cache of a torch decoder-only draft whose attention takes a custom mask.
        model = self.lm.model
        if self.lm_factory is not cached_lm or is_encoder_decoder(model):
            return None
        if getattr(model.config, "_attn_implementation", None) not in ("sdpa", "eager"):
            return None
        return model

    @staticmethod
    def join_batch(drafters: list["ModelDrafter"]) -> None:
        shared = BatchedLM(drafters[0].lm.model, len(drafters), drafters[0].lm.vocab_size)
        for row, drafter in enumerate(drafters):
            drafter.lm.close()
            drafter.seat = _Seat(shared, row)

    @staticmethod
    def propose_together(drafters, contexts, policies, limits, sampling, generators) -> list[Proposal]:
        return propose_rows(drafters, contexts, policies, limits, sampling, generators)

    @property
    def forwards(self) -> int:
        return self.seat.counts.forwards if self.seat else self.lm.forwards

    @property
    def counts(self):
        return self.seat.counts if self.seat else self.lm.counts

    @property
    def draft_lm(self):
        return self.lm

    def warm_up(self) -> float:
        return self.lm.warm_up()

    def close(self) -> None:
        self.lm.close()
        if self.seat is not None and self.seat.row in self.seat.lm.members:
            self.seat.lm.drop(self.seat.row)

    def start(self, prompt_ids: list[int], features=None) -> None:
        if self.seat is None:  # a seated row reads its prompt with the batch's first draft forward
            self.lm.prefill(prompt_ids[:-1])

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        if self.seat is not None:
            return propose_rows([self], [context], [policy], [limit], sampling, [generator])[0]
        first = draft_positions(probabilities(self.lm.logits(context, 1)[0], sampling))[0]
        proposal, self._fed = draft_round(
            first, policy, limit, sampling, generator,
            advance=lambda token: draft_positions(probabilities(self.lm.feed(token.view(1), 1)[0], sampling))[0],
        )
        return proposal

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None) -> None:
        # The cache holds the context, then the drafts fed back, whose ids the host has only
        # now. Those the target accepted are the cache's to keep; the next proposal rolls back
        # the rest and catches up with `sequence`.
        accepted = target_logits.shape[0] - 1
        kept = sequence[verified_from : verified_from + min(self._fed, accepted)]
        if self.seat is not None:
            self.seat.lm.note_fed(self.seat.row, kept)
        else:
            self.lm.note_fed(kept)
        self._fed = 0  # a round this drafter sits out (another drafted it) fed nothing


class _Seat:
    """A draft LM's row of a batch's shared cache, and what that row was fed (its own count of forwards)."""

    def __init__(self, lm: BatchedLM, row: int):
        self.lm, self.row = lm, row
        self.counts = FedCounts()


def propose_rows(drafters: list[ModelDrafter], contexts: list[list[int]], policies: list, limits: list[int],
                 sampling: SamplingConfig, generators: list) -> list[Proposal]:
    """Every seated row's proposal, as each drafter would propose alone: one forward catches every row up
    with its context (each keeps what its cache shares with it), then one forward a draft step over the
    rows still drafting; a row whose γ policy stopped is left out of the steps."""
    shared = drafters[0].seat.lm
    by_row = {d.seat.row: i for i, d in enumerate(drafters)}
    for d, context in zip(drafters, contexts):  # what the catch-up feeds each row: past what its cache shares
        kept = min(common_prefix_length(shared.cached_ids[d.seat.row], context), len(context) - 1)
        d.seat.counts.add(len(context) - kept, 1)
    first = shared.forward({d.seat.row: context for d, context in zip(drafters, contexts)},
                           {row: 1 for row in by_row})[0]
    done: list[tuple[Proposal, int] | None] = [None] * len(drafters)
    steps, tokens = {}, {}
    rows = list(by_row)
    for row, position in zip(rows, draft_positions(probabilities(torch.stack([first[row][0] for row in rows]),
                                                                 sampling))):
        i = by_row[row]
        steps[row] = drafting_steps(position, policies[i], limits[i], sampling, generators[i])
        _advance(row, i, steps, tokens, done, None)
    while tokens:
        logits = shared.feed({row: token.view(1) for row, token in tokens.items()})
        rows = list(logits)
        q = probabilities(torch.stack([logits[row][0] for row in rows]), sampling)
        for row, position in zip(rows, draft_positions(q)):
            drafters[by_row[row]].seat.counts.add(1, 1)
            _advance(row, by_row[row], steps, tokens, done, position)
    for d, (_, fed) in zip(drafters, done):
        d._fed = fed
    return [proposal for proposal, _ in done]


def _advance(row: int, i: int, steps: dict, tokens: dict, done: list, position: DraftPosition | None) -> None:
    """Hand a row its next drafting position (None: its first); keep the draft it wants fed back, or its
    finished proposal and how many drafts it fed."""
    try:
        tokens[row] = next(steps[row]) if position is None else steps[row].send(position)
    except StopIteration as finished:
        tokens.pop(row, None)
        done[i] = finished.value


class ModelStepper:
    """A draft LM's trees (`tree_drafting`): its cache holds the path to the node it answered last."""

    point_masses = False

    def __init__(self, drafter: ModelDrafter, context: list[int], sampling: SamplingConfig):
        self.lm, self.sampling, self.base = drafter.lm, sampling, len(context)
        self.fed: list[int] = []  # the nodes fed after the context
        drafter._fed = 0  # the cache ends at the context (see `finish`): nothing for observe to note
        self.root_q = probabilities(self.lm.logits(context, 1)[0], sampling)

    def q_at(self, tree: DraftTree, node: int) -> torch.Tensor:
        path = tree.path_to(node)
        common = common_prefix_length(self.fed, path)
        self.lm.rollback(self.base + common)
        ids = [tree.tokens[n] for n in path[common:]]
        logits = self.lm.feed(torch.tensor(ids, dtype=torch.long, device=self.lm.device), 1)[0]
        self.lm.note_fed(ids)
        self.fed = path
        return probabilities(logits, self.sampling)

    def finish(self) -> None:
        self.lm.rollback(self.base)


ModelDrafter.tree_stepper = ModelStepper
