"""One round of a chain method (AR, SD, NASD, EGAG …): draft ≤ γ tokens, verify them in one
forward, keep a prefix, add the writer's own token.

Nothing comes back to the host until the round's one read: the writer verifies every draft
from the device (an EOS among them included, cut afterwards), and p, q and the acceptance
probability of every draft travel back with the verdict.
"""

from __future__ import annotations

import torch

from .drafters.base import Proposal, top_ids
from .rounds import Decoding, RoundOutcome, cut_verdict_at_eos, read_together
from .sampling import decision_values, probabilities, verify_on_device
from .trace import DraftDecision


def chain_round(run: Decoding, sequence: list[int], limit: int) -> RoundOutcome:
    """limit: the most drafts the output has room for (the writer's own token comes on top)."""
    proposal = run.drafter.propose(sequence, run.policy, limit, run.sampling, run.generator)
    run.clock.lap()
    n_verified = len(proposal.tokens) + 1
    logits = run.writer.logits(sequence, n_verified, n_verified if run.drafter.reads_target_features else 0,
                               then=proposal.tokens)
    return settle_chain(run, proposal, logits, run.writer.hidden)


def settle_chain(run: Decoding, proposal: Proposal, logits: torch.Tensor,
                 hidden: torch.Tensor | None) -> RoundOutcome:
    """A proposal's verdict from the writer's logits [k + 1, V] after the context and each of its k
    drafts (and their hidden states, for a drafter that reads them): everything a round does after
    its one verification forward, whichever forward that was (one request's, or a batch's row)."""
    drafter, writer, sampling = run.drafter, run.writer, run.sampling
    scores = logits if sampling.greedy else probabilities(logits, sampling)
    verdict = verify_on_device(scores, proposal.tokens, proposal.draft_probs, sampling, run.generator)
    values, next_p = decision_values(scores, proposal.tokens, proposal.q_of_drafts, verdict, sampling)
    top = top_ids(logits, drafter.target_top_k) if drafter.target_top_k else None
    (accepted, next_token), drafted, entropies, top, values, (next_p,) = read_together(
        verdict, proposal.tokens, proposal.entropies, top, values, next_p)
    writer.note_fed(drafted)
    drafts, accepted, next_token = cut_verdict_at_eos(drafted, accepted, next_token, run.eos_ids)
    return RoundOutcome(
        gamma=proposal.gamma, round_entropy=proposal.round_entropy, source=proposal.source if drafts else "",
        drafts=drafts, accepted=accepted, next_token=next_token, entropies=entropies[: len(drafts)],
        decisions=draft_decisions(drafts, accepted, next_token, values, next_p, proposal.q_of_drafts is None),
        next_p=next_p if next_token is not None else None, verified_logits=logits,
        verified_hidden=hidden if drafter.reads_target_features else None, target_top=top or None,
        early_stop=run.policy.early_stop(),
    )


def draft_decisions(drafts: list[int], accepted: int, next_token: int | None, values: list[list[float]],
                    next_p: float, point_mass: bool) -> list[DraftDecision]:
    """One `DraftDecision` per draft left after the EOS cut, from `decision_values`' rows; the
    first refused draft carries the target's replacement for it."""
    decisions = []
    for i, token in enumerate(drafts):
        p, q, accept_prob = values[i]
        rejected_here = i == accepted and next_token is not None
        decisions.append(DraftDecision(
            token=token, q=q, p=p, accept_prob=accept_prob, accepted=i < accepted, decided=i <= accepted,
            point_mass=point_mass, correction=next_token if rejected_here else None,
            correction_p=next_p if rejected_here else None,
        ))
    return decisions
