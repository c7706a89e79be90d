"""One round of a chain method (AR, SD, NASD, EGAG …): draft ≤ γ tokens, verify them in one
forward, keep a prefix, add the writer's own token.

Nothing comes back to the host until the round's one read: the writer verifies every draft
from the device (an EOS among them included, cut afterwards), and p, q and the acceptance
probability of every draft travel back with the verdict.
"""

from __future__ import annotations

from .drafters.base import top_ids
from .rounds import Decoding, RoundOutcome, cut_verdict_at_eos, read_together
from .sampling import decision_values, probabilities, verify_on_device
from .trace import DraftDecision


def chain_round(run: Decoding, sequence: list[int], limit: int) -> RoundOutcome:
    """limit: the most drafts the output has room for (the writer's own token comes on top)."""
    drafter, writer, sampling = run.drafter, run.writer, run.sampling
    proposal = drafter.propose(sequence, run.policy, limit, sampling, run.generator)
    run.clock.lap()
    n_verified = len(proposal.tokens) + 1
    logits = writer.logits(sequence, n_verified, n_verified if drafter.reads_target_features else 0,
                           then=proposal.tokens)
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
        verified_hidden=writer.hidden if drafter.reads_target_features else None, target_top=top or None,
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
