"""The drafter base: anything that answers "what are your candidates?" and "here is what the
target kept, update yourself", with its capabilities declared; AR's NoDrafter, the wrapper base and
the one drafting loop every model-like drafter shares (`draft_round`).

`ModelDrafter` runs a small LM with its own KV cache across rounds (a causal LM, or an
encoder-decoder model that encodes the source once, in `read_source`).

Drafters of an encoder-decoder pair see the source (the encoder's input) through
`read_source`, before `start` hands them the decoder's first ids: a model drafter encodes
it, tables (NASD's, the context copy's) count its n-grams, so drafts can be copied from it.
`NgramDrafter` (NASD) drafts from an n-gram table built from the prompt and the
target's verified outputs; it has no q, so verification treats it as a point mass.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..sampling import SamplingConfig, normalized_entropy, pick, spread
from ..trace import DRAFTED, FedCounts


@dataclass
class Proposal:
    gamma: int  # the policy's γ for the round (the drafter may propose fewer tokens)
    tokens: torch.Tensor  # [k] draft ids on the device; k is known without reading them
    draft_probs: torch.Tensor | None  # q at each draft position [k, V]; None = point mass
    entropies: torch.Tensor | None  # [k] normalised drafter entropy at each draft position; None without a q
    round_entropy: float | None  # the entropy the policy set γ from, if any
    source: str = DRAFTED  # what drafted the round: DRAFTED or COPIED (trace.py)
    # [k] q(x) of each draft after the sampling filters (the plain softmax when greedy), kept for
    # the trace; None for a drafter without a q (a point mass: n-gram tables, copies).
    q_of_drafts: torch.Tensor | None = None

    @classmethod
    def empty(cls, gamma: int = 0, device: torch.device | str | None = None,
              round_entropy: float | None = None) -> "Proposal":
        return cls(gamma, torch.empty(0, dtype=torch.long, device=device), None, None, round_entropy)


class Drafter:
    """What the decode loop asks of a drafter, with what a drafter that needs nothing more does.

    A drafter declares what it reads and keeps with class attributes, and overrides only the
    calls it needs; the loop reads the flags and calls the methods, never probing for either:
      reads_target_features  `start` gets the target's states over the prompt and `observe` its
                             states at the kept positions (`feature_layers` names extra layers);
      target_top_k > 0       `observe` gets the ids of the target's best tokens at those positions;
      drafts_tokens          False for AR's drafter, which proposes nothing (one token verified a round);
      drafts_trees           `propose_tree` instead of `propose`;
      tree_stepper           the class that grows its trees (`tree_drafting`), where the drafter brings its own;
      learns_online          `learn` after each finished request, off the clock (OSD);
    and `use_cache` / `warm_up` / `close` for a drafter that keeps a model's KV cache.
    Proposals stay on the device: the loop reads a round's drafts back with the target's verdict.
    """

    reads_target_features = False
    feature_layers: tuple[int, ...] = ()
    target_top_k = 0
    drafts_tokens = True
    drafts_trees = False
    tree_stepper = None
    learns_online = False

    @property
    def forwards(self) -> int:
        """Forward passes of a draft model so far (0 for a drafter without one)."""
        return 0

    @property
    def counts(self) -> FedCounts:
        """What its draft model was fed so far, as the decode loop counts FLOPs (`trace.FedCounts`): where a
        drafter reads the prompt in its first round, that read is left out as prefill; nothing for a drafter
        without a model."""
        return FedCounts()

    @property
    def draft_lm(self):
        """The cached LM of the draft model it runs (a KV policy applies to it), or None."""
        return None

    @property
    def batch_group(self):
        """What the rows of a batch whose drafters share it draft together through `propose_together`, one
        forward per draft step for all of them; None: this drafter proposes alone."""
        return None

    @staticmethod
    def join_batch(drafters: list) -> None:
        """Every row of a batch whose drafters share one batch_group, before `start`: what they share (a draft
        LM's batched cache) is made here; nothing for drafters that share only their weights."""

    @staticmethod
    def propose_together(drafters: list, contexts: list[list[int]], policies: list, limits: list[int],
                         sampling: SamplingConfig, generators: list) -> list[Proposal]:
        """Each row's proposal, as each drafter's `propose` would give it alone, for drafters of one batch_group."""
        raise NotImplementedError

    def describe(self, model_name: str | None) -> str:
        """How the page and the benchmark name this drafter (model_name: the pair's name for its draft)."""
        return model_name or type(self).__name__

    def report_kv_peak(self, record: dict, key: str) -> None:
        """Keep record[key] at the most bytes a KV cache of the drafter's own held (one that is no cached
        LM, as a feature head's); a drafter that keeps none has nothing to report."""

    def read_source(self, source_ids: list[int]) -> None:
        """An encoder-decoder pair's source (the encoder's input), before `start`."""

    def use_cache(self, cache: str, max_length: int | None, compile: bool = False,
                  buckets: tuple[int, ...] = (1,)) -> None:
        """The KV cache kind to keep (the loop matches the target's), before `start`."""

    def warm_up(self) -> float:
        """Compile and warm what was compiled; the seconds it took (never part of decoding's)."""
        return 0.0

    def start(self, prompt_ids: list[int], features: torch.Tensor | None = None) -> None:
        """The prompt (and, for a drafter that reads them, the target's states over it)."""

    def propose(self, context: list[int], policy, limit: int, sampling: SamplingConfig,
                generator: torch.Generator | None) -> Proposal:
        raise NotImplementedError

    def observe(self, sequence: list[int], verified_from: int, target_logits: torch.Tensor,
                target_features: torch.Tensor | None = None, target_top: list[list[int]] | None = None) -> None:
        """The target has verified sequence[verified_from:]; target_logits[i] is its
        next-token prediction after sequence[:verified_from + i], for i up to the number
        of drafts it accepted (target_features and target_top: the same rows, when declared)."""

    def learn(self, target: torch.nn.Module, sequence: list[int], answer_start: int, drafted: int,
              accepted: int):
        """A finished request's verified sequence (its answer from `answer_start`), to learn from
        before the next request; what was learnt (None: a drafter that does not adapt)."""
        return None

    def close(self) -> None:
        """Free what the drafter holds (its cache) now, not when it is collected."""


class NoDrafter(Drafter):
    """AR's drafter: every round drafts nothing, and the target adds its one token."""

    drafts_tokens = False

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)

    def describe(self, model_name: str | None) -> str:
        return "none"

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        return Proposal.empty(0, self.device)


