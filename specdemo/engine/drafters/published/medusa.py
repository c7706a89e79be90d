"""Medusa heads in FasterDecoding's layout, and their drafter.

Head k (k = 0 .. K−1) reads the target's final (normed) state at a verified position j, passes it
through `medusa_num_layers` residual blocks x + SiLU(W x + b), and a linear layer to the vocabulary:
its softmax guesses x_{j+k+2}, the token k + 2 places ahead (the target's own LM head gives x_{j+1},
which the decode loop has already written). So a round after a verified position drafts up to K
tokens from one state, q at each depth independent of the drafts before it; the top few per depth
form a tree (`MedusaStepper`) that the tree code verifies in one forward.

Names: `medusa_head.{k}.{i}.linear.{weight,bias}` for block i, `medusa_head.{k}.{n}.weight` for the
final layer (n = medusa_num_layers), saved with or without the `medusa_head.` prefix
(medusa_lm_head.safetensors / .pt). Config: `medusa_num_heads`, `medusa_num_layers`,
`base_model_name_or_path`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..base import Drafter, Proposal, draft_positions, draft_round
from ...trace import FedCounts
from ...sampling import SamplingConfig, probabilities
from ...tree import DraftTree
from .base import PublishedHead

PREFIX = "medusa_head."


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHead(PublishedHead):
    kind = "medusa"

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1):
        super().__init__()
        self.hidden_size, self.vocab_size, self.num_heads = hidden_size, vocab_size, num_heads
        self.medusa_head = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          nn.Linear(hidden_size, vocab_size, bias=False))
            for _ in range(num_heads))

    @classmethod
    def from_checkpoint(cls, config: dict, state: dict[str, torch.Tensor]) -> "MedusaHead":
        state = {k if k.startswith(PREFIX) else PREFIX + k: v for k, v in state.items()}
        heads, layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
        final = state.get(f"{PREFIX}0.{layers}.weight")
        if final is None:
            raise ValueError(f"Medusa heads: no {PREFIX}0.{layers}.weight, the final layer of head 0 with "
                             f"medusa_num_layers {layers}")
        vocab, hidden = final.shape
        head = cls(hidden, vocab, heads, layers)
        head.load_state_dict(state, strict=True)
        return head

    @property
    def step_module(self) -> nn.Module:
        return self.medusa_head[0]  # every head runs once a step; the first is hooked

    def logits(self, feature: torch.Tensor) -> torch.Tensor:
        """feature [d] (the target's final state at a verified position) -> [K, V], head k's logits
        (features [B, d] -> [K, B, V])."""
        x = feature.to(self.medusa_head[0][-1].weight.dtype)
        return torch.stack([head(x) for head in self.medusa_head])

    def drafter(self) -> "MedusaDrafter":
        return MedusaDrafter(self)


class MedusaDrafter(Drafter):
    """Drafts from the target's state at the last verified position: up to K tokens a round, one per head."""

    reads_target_features = True

    def __init__(self, head: MedusaHead):
        self.head = head
        self.state: torch.Tensor | None = None  # [d]: the target's state before the context's last token
        self._forwards = 0
        self._counts = FedCounts()  # one state in, each head's row of logits out: one row a step

    @property
    def forwards(self) -> int:
        return self._forwards

    @property
    def counts(self) -> FedCounts:
        return self._counts

    def start(self, prompt_ids, features=None) -> None:
        self.state = features[-1] if features is not None and features.shape[0] else None

    def depth_probs(self, sampling: SamplingConfig) -> torch.Tensor | None:
        """[K, V]: q at each depth after the context (None before the target has run at all)."""
        if self.state is None:
            return None
        self._forwards += 1
        self._counts.add(1, 1)
        return probabilities(self.head.logits(self.state).float(), sampling)

    @property
    def batch_group(self):
        return self.head

    @staticmethod
    def propose_together(drafters, contexts, policies, limits, sampling, generators) -> list[Proposal]:
        """Every row's heads in one forward over the rows' states; each row then drafts from its own q."""
        ready = [i for i, d in enumerate(drafters) if d.state is not None]
        proposals = [Proposal.empty(0, d.head.medusa_head[0][-1].weight.device) for d in drafters]
        if ready:
            head = drafters[ready[0]].head
            logits = head.logits(torch.stack([drafters[i].state for i in ready])).transpose(0, 1)  # [rows, K, V]
            probs = probabilities(logits.float(), sampling)
            for i, row_probs in zip(ready, probs):
                drafters[i]._forwards += 1
                drafters[i]._counts.add(1, 1)
                proposals[i] = drafters[i].drafted(row_probs, policies[i], limits[i], sampling, generators[i])
        return proposals

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        probs = self.depth_probs(sampling)
        if probs is None:
            return Proposal.empty(0, self.head.medusa_head[0][-1].weight.device)
        return self.drafted(probs, policy, limit, sampling, generator)

    def drafted(self, probs: torch.Tensor, policy, limit: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        """The round's drafts from q at each depth after the context, probs [K, V]."""
        positions = iter(draft_positions(probs))
        proposal, _ = draft_round(next(positions), policy, min(limit, probs.shape[0]), sampling, generator,
                                  advance=lambda token: next(positions))
        return proposal

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None) -> None:
        """target_features: the target's states at the verified positions; the last one (before the
        token the target just wrote) is what the next round's heads read."""
        assert target_features is not None, "the decode loop must pass the target's features"
        self.state = target_features[-1]


class MedusaStepper:
    """Trees of Medusa's drafts: every node at depth k has the same q, head k's."""

    point_masses = False

    def __init__(self, drafter: MedusaDrafter, context: list[int], sampling: SamplingConfig):
        self.probs = drafter.depth_probs(sampling)
        self.root_q = None if self.probs is None else self.probs[0]

    def q_at(self, tree: DraftTree, node: int) -> torch.Tensor | None:
        depth = tree.depths[node]
        return self.probs[depth] if depth < self.probs.shape[0] else None

    def finish(self) -> None:
        pass


MedusaDrafter.tree_stepper = MedusaStepper
