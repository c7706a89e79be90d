"""Drafters: every kind of draft (a small LM, n-grams, the feature head, retrieval, copying from the
context, trees of each) and the γ policies that decide how far a round drafts.

`Drafter` (in `base`) is the one interface the decode loop knows: declared capabilities, a proposal
a round. A new kind of drafter is one new module here.
"""

from .base import Drafter, NoDrafter, Proposal, WrappedDrafter

__all__ = ["Drafter", "NoDrafter", "Proposal", "WrappedDrafter"]
