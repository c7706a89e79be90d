"""Pure tensor functions: logits → distributions, entropy, and draft verification.

Notation: p is the target's distribution, q the drafter's. Every function works on
one sequence (no batch dimension) so it can be tested with statistics on a tiny
vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingConfig:
    """How next-token distributions are formed from logits.

    temperature 0 means greedy decoding; top_k 0 and top_p 1.0 disable those filters.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probabilities(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Softmax of logits [..., V] after temperature, top-k and top-p, in float32.

    In greedy mode the temperature is ignored (plain softmax): the argmax is the token,
    and the distribution is only used for entropies.
    """
    logits = logits.float()
    if config.greedy:
        return torch.softmax(logits, dim=-1)
    logits = logits / config.temperature
    vocab = logits.shape[-1]
    if 0 < config.top_k < vocab:
        kth_largest = torch.topk(logits, config.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # Keep the smallest prefix whose mass reaches top_p; the first token always stays.
        drop_sorted = mass_before >= config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)


def normalized_entropy(probs: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
    """H(probs) / log V over the last dimension, in [0, 1]; vocab_size: V when probs holds only the
    ids of a vocabulary where q is nonzero (zeros add nothing to H)."""
    # entr(0) = 0 without taking log(0): a q that is zero outside a subset made `log` ten times slower.
    return torch.special.entr(probs).sum(-1) / math.log(vocab_size or probs.shape[-1])


def spread(probs: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q [..., S] over the ids of a draft vocabulary -> q [..., V], exactly zero outside it."""
    return probs.new_zeros((*probs.shape[:-1], vocab_size)).index_copy_(-1, ids, probs)


def pick(probs: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of probs [..., V] (argmax when greedy), shape [...]."""
    if config.greedy:
        return probs.argmax(-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def verify_on_device(
    target_probs: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    config: SamplingConfig,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Decide which drafts the target accepts and the token that follows them, without reading
    anything back: a [2] long tensor (accepted, next token) on the device, so the caller reads the
    whole round back in one go.

    target_probs: [k+1, V], p at each draft position plus the one after the last draft.
    drafts: [k] token ids.
    draft_probs: [k, V], q at each draft position, or None for a deterministic drafter
    (q is a point mass on each draft, e.g. an n-gram table).

    Greedy: a draft is kept iff it is the target's argmax; the next token is the argmax.
    Sampling: draft x is kept with probability min(1, p(x)/q(x)); on the first rejection
    the next token is drawn from norm(max(p − q, 0)) — for a point mass, p without x —
    and after all are kept, from p. This leaves the output distributed exactly as p.

    Both branches' draws are made in the same order, k uniforms then one multinomial draw
    (as a host-side verification would make them) (k uniforms, then one multinomial draw), so a seed gives the same tokens.
    """
    k = drafts.shape[0]
    if config.greedy:
        target_tokens = target_probs.argmax(-1)
        accepted = torch.cumprod((target_tokens[:k] == drafts).long(), 0).sum()
        return torch.stack([accepted, target_tokens[accepted]])

    if k == 0:
        next_token = pick(target_probs[0], config, generator)
        return torch.stack([torch.zeros_like(next_token), next_token])
    positions = torch.arange(k, device=drafts.device)
    p_of_drafts = target_probs[positions, drafts]
    if draft_probs is None:
        q_of_drafts = torch.ones_like(p_of_drafts)
    else:
        q_of_drafts = draft_probs[positions, drafts]
    uniforms = torch.rand(k, generator=generator, device=drafts.device)
    rejected = uniforms * q_of_drafts > p_of_drafts  # u > p/q without dividing by q
    # The first rejection, or k when every draft is kept.
    accepted = torch.where(rejected.any(), rejected.int().argmax(), torch.tensor(k, device=drafts.device))
    at = accepted.clamp(max=k - 1)  # the rejected position (unused when all are kept)
    p = target_probs[at]
    if draft_probs is None:
        residual = p.scatter(0, drafts[at].view(1), 0.0)
    else:
        residual = torch.clamp(p - draft_probs[at], min=0.0)
    mass = residual.sum()
    # A rejection implies p(x) < q(x), so the residual has mass unless rounding ate it.
    residual = torch.where(mass > 1e-12, residual / mass, p)
    dist = torch.where(accepted == k, target_probs[k], residual)
    next_token = torch.multinomial(dist, 1, generator=generator)[0]
    return torch.stack([accepted, next_token])



def decision_values(
    target_scores: torch.Tensor,
    drafts: torch.Tensor,
    q_of_drafts: torch.Tensor | None,
    verdict: torch.Tensor,
    config: SamplingConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """What decided each draft, on the device beside the verdict (nothing is read back here).

    target_scores: what `verify_on_device` was given, [k+1, V]: logits when greedy, p otherwise.
    q_of_drafts: [k] q(x) of each draft after the sampling filters; None for a point mass (q = 1).
    verdict: `verify_on_device`'s (accepted, next token).

    Returns ([k, 3] rows of (p(x), q(x), acceptance probability), [1] p of the next token at
    the position it follows). Sampling: the acceptance probability is min(1, p(x)/q(x)).
    Greedy: p is the plain softmax of the target's logits, and the acceptance "probability"
    is 1 where x is the target's argmax and 0 elsewhere, the rule greedy verification applies.
    """
    k = drafts.shape[0]
    positions = torch.arange(k, device=drafts.device)
    # The next token's score by index_select and gather: indices that stay tensors, never read back.
    row = verdict[:1]
    next_score = target_scores.index_select(0, row).gather(1, verdict[1:].view(1, 1)).view(1).float()
    if config.greedy:
        log_normaliser = torch.logsumexp(target_scores.float(), dim=-1)  # softmax only where it is read
        p_of_drafts = torch.exp(target_scores[positions, drafts].float() - log_normaliser[:k])
        accept = (target_scores[:k].argmax(-1) == drafts).float()
        next_p = torch.exp(next_score - log_normaliser.index_select(0, row))
    else:
        p_of_drafts = target_scores[positions, drafts].float()
        next_p = next_score
    q = torch.ones_like(p_of_drafts) if q_of_drafts is None else q_of_drafts.float()
    if not config.greedy:
        # A draft was picked from q, so q(x) > 0; the clamp only guards rounding.
        accept = torch.clamp(p_of_drafts / q.clamp_min(1e-30), max=1.0)
    return torch.stack([p_of_drafts, q, accept], dim=-1), next_p
