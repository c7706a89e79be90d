"""A planted text that both models of a random-weight pair follow, so acceptance is set, not measured.

Two random models agree on almost nothing, so SD on them would reject every draft and its
rounds would never show what a round of accepted drafts costs. Forcing the draft to copy the
target's own greedy text is not enough: random weights give near-uniform logits, bfloat16
kernels of different shapes (a one-row step, a (γ + 1)-row verification, a static cache)
break their near-ties differently, and once a method leaves that text every draft is refused.

`ForcedAcceptance` plants one seeded pseudo-random text, indexed by absolute position, in
both models (the row at position p predicts the token at p + 1):

- the target's LM head answers a point mass (logit +30, the rest 0) on the planted token,
  so every method's greedy output is the planted text in any dtype or kernel shape;
- the draft's LM head answers the planted token where a fixed mask over positions (from
  `seed`, true at share `rate`) agrees, and a wrong token elsewhere, so the per-position
  acceptance is `rate` by construction, and a round stops at its first refused position;
- a pre-hook on each decoder's rotary-position module reads the positions of the rows being
  computed.

The text depends on positions only, not on the prompt: after a prompt of n tokens every
method writes `text_after(n, count)`. Positions past `capacity` wrap around. Neither the
planted nor the wrong tokens are special ones (`avoid`: EOS, padding), so nothing stops early
and no draft is cut at an EOS.

Both models still run their whole forward, so every cost is real; only their answers are
forced. The hooks are tensor operations only (no read-back, no Python branch on data), so they
run unchanged inside `torch.compile` and CUDA graphs, and they serve our decode loop,
transformers' static `generate` and its assisted generation alike, since all call the same modules.

May import torch only.
"""

from __future__ import annotations

from typing import Iterable

import torch

FORCED_LOGIT = 30.0
DEFAULT_CAPACITY = 8192  # positions the planted text covers before it wraps around


class _PositionalAnswer:
    """Hooks on one causal LM: its LM head answers a point mass on `answers[position]`."""

    def __init__(self, model: torch.nn.Module, answers: torch.Tensor):
        rotary = getattr(model.get_decoder(), "rotary_emb", None)
        if rotary is None:
            raise ValueError(f"forced acceptance reads positions from a rotary module; {type(model).__name__} has none")
        self.answers = answers
        self.positions: torch.Tensor | None = None
        self.handles = [
            rotary.register_forward_pre_hook(self._read_positions, with_kwargs=True),
            model.get_output_embeddings().register_forward_hook(self._answer),
        ]

    def _read_positions(self, module, args, kwargs):
        positions = kwargs.get("position_ids")
        if positions is None and len(args) > 1:
            positions = args[1]
        self.positions = positions
        return None

    def _answer(self, module, inputs, logits: torch.Tensor) -> torch.Tensor:
        rows = logits.shape[-2]
        positions = torch.remainder(self.positions[..., -rows:], self.answers.shape[0]).expand(logits.shape[:-1])
        chosen = self.answers[positions]
        return torch.zeros_like(logits).scatter(-1, chosen.unsqueeze(-1), FORCED_LOGIT)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


class ForcedAcceptance:
    """Plants a text in `target` and `draft` (transformers causal LMs with rotary-position modules)."""

    def __init__(self, target: torch.nn.Module, draft: torch.nn.Module, rate: float, seed: int = 0,
                 avoid: Iterable[int] = (), vocab: int | None = None, capacity: int = DEFAULT_CAPACITY):
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"forced acceptance rate must be in [0, 1], got {rate}")
        self.rate = rate
        limit = min(m.get_output_embeddings().out_features for m in (target, draft))
        limit = min(limit, vocab) if vocab is not None else limit
        banned = set(avoid)
        allowed = torch.tensor([t for t in range(limit) if t not in banned], dtype=torch.long)
        if len(allowed) < 2:
            raise ValueError("forced acceptance needs two ordinary tokens at least")
        generator = torch.Generator().manual_seed(seed)
        picks = torch.randint(len(allowed), (capacity,), generator=generator)
        # A per-position shift picks the wrong token: never the planted one, not always one id.
        shifts = torch.randint(1, len(allowed), (capacity,), generator=generator)
        device = next(target.parameters()).device
        self.text = allowed[picks].to(device)
        self.wrong = allowed[(picks + shifts) % len(allowed)].to(next(draft.parameters()).device)
        self.agrees = (torch.rand(capacity, generator=generator) < rate).to(self.wrong.device)
        drafts = torch.where(self.agrees, self.text.to(self.wrong.device), self.wrong)
        self._hooked = [_PositionalAnswer(target, self.text), _PositionalAnswer(draft, drafts)]

    @classmethod
    def on_pair(cls, pair, rate: float, seed: int = 0) -> "ForcedAcceptance":
        """Hooks on a loaded pair, its special tokens avoided and its tokenizer's ids only."""
        tokenizer = pair.tokenizer
        avoid = set(pair.eos_ids) | set(tokenizer.all_special_ids)
        return cls(pair.target, pair.draft, rate, seed, avoid=avoid, vocab=len(tokenizer))

    def text_after(self, prompt_length: int, count: int) -> list[int]:
        """The `count` tokens every greedy method writes after a prompt of `prompt_length` tokens."""
        positions = torch.arange(prompt_length - 1, prompt_length - 1 + count) % self.text.shape[0]
        return self.text.cpu()[positions].tolist()

    def agrees_after(self, prompt_length: int, count: int) -> list[bool]:
        """Whether the draft proposes the planted token at each of those `count` tokens."""
        positions = torch.arange(prompt_length - 1, prompt_length - 1 + count) % self.agrees.shape[0]
        return self.agrees.cpu()[positions].tolist()

    def remove(self) -> None:
        for hooked in self._hooked:
            hooked.remove()
        self._hooked = []
