"""γ policies: how many tokens to draft this round, and when to stop early.

A policy is per-generation state. The decode loop asks it, in order:
  `round_gamma(first_entropy)`  the γ of the round, given the drafter's normalised
                                entropy at the first draft position (None if the
                                policy does not need it, see `needs_first_entropy`),
  `keep_drafting(entropy, top_prob, position=, vocab=, last_q=)`  before each draft after
                                the first (only when `needs_token_stats`: it costs a host
                                sync per token; `reads_first_token` asks before the first
                                one too), with the drafter's normalised entropy and top
                                probability at that position, its index in the round, the
                                vocabulary size and q of the previous draft,
  `update(drafted, accepted)`   after verification,
  `early_stop()`                what the trace records of the round: where and why
                                drafting stopped before γ (None when it did not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..trace import StopNote


class Policy:
    """What a policy does unless it says otherwise: no per-token stop, nothing learnt per round."""

    needs_first_entropy = False
    needs_token_stats = False
    reads_first_token = False  # keep_drafting is asked at position 0 too (a stop there drafts nothing)
    budget = 0  # the most nodes a round's tree may hold (tree policies; a chain policy drafts no tree)

    def keep_drafting(self, entropy: float, top_prob: float, **where) -> bool:
        return True

    def update(self, drafted: int, accepted: int) -> None:
        pass

    def early_stop(self) -> StopNote | None:
        """Where and why the round just drafted stopped before its cap (None: it did not)."""
        return None


@dataclass
class FixedGamma(Policy):
    """SD and NASD: always γ drafts (AR is γ = 0)."""

    gamma: int

    def round_gamma(self, first_entropy: float | None) -> int:
        return self.gamma


@dataclass
class EntropyGamma(Policy):
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
class HeuristicGamma(Policy):
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


class _TokenStop(Policy):
    """Draft up to γ_max tokens, asking `stop_value` at each position after the first; the round
    ends where it crosses the threshold. `stops` keeps, per round, where and why it ended (None
    when it ran to its cap); `early_stop` hands the round's note to the trace."""

    needs_token_stats = True
    rule = ""

    def round_gamma(self, first_entropy: float | None) -> int:
        self.stops.append(None)
        self.start_round()
        return self.gamma_max

    def start_round(self) -> None:
        pass

    def keep_drafting(self, entropy: float, top_prob: float, **where) -> bool:
        value = self.stop_value(entropy, top_prob, **where)
        position = where.get("position", 0)
        if position == 0 or not self.crosses(value):
            return True
        self.stops[-1] = StopNote(self.rule, value, self.threshold, position)
        return False

    def early_stop(self) -> StopNote | None:
        return self.stops[-1] if self.stops else None

    def crosses(self, value: float) -> bool:
        return value > self.threshold


@dataclass
class ConfidenceStop(_TokenStop):
    """Draft up to γ_max tokens, stopping once the drafter's top probability drops below a threshold
    (transformers' confidence threshold for assisted generation)."""

    gamma_max: int
    threshold: float = 0.4
    stops: list = field(default_factory=list)
    rule = "top probability"

    def stop_value(self, entropy: float, top_prob: float, **where) -> float:
        return top_prob

    def crosses(self, value: float) -> bool:
        return value < self.threshold


@dataclass
class AdaEDLStop(_TokenStop):
    """AdaEDL: stop drafting once the entropy lower bound on the next draft's acceptance,
    1 − √(scale·H(q)) with H in nats, falls below λ (`threshold`).

    The bound follows from acceptance = 1 − TV(p, q) with Pinsker's inequality and the draft's
    entropy standing in for its divergence from the target; `scale` absorbs how loose that is.
    λ is fixed here (the paper also adapts it to the running acceptance rate)."""

    gamma_max: int
    threshold: float = 0.5
    scale: float = 0.1
    stops: list = field(default_factory=list)
    rule = "acceptance bound"

    def stop_value(self, entropy: float, top_prob: float, vocab: int = 0, **where) -> float:
        nats = entropy * math.log(vocab) if vocab > 1 else entropy
        return 1.0 - math.sqrt(max(0.0, self.scale * nats))

    def node_value(self, entropy: float, vocab: int) -> float:
        """The rule's value at one tree node from its q's normalised entropy alone."""
        return self.stop_value(entropy, 0.0, vocab=vocab)

    def crosses(self, value: float) -> bool:
        return value < self.threshold


@dataclass
class TokenEntropyStop(_TokenStop):
    """EGAG per token: stop once a draft position's normalised entropy, smoothed within the
    round (Ĥ_0 = H_0, Ĥ_i = β·Ĥ_{i−1} + (1 − β)·H_i, β = ema), exceeds the threshold."""

    gamma_max: int
    threshold: float = 0.25
    ema: float = 0.0
    stops: list = field(default_factory=list)
    smoothed: float | None = field(default=None, init=False)
    reads_first_token = True
    rule = "entropy"

    def start_round(self) -> None:
        self.smoothed = None

    def stop_value(self, entropy: float, top_prob: float, **where) -> float:
        if self.smoothed is None:
            self.smoothed = entropy
        else:
            self.smoothed = self.ema * self.smoothed + (1.0 - self.ema) * entropy
        return self.smoothed

    def node_value(self, entropy: float, vocab: int) -> float:
        """At a tree node: the node's own entropy (a tree's paths share no single running average)."""
        return entropy


@dataclass
class PredictedRejectionStop(_TokenStop):
    """SpecDec++: a trained head predicts each draft's rejection given the drafts before it were
    kept; the round stops before the draft that would lift P(any rejection so far) =
    1 − Π(1 − r_i) above the threshold. `head` maps a position's statistics to r_i (see
    engine.acceptance_head); `features` builds its input."""

    gamma_max: int
    head: object
    features: object
    threshold: float = 0.5
    stops: list = field(default_factory=list)
    kept: float = field(default=1.0, init=False)  # Π(1 − r_i) over the round's positions so far
    lowest_top: float = field(default=1.0, init=False)
    reads_first_token = True
    rule = "predicted rejection"

    def start_round(self) -> None:
        self.kept, self.lowest_top = 1.0, 1.0

    def stop_value(self, entropy: float, top_prob: float, position: int = 0, last_q: float | None = None,
                   **where) -> float:
        self.lowest_top = min(self.lowest_top, top_prob)
        reject = self.head.reject_probability(self.features(entropy, top_prob, position, last_q, self.lowest_top))
        self.kept *= 1.0 - reject
        return 1.0 - self.kept