class WrappedDrafter(Drafter):
    """A drafter around another (`inner`): everything is `inner`'s unless the wrapper overrides it."""

    def __init__(self, inner: Drafter):
        self.inner = inner
        self.reads_target_features = inner.reads_target_features
        self.feature_layers = inner.feature_layers
        self.target_top_k = inner.target_top_k
        self.learns_online = inner.learns_online

    @property
    def forwards(self) -> int:
        return self.inner.forwards

    @property
    def counts(self) -> FedCounts:
        return self.inner.counts

    @property
    def draft_lm(self):
        return self.inner.draft_lm

    def describe(self, model_name: str | None) -> str:
        return self.inner.describe(model_name)

    def report_kv_peak(self, record: dict, key: str) -> None:
        self.inner.report_kv_peak(record, key)

    def read_source(self, source_ids: list[int]) -> None:
        self.inner.read_source(source_ids)

    def use_cache(self, cache, max_length, compile=False, buckets=(1,)) -> None:
        self.inner.use_cache(cache, max_length, compile=compile, buckets=buckets)

    def warm_up(self) -> float:
        return self.inner.warm_up()

    def start(self, prompt_ids, features=None) -> None:
        self.inner.start(prompt_ids, features)

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        return self.inner.propose(context, policy, limit, sampling, generator)

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None) -> None:
        self.inner.observe(sequence, verified_from, target_logits, target_features, target_top)

    def learn(self, target, sequence, answer_start, drafted, accepted):
        return self.inner.learn(target, sequence, answer_start, drafted, accepted)

    def close(self) -> None:
        self.inner.close()


