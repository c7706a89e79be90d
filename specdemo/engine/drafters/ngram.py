"""NASD's drafter: an n-gram table built from the prompt (and an encoder-decoder pair's source) and
the target's verified outputs. It has no q, so verification treats its drafts as a point mass."""

from __future__ import annotations

from typing import Sequence

import torch

from .base import Drafter, Proposal, top_ids
from ..sampling import SamplingConfig
from ..tree import DraftTree


class NgramTable:
    """Counts of next tokens after contexts of length n−1 down to 1 (`basic`) or of
    length n−1 only (`onelevel`). Ties go to the continuation that reached the count
    first: in a passage the output quotes, following the first occurrence of a context
    keeps a drafted chain on one span instead of hopping between occurrences."""

    def __init__(self, n: int, storage: str = "basic"):
        self.n = n
        self.context_lengths = list(range(n - 1, 0, -1)) if storage == "basic" else [n - 1]
        self._counts: dict[tuple[int, ...], dict[int, int]] = {}
        self._best: dict[tuple[int, ...], int] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, context: Sequence[int], next_token: int, weight: int = 1) -> None:
        for length in self.context_lengths:
            if len(context) < length:
                continue
            key = tuple(context[len(context) - length :])
            counts = self._counts.setdefault(key, {})
            counts[next_token] = counts.get(next_token, 0) + weight
            best = self._best.get(key)
            if best is None or counts[next_token] > counts[best]:
                self._best[key] = next_token

    def add_sequence(self, ids: Sequence[int], start: int = 1) -> None:
        """Add the n-grams that end at positions start.. of ids."""
        window = self.n - 1
        for j in range(max(start, 1), len(ids)):
            self.add(ids[max(0, j - window) : j], ids[j])

    def continuations(self, context: Sequence[int]) -> dict[int, int]:
        """Every next token seen after the longest matching context, with its count ({} if none)."""
        for length in self.context_lengths:
            if len(context) >= length:
                counts = self._counts.get(tuple(context[len(context) - length :]))
                if counts:
                    return counts
        return {}

    def continuation(self, context: Sequence[int]) -> int | None:
        """Most frequent next token after the longest matching context, if any."""
        for length in self.context_lengths:
            if len(context) >= length:
                token = self._best.get(tuple(context[len(context) - length :]))
                if token is not None:
                    return token
        return None

    def draft(self, context: Sequence[int], max_tokens: int, fallback: "NgramTable | None" = None) -> list[int]:
        """Follow the continuations from `context`; where this table knows none, `fallback`'s
        (a table of the same n, e.g. one filled from a corpus) is asked before drafting stops."""
        window = list(context[-(self.n - 1) :]) if self.n > 1 else []
        drafted: list[int] = []
        while len(drafted) < max_tokens:
            token = self.continuation(window)
            if token is None and fallback is not None:
                token = fallback.continuation(window)
            if token is None:
                break
            drafted.append(token)
            window = (window + [token])[-(self.n - 1) :]
        return drafted


class NgramDrafter(Drafter):
    """NASD's drafter: an n-gram table grown from the prompt and every verification.

    The table lives on the host; the drafts go to `device` for the target to verify."""

    def __init__(self, n: int, storage: str = "basic", top_k_filler: int = 3,
                 device: torch.device | str = "cpu"):
        self.table = NgramTable(n, storage)
        self.storage = storage
        self.top_k_filler = top_k_filler
        self.target_top_k = top_k_filler
        self.device = torch.device(device)

    def describe(self, model_name: str | None) -> str:
        return f"n-gram table (n={self.table.n}, {self.storage})"

    def start(self, prompt_ids: list[int], features=None) -> None:
        self.table.add_sequence(prompt_ids)

    def read_source(self, source_ids: list[int]) -> None:
        self.table.add_sequence(source_ids)

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        gamma = policy.round_gamma(None)
        tokens = self.table.draft(context, min(gamma, limit))
        return Proposal(gamma, torch.tensor(tokens, dtype=torch.long, device=self.device), None, None, None)

    def observe(self, sequence, verified_from, target_logits, target_features=None,
                target_top: list[list[int]] | None = None) -> None:
        """target_top: the target's best `target_top_k` ids at each verified position, best
        first, when the decode loop has read them back already; else taken from target_logits."""
        self.table.add_sequence(sequence, start=verified_from)
        if self.top_k_filler <= 0:
            return
        predictions = target_top if target_top is not None else top_ids(target_logits, self.top_k_filler).tolist()
        window = self.table.n - 1
        for i, tokens in enumerate(predictions):
            end = verified_from + i
            context = sequence[max(0, end - window) : end]
            # Best first, so that among equal counts the target's top-1 was seen first.
            for token in tokens:
                self.table.add(context, token)


class NgramStepper:
    """NASD's trees (`tree_drafting`): the continuations seen after the node's context, each a
    point mass (no q), ranked by count."""

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


NgramDrafter.tree_stepper = NgramStepper
