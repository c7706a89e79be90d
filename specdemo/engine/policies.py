"""γ policies: how many tokens to draft this round, and when to stop early.

A policy is per-generation state. The decode loop asks it, in order:
  `round_gamma(first_entropy)`  the γ of the round, given the drafter's normalised
                                entropy at the first draft position (None if the
                                policy does not need it, see `needs_first_entropy`),
  `keep_drafting(entropy, top_prob)`  after each drafted token (only when
                                `needs_token_stats`: it costs a host sync per token),
  `update(drafted, accepted)`   after verification.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class _Policy:
    """What a policy does unless it says otherwise: no per-token stop, nothing learnt per round."""

    needs_first_entropy = False
    needs_token_stats = False

    def keep_drafting(self, entropy: float, top_prob: float) -> bool:
        return True

    def update(self, drafted: int, accepted: int) -> None:
        pass


@dataclass
class FixedGamma(_Policy):
    """SD and NASD: always γ drafts (AR is γ = 0)."""

    gamma: int

    def round_gamma(self, first_entropy: float | None) -> int:
        return self.gamma


@dataclass
class EntropyGamma(_Policy):
    """EGAG: γ_t = clamp(floor((1 − Ĥ_t)·γ_max), γ_min, γ_max) with Ĥ_t an EMA of H_t.

    Ĥ_t = β·Ĥ_{t−1} + (1 − β)·H_t, β = ema (0 disables smoothing). The first round has
    no history, so Ĥ_1 = H_1.
    """

    gamma_min: int
    gamma_max: int
    ema: float
    smoothed: float | None = field(default=None, init=False)
    needs_first_entropy = True

    def round_gamma(self, first_entropy: float | None) -> int:
        assert first_entropy is not None
        if self.smoothed is None:
            self.smoothed = first_entropy
        else:
            self.smoothed = self.ema * self.smoothed + (1.0 - self.ema) * first_entropy
        return gamma_from_entropy(self.smoothed, self.gamma_min, self.gamma_max)


def gamma_from_entropy(entropy: float, gamma_min: int, gamma_max: int) -> int:
    # A hair of tolerance so that e.g. (1 − 0.5)·4 is 2, not 1.9999999.
    raw = math.floor((1.0 - entropy) * gamma_max + 1e-9)
    return max(gamma_min, min(gamma_max, raw))


@dataclass
class HeuristicGamma(_Policy):
    """transformers' assisted-generation schedule: +2 after a fully accepted round, −1 otherwise."""

    gamma: int
    gamma_max: int = 32

    def round_gamma(self, first_entropy: float | None) -> int:
        return self.gamma

    def update(self, drafted: int, accepted: int) -> None:
        if drafted and accepted == drafted:
            self.gamma = min(self.gamma_max, self.gamma + 2)
        else:
            self.gamma = max(1, self.gamma - 1)


@dataclass
class ConfidenceStop(_Policy):
    """Draft up to γ_max tokens, stopping once the drafter's top probability drops below a threshold."""

    gamma_max: int
    threshold: float = 0.4
    needs_token_stats = True

    def round_gamma(self, first_entropy: float | None) -> int:
        return self.gamma_max

    def keep_drafting(self, entropy: float, top_prob: float) -> bool:
        return top_prob >= self.threshold
