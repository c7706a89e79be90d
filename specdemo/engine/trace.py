"""The one record of a generation: which token came from where, round by round.

The page, the CSV exports, the benchmark and the tests all read a `GenerationResult`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .pair import DRAFT_ROLE, TARGET_ROLE
from .targets.memory import MEMORY_STATS

# Where a generated token came from.
ACCEPTED = "accepted"  # a draft the target kept
CORRECTED = "corrected"  # the target's token after a rejected draft
BONUS = "bonus"  # the target's extra token after every draft was kept
TARGET = "target"  # the target's token in a round that drafted nothing (AR, NASD with no match)
REJECTED = "rejected"  # a draft the target refused (in rounds, never in the output)
ORIGINS = (ACCEPTED, CORRECTED, BONUS, TARGET)

# What drafted a round.
# The drafter itself (a draft model, a feature head, NASD's table): the rounds table's source says "draft".
DRAFTED = DRAFT_ROLE
COPIED = "copy"  # copied from the context (copy_n)


@dataclass
class TokenRecord:
    id: int
    text: str
    origin: str
    round: int


@dataclass(frozen=True)
class DraftDecision:
    """What decided one drafted token: q(x) and p(x) after the sampling filters, and the
    probability that the target kept it. A tree of drafts can give its nodes the same fields.

    accept_prob is min(1, p/q) when sampling; when greedy it is 1 if the token is the target's
    argmax and 0 otherwise. A point mass (an n-gram or a copied draft) has q = 1, so it is kept
    with probability p. `decided` is False for drafts after the round's first rejection: the
    target computed their p, but nothing was decided about them.
    """

    token: int
    q: float
    p: float
    accept_prob: float
    accepted: bool
    decided: bool = True
    point_mass: bool = False
    # On the rejected draft only: the token the target put in its place, and its p.
    correction: int | None = None
    correction_p: float | None = None


@dataclass(frozen=True)
class StopNote:
    """Why a round stopped drafting before its cap: the rule's name, the value it read, the
    threshold that value crossed, and the position (0 = the round's first draft) of the draft
    it did not make."""

    rule: str
    value: float
    threshold: float
    position: int


@dataclass
class TreeRecord:
    """A round's tree of drafts. Node i (1..n) is list index i − 1; parent 0 is the root (the
    last token of the context)."""

    tokens: list[int]
    parents: list[int]
    depths: list[int]
    q: list[float | None]  # the drafter's probability of the node's token at its parent (None: point mass)
    p: list[float]  # the target's probability of the node's token at its parent
    path: list[int]  # the kept nodes, from the root's child down
    stops: dict[int, StopNote] = field(default_factory=dict)  # node (0: the root) -> why a rule gave it no children

    def stop_at_path_end(self) -> StopNote | None:
        """The note of the node where the kept path ends, if a stop rule cut the tree there."""
        return self.stops.get(self.path[-1] if self.path else 0)

    @property
    def nodes(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)


@dataclass
class FedCounts:
    """What one model computed: its forwards, the tokens fed through its body and the rows of logits its
    output head computed (the rows a forward asked for). Each model wrapper counts its own, on every runtime."""

    forwards: int = 0
    tokens: int = 0
    logit_rows: int = 0

    def add(self, tokens: int, logit_rows: int) -> None:
        """One forward that fed `tokens` and computed `logit_rows` rows of logits."""
        self.forwards += 1
        self.tokens += tokens
        self.logit_rows += logit_rows

    def copy(self) -> FedCounts:
        return FedCounts(self.forwards, self.tokens, self.logit_rows)

    def since(self, earlier: FedCounts) -> FedCounts:
        """What was counted after `earlier` (a copy taken then)."""
        return FedCounts(self.forwards - earlier.forwards, self.tokens - earlier.tokens,
                         self.logit_rows - earlier.logit_rows)

    def flops(self, parameters: tuple[int, int]) -> float:
        """An estimate of the multiply-adds, ×2: (body, head) matmul parameters × the tokens each saw."""
        body, head = parameters
        return 2.0 * (body * self.tokens + head * self.logit_rows)


# Two different quantities, each with its own name on every surface (tables, charts, CSVs, CLI).
ACCEPTANCE_LABEL = "acceptance (accepted ÷ drafted)"  # the stats' `acceptance_rate`
ALPHA_LABEL = "α (Leviathan, per token)"  # the stats' `alpha` (`leviathan_alpha`)


def leviathan_alpha(accepted: float, rejected_rounds: float) -> float:
    """Leviathan's per-token α: each round is a run of kept drafts ended by one rejection or by none, so α is
    accepted / (accepted + rounds that ended in a rejection). Not `acceptance_rate` (accepted ÷ drafted)."""
    trials = accepted + rejected_rounds
    return accepted / trials if trials else math.nan


@dataclass
class Round:
    index: int
    gamma: int  # the policy's draft length for this round (0 for AR)
    entropy: float | None  # the drafter entropy that set γ (EGAG), if any
    drafted: list[int]
    accepted: int
    next_token: int | None  # correction or bonus; None when an accepted EOS ended the round
    draft_entropies: list[float]
    draft_seconds: float
    verify_seconds: float
    end_seconds: float  # since the generation started, prefill included
    new_tokens: list[int] = field(default_factory=list)  # what the round added to the output
    source: str = ""  # DRAFTED, COPIED, or "" for a round that drafted nothing
    decisions: list[DraftDecision] = field(default_factory=list)  # one per drafted token, in order
    next_p: float | None = None  # the target's p of next_token where it follows (filters applied)
    # A tree round's whole tree; `drafted` is then its kept path and the first child refused after it.
    tree: TreeRecord | None = None
    # Where and why the policy stopped drafting before γ; None when the round ran to its cap (or
    # its policy has no per-token stop).
    early_stop: StopNote | None = None

    @property
    def nodes_drafted(self) -> int:
        return self.tree.nodes if self.tree is not None else len(self.drafted)

    @property
    def rejected(self) -> list[int]:
        return self.drafted[self.accepted :]

    @property
    def next_origin(self) -> str:
        if not self.drafted:
            return TARGET
        return BONUS if self.accepted == len(self.drafted) else CORRECTED


@dataclass
class GenerationResult:
    method: str
    params: dict[str, Any]
    prompt_ids: list[int]
    rounds: list[Round] = field(default_factory=list)
    tokens: list[TokenRecord] = field(default_factory=list)
    text: str = ""
    prefill_seconds: float = 0.0
    seconds: float = 0.0
    target_forwards: int = 0
    draft_forwards: int = 0
    stop_reason: str | None = None  # "eos", "max_new_tokens" or None while running
    done: bool = False
    cache: str = "dynamic"  # the target's KV cache kind: "dynamic" or "static"
    # What ran the target's forwards: "torch", or "onnx fp32" / "onnx int4" ... (the runtime and its weights'
    # precision, since an int4 target is a different model from the fp32 one)
    runtime: str = "torch"
    # Which runtime ran the target and why, in one line ("the target on onnx (auto): …", "on the torch copy of
    # the target: …"); set where the pair and the method are matched up, "" where nobody said.
    runtime_reason: str = ""
    # What greedy decoding promises against AR on the target as loaded: "bit-exact" (each verified row
    # computes as AR's step), "exact at float32", or "up to near-ties at bfloat16" (…int4, …), where
    # a near-tie can round the other way and leave AR's text. "" where the pair did not say.
    exactness: str = ""
    drafter: str = "none"  # what drafted: the pair's draft, NASD's table, or none (AR)
    compile_seconds: float = 0.0  # compile and warm-up before the first round; never part of `seconds`
    threads: int = 1  # torch's intra-op threads while it decoded (CPU speeds depend on it)
    note: str = ""  # what the method changed in the request, said to the user (e.g. a capped max_new_tokens)
    # Encoder-decoder pairs: the decoder's ids before the output (its start token); None otherwise.
    decoder_prefix: list[int] | None = None
    # Weight bytes and peak KV-cache bytes of each model (memory.MEMORY_STATS), kept up to date by the run.
    memory: dict[str, int] = field(default_factory=dict)
    # What an online drafter learnt from this request once it finished (OSD's `online.Lesson`), off the clock.
    lesson: Any | None = None
    # Requests decoded together through one target forward a round (`engine.batch`), and this one's place
    # among them; a batch's rows count their times from the batch's start, so `seconds` is the latency.
    batch_size: int = 1
    batch_row: int = 0
    batch_rows_drafting: list[int] = field(default_factory=list)  # a batch's rows that drafted, each round
    # The writer's top-1 minus top-2 logit where it chose each new token, a round's worth at a time, left on the
    # device so that a round still reads back once; `top2_margins` reads them all when asked.
    margin_parts: list = field(default_factory=list, repr=False)
    # What decoding fed each model ("target", "draft"; the prompt's prefill not counted), counted by the model
    # wrappers the loop runs, and each model's matmul parameters (body, head): the FLOP estimates come from these
    # two alone. Empty where a run did not count them (a batch, whose forwards feed every request at once).
    fed: dict[str, FedCounts] = field(default_factory=dict)
    parameters: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def output_context(self) -> list[int]:
        """The ids the output continues: the prompt, or an encoder-decoder's decoder prefix."""
        return self.prompt_ids if self.decoder_prefix is None else self.decoder_prefix

    @property
    def top2_margins(self) -> list[float]:
        """The margin of each new token (NaN where unknown): AR's are where another output's first divergence
        is judged a near-tie or not (`engine.divergence`)."""
        if len(self.margin_parts) != 1 or not isinstance(self.margin_parts[0], list):
            self.margin_parts = [[float(m) for part in self.margin_parts
                                  for m in (part.tolist() if hasattr(part, "tolist") else part)]]
        return self.margin_parts[0]

    @property
    def token_ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    @property
    def off_clock_seconds(self) -> float:
        """What the call spent beside decoding: compiling, and an online drafter's learning (OSD)."""
        return self.compile_seconds + (self.lesson.seconds if self.lesson is not None else 0.0)

    @property
    def stats(self) -> dict[str, Any]:
        return summarize(self)


def summarize(result: GenerationResult) -> dict[str, Any]:
    rounds = result.rounds
    new_tokens = len(result.tokens)
    drafted = sum(r.nodes_drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    rejected_rounds = sum(1 for r in rounds if r.accepted < len(r.drafted))
    drafting_rounds = [r for r in rounds if r.gamma > 0]
    token_entropies = [e for r in rounds for e in r.draft_entropies]
    seconds = result.seconds
    return {
        "method": result.method,
        "new_tokens": new_tokens,
        "rounds": len(rounds),
        "seconds": seconds,
        "tokens_per_s": new_tokens / seconds if seconds > 0 else math.nan,
        "ttft_s": rounds[0].end_seconds if rounds else math.nan,
        "prefill_s": result.prefill_seconds,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else math.nan,
        "alpha": leviathan_alpha(accepted, rejected_rounds),
        "rejected_rounds": rejected_rounds,
        "mean_accepted_tokens": sum(len(r.new_tokens) for r in rounds) / len(rounds) if rounds else math.nan,
        "target_forwards": result.target_forwards,
        "draft_forwards": result.draft_forwards,
        "target_forwards_per_token": result.target_forwards / new_tokens if new_tokens else math.nan,
        **fed_figures(result, new_tokens),
        "copied_rounds": sum(1 for r in rounds if r.source == COPIED),
        "mean_gamma": sum(r.gamma for r in drafting_rounds) / len(drafting_rounds) if drafting_rounds else 0.0,
        "mean_drafted": drafted / len(rounds) if rounds else math.nan,
        "tree_rounds": sum(1 for r in rounds if r.tree is not None),
        "mean_entropy": sum(token_entropies) / len(token_entropies) if token_entropies else math.nan,
        "draft_seconds": sum(r.draft_seconds for r in rounds),
        "verify_seconds": sum(r.verify_seconds for r in rounds),
        "stop_reason": result.stop_reason,
        "cache": result.cache,
        "runtime": result.runtime,
        "runtime_reason": result.runtime_reason,
        "exactness": result.exactness,
        "drafter": result.drafter,
        "compile_seconds": result.compile_seconds,
        "threads": result.threads,
        "batch": result.batch_size,
        "note": result.note,
        **{name: result.memory.get(name, 0) for name in MEMORY_STATS},
    }


def fed_figures(result: GenerationResult, new_tokens: int) -> dict[str, float]:
    """Per new token, decoding only: the draft's forwards, and each model's FLOPs (an estimate: 2 × matmul
    parameters × tokens fed, the head's only for the logit rows computed; attention over the context is not
    counted; a drafter without a model, NASD's table, computes none). FLOPs are NaN where the run did not count
    what it fed (a batch), and the draft's forwards then its trace's count (`draft_forwards`, prefill included)."""
    def per_token(value: float) -> float:
        return value / new_tokens if new_tokens else math.nan

    draft = result.fed.get(DRAFT_ROLE)
    forwards = draft.forwards if draft is not None else result.draft_forwards
    figures = {"draft_forwards_decoding": forwards, "draft_forwards_per_token": per_token(forwards)}
    for role in (TARGET_ROLE, DRAFT_ROLE):
        fed = result.fed.get(role)
        figures[f"{role}_flops_per_token"] = (per_token(fed.flops(result.parameters.get(role, (0, 0))))
                                              if fed is not None else math.nan)
    return figures
