"""SD round overhead: how much a decode round costs beyond its model calls.

    round_overhead = measured round time ÷ (γ × one draft step + one verification forward)

The denominator is each model call timed alone, on the pair's device, with the run's cache
kind and compile setting: a round that did nothing but its γ draft steps and its verification
forward would take exactly that long. What a round takes beyond it is the loop's own cost
between the calls (sampling, verification, read-backs, bookkeeping, kernel launches). The same
split per phase says where it goes: the draft phase against γ draft steps, the verify phase
against the verification forward.

Only rounds that drafted exactly γ tokens are counted: a shorter round (the last one, or one
cut at an EOS) has a different denominator.

May import ``engine`` and ``models`` and pandas.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..engine.clock import interleaved_medians
from ..engine.decoding import generate
from ..engine.drafters.feature_drafter import FeatureDrafter
from ..engine.drafters.feature_head import FeatureHead
from ..engine.drafters.published import PublishedHead
from ..engine.targets.lm import CachedLM, buckets_up_to
from ..engine.params import EngineOptions
from ..engine.drafters.policies import FixedGamma
from ..engine.sampling import SamplingConfig, pick, probabilities
from ..engine.trace import Round
from .suite import ALL, SuitePrompt
from ..engine.methods import FIXED_GAMMA

OVERHEAD_COLUMNS = [
    "prompt", "context_tokens", "rounds",
    "round_seconds", "draft_phase_seconds", "verify_phase_seconds",
    "draft_step_seconds", "verify_forward_seconds", "isolated_round_seconds",
    "round_overhead", "draft_overhead", "verify_overhead",
]
GREEDY = SamplingConfig(temperature=0.0)
# One token stands in for every id the isolated calls feed: the cost of a forward does not
# depend on which ids it reads.
_FILLER_TOKEN = 5


@dataclass(frozen=True)
class StepCosts:
    """Median seconds of one draft step and of one verification forward, each timed alone."""

    draft_step: float
    verify_forward: float


@dataclass(frozen=True)
class PromptRounds:
    """One prompt's SD rounds and its model calls timed alone at the rounds' context."""

    name: str
    rounds: Sequence[Round]
    costs: StepCosts
    context_tokens: int


@dataclass(frozen=True)
class OverheadReport:
    table: pd.DataFrame  # OVERHEAD_COLUMNS, one row per prompt, then the "all" row
    summary: str


# ---------------------------------------------------------------------------------------
# The arithmetic: pure, over rounds and costs.

def prompt_row(run: PromptRounds, gamma: int) -> dict:
    full = [r for r in run.rounds if len(r.drafted) == gamma]
    draft_phase = statistics.fmean(r.draft_seconds for r in full) if full else float("nan")
    verify_phase = statistics.fmean(r.verify_seconds for r in full) if full else float("nan")
    return _with_ratios({
        "prompt": run.name, "context_tokens": run.context_tokens, "rounds": len(full),
        "draft_phase_seconds": draft_phase, "verify_phase_seconds": verify_phase,
        "draft_step_seconds": run.costs.draft_step, "verify_forward_seconds": run.costs.verify_forward,
    }, gamma)


def _with_ratios(row: dict, gamma: int) -> dict:
    row["round_seconds"] = row["draft_phase_seconds"] + row["verify_phase_seconds"]
    row["isolated_round_seconds"] = gamma * row["draft_step_seconds"] + row["verify_forward_seconds"]
    row["round_overhead"] = row["round_seconds"] / row["isolated_round_seconds"]
    row["draft_overhead"] = row["draft_phase_seconds"] / (gamma * row["draft_step_seconds"])
    row["verify_overhead"] = row["verify_phase_seconds"] / row["verify_forward_seconds"]
    return row


def overall_row(rows: pd.DataFrame, gamma: int) -> dict:
    """Every full round of every prompt pooled: each prompt weighs as many rounds as it counted,
    so the ratio is all the rounds' time over what their calls would take alone."""
    counted = rows[rows.rounds > 0]
    row = {"prompt": ALL, "rounds": int(rows.rounds.sum())}
    weighed = ["context_tokens", "draft_phase_seconds", "verify_phase_seconds", "draft_step_seconds",
               "verify_forward_seconds"]
    for column in weighed:
        row[column] = np.average(counted[column], weights=counted.rounds) if len(counted) else float("nan")
    return _with_ratios(row, gamma)


