"""Copy first, draft otherwise: a drafter around the pair's draft.

Answers often repeat their request or themselves: a name, a passage a question is about, a
sentence being translated, a line of code. When the last n − 1 tokens of the context occurred
before (in the prompt or in the verified output), the round copies what followed them; other
rounds go to the wrapped drafter (a draft model or a feature head). Copied drafts are point
masses, like NASD's, so SD's acceptance rule stays exact under sampling: a copied token is kept
with the target's probability of it, and a rejection samples from the target with it removed.

For an encoder-decoder pair the context is the source (the encoder's input) and the decoder's
output so far: a summary copies spans of its article, a translation its names and numbers.

Unlike NASD's table, this one holds only what the text itself contains (no target top-k
filler) and matches the full n − 1 tokens, so it speaks only when the text repeats itself.
"""

from __future__ import annotations

import torch

from .base import Drafter, Proposal, WrappedDrafter
from .ngram import NgramTable
from ..trace import COPIED


class CopyFirstDrafter(WrappedDrafter):
    """`inner` drafts every round the context's table cannot continue. It sees every
    verification (`observe`), also after copied rounds, so its state follows the output."""

    def __init__(self, inner: Drafter, n: int, device: torch.device | str = "cpu"):
        if n < 2:
            raise ValueError(f"copy_n must be at least 2 (a context of one token or more), got {n}")
        super().__init__(inner)
        self.table = NgramTable(n, storage="onelevel")
        self.device = torch.device(device)

    def describe(self, model_name: str | None) -> str:
        return f"{self.inner.describe(model_name)} + context copy (n={self.table.n})"

    def read_source(self, source_ids: list[int]) -> None:
        """An encoder-decoder pair's source: its n-grams can be copied too (a summary quotes its article)."""
        self.table.add_sequence(source_ids)
        self.inner.read_source(source_ids)

    def start(self, prompt_ids: list[int], features=None) -> None:
        self.table.add_sequence(prompt_ids)
        self.inner.start(prompt_ids, features)

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        copied = self.copied(context, policy, limit)
        return copied if copied is not None else self.inner.propose(context, policy, limit, sampling, generator)

    def copied(self, context: list[int], policy, limit: int) -> Proposal | None:
        """The round's drafts copied from the context, or None where the table cannot continue it."""
        # The table holds contexts of exactly n − 1 tokens, so a shorter context never matches.
        if limit > 0 and self.table.continuation(context[-(self.table.n - 1) :]) is not None:
            # A point mass has zero entropy: a policy that reads it (EGAG) drafts its longest γ.
            entropy = 0.0 if policy.needs_first_entropy else None
            gamma = policy.round_gamma(entropy)
            tokens = torch.tensor(self.table.draft(context, min(gamma, limit)), dtype=torch.long, device=self.device)
            # The trace gives each copied token its q's entropy, zero, beside the drafter's own.
            zeros = torch.zeros(len(tokens), device=self.device)
            return Proposal(gamma, tokens, None, zeros, entropy, source=COPIED)
        return None

    @property
    def batch_group(self):
        return self.inner.batch_group

    @staticmethod
    def join_batch(drafters) -> None:
        inner = [d.inner for d in drafters]
        type(inner[0]).join_batch(inner)

    @staticmethod
    def propose_together(drafters, contexts, policies, limits, sampling, generators) -> list[Proposal]:
        """Rows that copy this round take their copies; the rest draft together through their inner drafters."""
        proposals = [d.copied(c, p, n) for d, c, p, n in zip(drafters, contexts, policies, limits)]
        drafting = [i for i, proposal in enumerate(proposals) if proposal is None]
        if drafting:
            inner = [drafters[i].inner for i in drafting]
            drafted = type(inner[0]).propose_together(inner, [contexts[i] for i in drafting],
                                                      [policies[i] for i in drafting], [limits[i] for i in drafting],
                                                      sampling, [generators[i] for i in drafting])
            for i, proposal in zip(drafting, drafted):
                proposals[i] = proposal
        return proposals

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None) -> None:
        self.table.add_sequence(sequence, start=verified_from)
        self.inner.observe(sequence, verified_from, target_logits, target_features, target_top)
