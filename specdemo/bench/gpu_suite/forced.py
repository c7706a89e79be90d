"""A draft LM that agrees with the target at a set rate, for random-weight pairs.

Two random models agree on almost nothing, so SD on them would reject every draft and its
rounds would never show what a round of accepted drafts costs. `ForcedAcceptance` hooks a
draft LM so that it proposes the target's own greedy token at each position with
probability `rate` and a token the target never picks otherwise:

- the target's greedy continuation of the prompt is computed once (`set_continuation`) and
  kept on the device, indexed by absolute position;
- a fixed pseudo-random mask over positions (from `seed`) says where the draft agrees;
- a pre-hook on the decoder's rotary-position module reads the positions of the rows being
  computed, and a hook on the LM head replaces the logits with a point mass (logit +30, the
  rest 0) on the chosen token.

The draft still runs its whole forward, so every cost is real; only its answer is forced.
Both hooks are tensor operations only (no read-back, no Python branch on data), so they run
unchanged inside `torch.compile` and CUDA graphs, and they serve our decode loop and
transformers' assisted generation alike, since both call the same modules. Per drafted
position acceptance is `rate`; a round stops at its first rejection, as usual.

May import torch only.
"""

from __future__ import annotations

import torch

FORCED_LOGIT = 30.0
DEFAULT_CAPACITY = 8192  # positions the oracle covers; later positions read the last entry


class ForcedAcceptance:
    """Hooks on `draft` (a transformers causal LM with a rotary-position module)."""

    def __init__(self, draft: torch.nn.Module, rate: float, seed: int = 0, capacity: int = DEFAULT_CAPACITY):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"forced acceptance rate must be in [0, 1], got {rate}")
        rotary = getattr(draft.get_decoder(), "rotary_emb", None)
        if rotary is None:
            raise ValueError(f"forced acceptance reads positions from a rotary module; {type(draft).__name__} has none")
        device = next(draft.parameters()).device
        self.rate = rate
        self.vocab = draft.get_output_embeddings().out_features
        generator = torch.Generator().manual_seed(seed)
        self.agrees = (torch.rand(capacity, generator=generator) < rate).to(device)
        # A per-position offset picks the disagreeing token, so refusals do not all name one id.
        self.offsets = torch.randint(1, self.vocab, (capacity,), generator=generator).to(device)
        self.oracle = torch.full((capacity,), -1, dtype=torch.long, device=device)
        self.positions: torch.Tensor | None = None
        self._handles = [
            rotary.register_forward_pre_hook(self._read_positions, with_kwargs=True),
            draft.get_output_embeddings().register_forward_hook(self._force),
        ]

    def set_continuation(self, prompt_ids: list[int], continuation: list[int]) -> None:
        """The target's greedy tokens after `prompt_ids`: the row at position p predicts token p + 1."""
        sequence = list(prompt_ids) + list(continuation)
        capacity = self.oracle.shape[0]
        if len(sequence) > capacity:
            raise ValueError(f"forced acceptance covers {capacity} positions; this sequence has {len(sequence)}")
        values = torch.full((capacity,), -1, dtype=torch.long)
        values[: len(sequence) - 1] = torch.tensor(sequence[1:], dtype=torch.long)
        values[: len(prompt_ids) - 1] = -1  # inside the prompt nothing is drafted
        with torch.inference_mode():
            self.oracle.copy_(values)  # in place: a captured graph keeps reading this address

    def _read_positions(self, module, args, kwargs):
        positions = kwargs.get("position_ids")
        if positions is None and len(args) > 1:
            positions = args[1]
        self.positions = positions
        return None

    def _force(self, module, inputs, logits: torch.Tensor) -> torch.Tensor:
        rows = logits.shape[-2]
        last = self.oracle.shape[0] - 1
        positions = self.positions[..., -rows:].clamp(0, last).expand(logits.shape[:-1])
        truth = self.oracle[positions]
        wrong = torch.remainder(truth.clamp(min=0) + self.offsets[positions], self.vocab)
        chosen = torch.where(self.agrees[positions] & (truth >= 0), truth, wrong)
        forced = torch.zeros_like(logits)
        return forced.scatter(-1, chosen.unsqueeze(-1), FORCED_LOGIT)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