@dataclass(frozen=True)
class DraftPosition:
    """q at one drafting position with what the γ policy and a greedy pick read from it, reduced once
    over a batch's rows (`draft_positions`); every value stays on the device."""
    q: torch.Tensor  # [V], or [S] over the draft vocabulary `ids`
    entropy: torch.Tensor  # normalised, 0-d
    top: torch.Tensor  # its largest probability, 0-d
    best: torch.Tensor  # that probability's id (the greedy pick), 0-d
    ids: torch.Tensor | None = None  # [S]: the vocabulary ids of q's entries; None: q is over every id
    vocab_size: int | None = None  # V where q holds only the draft vocabulary's entries

    @cached_property
    def probs(self) -> torch.Tensor:
        """q [V] over the whole vocabulary. Spread out of a draft vocabulary only when read: a greedy round
        reads none of it (its pick is `best`, whose q is `top`)."""
        return self.q if self.ids is None else spread(self.q, self.ids, self.vocab_size)

    @property
    def vocab(self) -> int:
        return self.vocab_size or self.q.shape[-1]

    def pick(self, sampling: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
        # Sampling draws here, only when the policy drafts, so a row's random stream is its own.
        return self.best if sampling.greedy else pick(self.probs, sampling, generator)


def draft_positions(probs: torch.Tensor, ids: torch.Tensor | None = None,
                    vocab_size: int | None = None) -> list[DraftPosition]:
    """One DraftPosition per row of q [B, V] (a q [V]: one), each reduction run once over all rows. With
    `ids` [S], probs [B, S] is q over a draft vocabulary (zero at every other of vocab_size ids): the
    reductions read its S columns alone, and a position spreads its q over the whole vocabulary when read.
    A row's entropy equals the one it has alone up to float32 rounding (the sum may split differently)."""
    rows = probs if probs.dim() > 1 else probs.unsqueeze(0)
    top, best = rows.max(-1)
    entropy = normalized_entropy(rows, vocab_size)
    if ids is not None:
        best = ids[best]
    return [DraftPosition(*row, ids=ids, vocab_size=vocab_size)
            for row in zip(rows.unbind(), entropy.unbind(), top.unbind(), best.unbind())]


def draft_round(first: DraftPosition, policy, limit: int, sampling: SamplingConfig,
                generator: torch.Generator | None, advance) -> tuple[Proposal, int]:
    """One round of drafting from the first position (`draft_positions`): γ from the policy, then up
    to min(γ, limit) picks, each fed back with `advance(token) -> the next DraftPosition`
    (all but the last, unless the policy stops early). Returns the proposal and how many drafts
    were fed back.

    Nothing is read back to the host but what the policy must see while drafting: the first
    position's entropy when γ depends on it (EGAG), and the entropy and top probability at
    each later position when the policy may stop early (one read per position)."""
    steps = drafting_steps(first, policy, limit, sampling, generator)
    try:
        token = next(steps)
        while True:
            token = steps.send(advance(token))
    except StopIteration as done:
        return done.value


def drafting_steps(position: DraftPosition, policy, limit: int, sampling: SamplingConfig,
                   generator: torch.Generator | None):
    """`draft_round` as steps from the first position: yields each draft to feed back and is sent the
    next `DraftPosition`; its return value is draft_round's. A batch drives one of these per row, feeds
    every row's draft to the model in one forward and reduces the rows' q in one `draft_positions`."""
    round_entropy = float(position.entropy) if policy.needs_first_entropy else None
    gamma = policy.round_gamma(round_entropy)
    budget = min(gamma, limit)
    tokens: list[torch.Tensor] = []
    dists: list[torch.Tensor] = []
    entropies: list[torch.Tensor] = []
    chosen_q: list[torch.Tensor] = []
    fed = 0
    for i in range(budget):
        if policy.needs_token_stats and (i > 0 or policy.reads_first_token):
            entropy_now, top_prob, *last_q = torch.cat([torch.stack([position.entropy, position.top]),
                                                        *chosen_q[-1:]]).tolist()
            if not policy.keep_drafting(entropy_now, top_prob, position=i, vocab=position.vocab,
                                        last_q=last_q[0] if last_q else None):
                break
        token = position.pick(sampling, generator)
        tokens.append(token)
        entropies.append(position.entropy)
        if sampling.greedy:  # the pick is the argmax, so its q is the top probability
            chosen_q.append(position.top.view(1))
        else:
            probs = position.probs
            dists.append(probs)
            chosen_q.append(probs.gather(-1, token.view(1)))  # q(x) stays on the device
        if i + 1 < budget:
            position = yield token
            fed += 1
    if not tokens:
        return Proposal.empty(gamma, position.q.device, round_entropy), 0
    draft_probs = None if sampling.greedy else torch.stack(dists)
    proposal = Proposal(gamma, torch.stack(tokens), draft_probs, torch.stack(entropies), round_entropy,
                        q_of_drafts=torch.cat(chosen_q))
    return proposal, fed


def top_ids(logits: torch.Tensor, k: int) -> torch.Tensor:
    """[n, k]: the ids of the k best tokens at each position of logits [n, V], best first."""
    return torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices
