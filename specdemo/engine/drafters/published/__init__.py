"""Draft heads people publish (EAGLE-1/2, EAGLE-3 and vLLM's speculators' EAGLE-3, Medusa), read in
their own layouts and run as drafters of this project.

Each layout has a module: `eagle` (one decoder layer over fc(embedding, final state), drafting through
the target's LM head), `eagle3` (three of the target's layers fused by `fc`, attention over
[embedding; fused state], its own norm and LM head over a draft vocabulary mapped by `d2t`) and
`medusa` (K residual heads, head k guessing the token k + 2 places ahead of a verified position).
A head declares what it reads from the target (`feature_layers`) and hands the decode loop a drafter
(`PublishedHead.drafter`); the loop never learns its name. Files and config fields are read by
`specdemo.models.published`; this package imports torch and transformers only.
"""

from .base import KIND_NAMES, PUBLISHED_KINDS, PublishedHead
from .eagle import EagleHead
from .eagle3 import Eagle3Head
from .medusa import MedusaHead

__all__ = ["KIND_NAMES", "PUBLISHED_KINDS", "PublishedHead", "EagleHead", "Eagle3Head", "MedusaHead"]
