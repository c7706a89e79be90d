"""What every round shares: the decoding it runs in (`Decoding`), what it comes back with
(`RoundOutcome`), and the one read of device values to the host.

A round function (`chain_round`, `tree_round`) takes a `Decoding` and the sequence so far,
drafts, verifies in one forward of the model that writes, reads the verdict back once, cuts it
at the first EOS, and returns a `RoundOutcome`; the decode loop only applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .drafters.base import Drafter
from .targets.lm import CachedLM
from .sampling import SamplingConfig
from .tokens import cut_at_eos
from .trace import DraftDecision, StopNote, TreeRecord


@dataclass
class Decoding:
    """One generation's fixed parts: the model that writes (the target, or the draft alone for
    the `draft` baseline) with its cache, the drafter, the γ policy, sampling and the clock."""

    writer: CachedLM
    drafter: Drafter
    policy: object
    sampling: SamplingConfig
    generator: torch.Generator
    clock: object  # engine.clock: start / lap / stop
    eos_ids: frozenset[int] | set[int]


@dataclass
class RoundOutcome:
    """A verified round, on the host, cut at the first EOS."""

    gamma: int  # the policy's γ (or a tree's depth bound)
    round_entropy: float | None  # the entropy γ was set from, if any
    source: str  # what drafted: trace.DRAFTED or COPIED ("" when nothing was drafted)
    drafts: list[int]  # drafted tokens up to the first EOS: the kept prefix, then the first refused
    accepted: int
    next_token: int | None  # the writer's own token (None when a kept EOS ends the output)
    entropies: list[float]  # the drafter's normalised entropy at each draft
    decisions: list[DraftDecision]
    next_p: float | None  # the writer's p of next_token
    verified_logits: torch.Tensor  # [≥ accepted + 1, V]: the writer after the context and each kept draft
    verified_hidden: torch.Tensor | None  # their hidden states, for a drafter that reads them
    target_top: list[list[int]] | None  # the writer's best ids there, for a drafter that asks
    tree: TreeRecord | None = None
    early_stop: StopNote | None = None  # where and why drafting stopped before its cap, if a rule stopped it

    @property
    def new_tokens(self) -> list[int]:
        return self.drafts[: self.accepted] + ([] if self.next_token is None else [self.next_token])

    def shown_to_drafter(self) -> dict:
        """What the drafter's `observe` gets: the verified rows the output keeps, and what it asked for."""
        seen = self.accepted + 1
        return dict(target_logits=self.verified_logits[:seen],
                    target_features=None if self.verified_hidden is None else self.verified_hidden[:seen],
                    target_top=None if self.target_top is None else self.target_top[:seen])


def cut_verdict_at_eos(drafted: list[int], accepted: int, next_token: int,
                       eos_ids) -> tuple[list[int], int, int | None]:
    """A verdict over every draft, read as one over the drafts up to the first EOS: those
    drafts, how many of them the target kept, and its next token (None when a kept EOS
    ends the output)."""
    drafts = cut_at_eos(drafted, eos_ids)
    accepted = min(accepted, len(drafts))
    ended = accepted > 0 and drafts[accepted - 1] in eos_ids
    return drafts, accepted, None if ended else next_token


def read_together(*parts: torch.Tensor | None) -> list[list]:
    """Device tensors as host lists, like `tolist()`, in one read (one synchronisation on a GPU);
    [] for None. They travel as float64, which holds token ids (below 2^53) and float32 values
    exactly; integer tensors come back as ints."""
    present = [p for p in parts if p is not None]
    values = torch.cat([p.reshape(-1).double() for p in present]).tolist() if present else []
    lists = []
    for part in parts:
        if part is None:
            lists.append([])
            continue
        chunk, values = values[: part.numel()], values[part.numel() :]
        if not part.is_floating_point():
            chunk = [int(v) for v in chunk]
        for size in reversed(part.shape[1:]):  # back into rows
            chunk = [chunk[i : i + size] for i in range(0, len(chunk), size)]
        lists.append(chunk)
    return lists