def overhead_table(runs: Sequence[PromptRounds], gamma: int) -> pd.DataFrame:
    rows = pd.DataFrame([prompt_row(run, gamma) for run in runs], columns=OVERHEAD_COLUMNS)
    table = pd.concat([rows, pd.DataFrame([overall_row(rows, gamma)])], ignore_index=True)
    return table[OVERHEAD_COLUMNS]


def describe(table: pd.DataFrame, gamma: int, where: str) -> str:
    overall = table.set_index("prompt").loc[ALL]
    rounds = int(overall.rounds)
    if not rounds:
        return (f"SD round overhead at γ={gamma} on {where}: no round drafted γ tokens; "
                "raise --max-new-tokens")
    ms = 1000
    return (f"SD round overhead at γ={gamma} on {where}: {overall.round_overhead:.3f} over {rounds} full "
            f"rounds — a round takes {overall.round_seconds * ms:.2f} ms, its calls alone "
            f"{gamma} × {overall.draft_step_seconds * ms:.2f} ms draft + {overall.verify_forward_seconds * ms:.2f} ms "
            f"verify = {overall.isolated_round_seconds * ms:.2f} ms\n"
            f"  draft phase {overall.draft_overhead:.3f} × its γ draft steps, verify phase "
            f"{overall.verify_overhead:.3f} × its verification forward (goal on a GPU: ≤ 1.15)")


# ---------------------------------------------------------------------------------------
# Timing each model call alone.

def _draft_lm_step(pair, context: list[int], cache: str, max_length: int, compile: bool):
    """One drafted token of a draft LM, as `ModelDrafter` makes it: a one-token forward with
    its KV cache, q, and the pick. Returns (step, close)."""
    lm = CachedLM(pair.draft, pair.vocab_size, cache=cache, max_length=max_length, compile=compile, buckets=(1, 2))
    lm.prefill(context)
    lm.warm_up()
    token = torch.tensor([_FILLER_TOKEN], device=lm.device)

    def step():
        lm.rollback(len(context))
        return pick(probabilities(lm.feed(token, 1)[0], GREEDY), GREEDY, None)

    return step, lm.close


def _feature_head_step(head: FeatureHead, features: torch.Tensor, context: list[int]):
    """One drafted token of a feature head, as `FeatureDrafter` makes it: a head step from its
    previous prediction, q over the subset, and the pick."""
    drafter = FeatureDrafter(head)
    drafter.start(context, features[:-1])
    drafter.propose(context, FixedGamma(1), 1, GREEDY, None)  # reads the prompt's features
    base, feature = drafter.cache.length, features[-1:]

    def step():
        drafter.cache.rollback(base)
        return pick(drafter.q_of(drafter.head_step(feature, [_FILLER_TOKEN], base), GREEDY), GREEDY, None)

    return step, drafter.close


