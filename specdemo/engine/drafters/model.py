"""A small LM that drafts (`ModelDrafter`), with its own KV cache kept across rounds: a causal LM,
or an encoder-decoder model that encodes the source once, in `read_source`."""

from __future__ import annotations

import torch

from ..sampling import SamplingConfig, probabilities
from ..tokens import common_prefix_length
from ..tree import DraftTree
from ..targets.seq2seq import cached_lm
from .base import Drafter, Proposal, draft_round


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
    def forwards(self) -> int:
        return self.lm.forwards

    @property
    def counts(self):
        return self.lm.counts

    @property
    def draft_lm(self):
        return self.lm

    def warm_up(self) -> float:
        return self.lm.warm_up()

    def close(self) -> None:
        self.lm.close()

    def start(self, prompt_ids: list[int], features=None) -> None:
        self.lm.prefill(prompt_ids[:-1])

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        probs = probabilities(self.lm.logits(context, 1)[0], sampling)
        proposal, self._fed = draft_round(
            probs, policy, limit, sampling, generator,
            advance=lambda token: probabilities(self.lm.feed(token.view(1), 1)[0], sampling),
        )
        return proposal

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None) -> None:
        # The cache holds the context, then the drafts fed back, whose ids the host has only
        # now. Those the target accepted are the cache's to keep; the next proposal rolls back
        # the rest and catches up with `sequence`.
        accepted = target_logits.shape[0] - 1
        self.lm.note_fed(sequence[verified_from : verified_from + min(self._fed, accepted)])
        self._fed = 0  # a round this drafter sits out (another drafted it) fed nothing


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
