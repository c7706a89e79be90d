"""What a model pair declares to the decode loop. The loop reads these and nothing else of a pair, so a
pair kind states each of them rather than leaving the loop to probe for them (`models.loading.ModelPair`
is the pair every front end loads)."""

from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

import torch

# The two models of a pair by their role, where a column, a key or a label names one of them
# (the role "draft" is not the method "draft", the draft model writing alone).
TARGET_ROLE = "target"
DRAFT_ROLE = "draft"


@runtime_checkable
class Pair(Protocol):
    target: torch.nn.Module  # the torch weights: the reference target, which a feature head and the config read
    draft: torch.nn.Module | None  # a draft LM or a feature head, or None
    tokenizer: Any
    vocab_size: int | None  # logits are cut to this where target and draft pad their vocabularies differently
    eos_ids: frozenset[int]
    runtime: str  # what runs the target's forwards: "torch", or a runtime named in `engine.runtimes`
    target_runtime: Any  # that runtime's target beside the torch weights (None on torch)
    draft_runtime: Any  # a draft LM exported for the same runtime, or None where the draft runs on torch

    @property
    def device(self) -> torch.device: ...

    @property
    def exactness(self) -> str:
        """What greedy speculative decoding promises against AR on this target as loaded."""

    @property
    def draft_kind(self) -> str | None: ...

    @property
    def drafter_name(self) -> str | None: ...

    def encode(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]: ...

    def check_fits(self, prompt_ids: list[int], max_new_tokens: int) -> None: ...