@torch.inference_mode()
def isolated_costs(pair, context: list[int], gamma: int, cache: str = "dynamic", compile: bool = False,
                   calls: int = 30, warmup: int = 3) -> StepCosts:
    """Median seconds of one draft step and of one verification forward of γ + 1 tokens at
    `context`, each alone, interleaved so that both see the same machine.

    cache is the concrete kind ("static" or "dynamic"), as the decode loop got it."""
    if isinstance(pair.draft, PublishedHead):
        raise ValueError(f"the round overhead times a draft LM's or our feature head's step; this pair drafts with "
                         f"a {pair.draft.name}, whose step it does not time yet")
    device = pair.device
    reads_features = isinstance(pair.draft, FeatureHead)
    max_length = len(context) + 2 * (gamma + 1)
    target = CachedLM(pair.target, pair.vocab_size, cache=cache, max_length=max_length, compile=compile,
                      buckets=buckets_up_to(gamma + 1))
    close_draft = None
    try:
        # Like the loop, the target holds all but the last token: each verification feeds that
        # token and the γ drafts, and is rolled back before the next.
        if reads_features:
            features = target.prefill(context, hidden=True)
            target.rollback(len(context) - 1)
            draft_step, close_draft = _feature_head_step(pair.draft, features, context)
        else:
            target.prefill(context[:-1])
            draft_step, close_draft = _draft_lm_step(pair, context, cache, max_length, compile)
        target.warm_up()
        drafts = torch.full((gamma,), _FILLER_TOKEN, dtype=torch.long, device=device)
        n_hidden = gamma + 1 if reads_features else 0

        def verify_forward():
            return target.logits(context, gamma + 1, n_hidden, then=drafts)

        return StepCosts(**interleaved_medians(dict(draft_step=draft_step, verify_forward=verify_forward), calls,
                                               warmup=warmup, between=lambda: target.rollback(len(context) - 1),
                                               device=device))
    finally:
        target.close()
        if close_draft is not None:
            close_draft()


# ---------------------------------------------------------------------------------------
# The measurement.

def spread_over_categories(prompts: Sequence[SuitePrompt], count: int) -> list[SuitePrompt]:
    """The first `count` prompts taking one category after another (the first prompt of each
    category, then the second of each, ...), so a few prompts still span several kinds of text."""
    rank: dict[str, int] = {}
    keyed = []
    for index, prompt in enumerate(prompts):
        rank[prompt.category] = rank.get(prompt.category, -1) + 1
        keyed.append((rank[prompt.category], index, prompt))
    return [prompt for _, _, prompt in sorted(keyed, key=lambda k: k[:2])[:count]]


def measure_round_overhead(pair, prompts: Sequence[tuple[str, list[int]]], gamma: int = 4,
                           max_new_tokens: int = 64, cache: str | None = "auto", compile: bool = False,
                           calls: int = 30) -> OverheadReport:
    """Greedy SD over (name, token ids) prompts, then each prompt's model calls timed alone at
    the middle of its generation (the rounds' mean context)."""
    if pair.draft is None:
        raise ValueError("round overhead: this pair has no draft, so SD has no rounds to measure; "
                         "load a pair with a draft model or a feature head")
    if getattr(pair, "is_encoder_decoder", False):
        raise ValueError("round overhead: measured on decoder-only pairs (a prompt's context is the decoder's); "
                         f"{pair.target_ref!r} is an encoder-decoder model")
    if not prompts:
        raise ValueError("round overhead: no prompts to measure")
    kind = EngineOptions.from_values(cache=cache, compile=compile).cache_for(pair.device)
    # SD drafts γ tokens every round: with γ_max = γ the loop's static steps stop at γ + 1 tokens, the
    # buckets `isolated_costs` times, and no step is compiled for a feed that no round makes.
    settings = dict(method=FIXED_GAMMA, gamma=gamma, gamma_max=gamma, temperature=0.0, max_new_tokens=max_new_tokens,
                    seed=0, cache=kind, compile=compile)
    generate(pair, prompts[0][1], **settings)  # untimed: first calls, and compilation with compile on
    runs = []
    for name, ids in prompts:
        result = generate(pair, ids, **settings)
        context = list(ids) + result.token_ids[: len(result.token_ids) // 2]
        costs = isolated_costs(pair, context, gamma, kind, compile, calls)
        runs.append(PromptRounds(name, result.rounds, costs, len(context)))
    table = overhead_table(runs, gamma)
    where = f"{pair.device} ({kind} cache, {'compiled' if compile else 'eager'})"
    return OverheadReport(table, describe(table, gamma, where))
