"""The decode loop: every method is a sequence of rounds.

A round drafts ≤ γ tokens, verifies them with one target forward, keeps a prefix and
adds one target token (the correction after a rejection, the bonus after a full
accept). AR's rounds draft nothing.

For an encoder-decoder pair the prompt is the encoder's input (the source, encoded once
per model) and the sequence the loop grows is the decoder's, from its start token; the
cached LMs (`engine/lm.py`) keep that difference to themselves.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Iterator, Sequence

import torch

from .clock import phase_clock
from .context_copy import CopyFirstDrafter
from .drafters import Drafter, NgramDrafter, Proposal, top_ids
from .kv_policy import prepare_caches
from .lm import CACHE_KINDS, buckets_up_to
from .methods import Method, get_method
from .nocache import recomputing_lm
from .params import DecodeParams, EngineOptions
from .seq2seq import cached_lm, decoder_start, is_encoder_decoder
from .sampling import decision_values, probabilities, verify_on_device
from .tokens import cut_at_eos, token_text
from .trace import DraftDecision, GenerationResult, Round, TokenRecord, TreeRecord
from .tree_round import tree_round

if TYPE_CHECKING:  # the engine never imports the model layer at run time
    from ..models.loading import ModelPair


def iter_generate(
    pair: ModelPair, prompt: str | Sequence[int], method: str = "sd", limits=None,
    decode: DecodeParams | None = None, *, cache: str | None = None, compile: bool = False, **params
) -> Iterator[GenerationResult]:
    """Validate everything, then return an iterator that yields the result after each round.

    The same `GenerationResult` object is yielded each time, grown by one round; closing
    the iterator stops decoding at once and frees the round's caches. `limits`
    (a `specdemo.app.limits.Limits`) adds a deployment's caps on prompt and output length.
    `decode` is a validated `DecodeParams`; keyword `params` (the same names) override it.
    `cache` ("auto" | "static" | "dynamic"; auto, the default, is static on CUDA or with
    compile) and `compile` choose the engine's KV cache and graph capture (see
    `EngineOptions`); they never change the tokens.
    """
    cache = _check_engine(pair, cache, compile)
    spec = get_method(method)
    decode_params = DecodeParams.resolve(decode, **params)
    refused = spec.unavailable(pair)
    if refused:
        raise ValueError(refused)
    decode_params, note = spec.fit(decode_params)
    prompt_ids = pair.encode(prompt, chat=decode_params.chat)
    if limits is not None:
        limits.check_request(prompt_ids, decode_params.max_new_tokens)
    pair.check_fits(prompt_ids, decode_params.max_new_tokens)
    seed = decode_params.seed if decode_params.seed is not None else random.randrange(2**31)
    result = GenerationResult(method, {**decode_params.as_dict(), "seed": seed}, prompt_ids, note=note,
                              threads=torch.get_num_threads())
    if spec.run is not None:  # a method not made of the loop's rounds (beam search)
        return spec.run(pair, decode_params, seed, result)
    drafter, policy = spec.build(pair, decode_params)
    if hasattr(drafter, "propose_tree") and getattr(pair, "is_encoder_decoder", False):
        raise ValueError(f"method {method!r} drafts a tree, which runs on decoder-only pairs only; "
                         "this pair is encoder-decoder: pick sd, egag or nasd (without nasd_tree)")
    return _rounds(pair, drafter, policy, decode_params, seed, result, cache=cache, compile=compile,
                   method=spec)


def generate(
    pair: ModelPair, prompt: str | Sequence[int], method: str = "sd", limits=None,
    decode: DecodeParams | None = None, *, cache: str | None = None, compile: bool = False, **params
) -> GenerationResult:
    """Decode to the end and return the full trace."""
    result = None
    for result in iter_generate(pair, prompt, method, limits, decode, cache=cache, compile=compile, **params):
        pass
    assert result is not None
    return result


def _check_engine(pair: ModelPair, cache: str | None, compile: bool) -> str:
    """The concrete cache kind for these options on the pair's device (ValueError if invalid)."""
    cache = EngineOptions.from_values(cache=cache, compile=compile).cache_for(pair.device)
    assert cache in CACHE_KINDS
    if compile and is_encoder_decoder(pair.target):  # refused before the first round, not during it
        raise ValueError("compile: graph capture runs decoder-only models; this pair's target is an "
                         "encoder-decoder model: turn compile off")
    return cache


def _rounds(
    pair: ModelPair, drafter: Drafter | None, policy, params: DecodeParams, seed: int, result: GenerationResult,
    cache: str = "dynamic", compile: bool = False, method: Method | None = None,
) -> Iterator[GenerationResult]:
    device = pair.device
    sampling = params.sampling
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    eos_ids = pair.eos_ids
    # An encoder-decoder reads the prompt as its source; its decoder starts from its own start token.
    source = list(result.prompt_ids) if is_encoder_decoder(pair.target) else None
    sequence = decoder_start(pair.target) if source is not None else list(result.prompt_ids)
    result.decoder_prefix = list(sequence) if source is not None else None
    clock = phase_clock(device)
    # A static cache holds the whole generation; the slack covers padded verification (or a whole tree).
    drafts_trees = drafter is not None and hasattr(drafter, "propose_tree")
    longest_chain = max(params.gamma, params.gamma_max) + 1
    max_length = len(sequence) + params.max_new_tokens + max(longest_chain, getattr(policy, "budget", 0) + 1)
    # AR verifies one token a round; drafting methods up to γ + 1 (padded to a bucket).
    buckets = buckets_up_to(longest_chain) if drafter is not None else (1,)
    # The model that writes: the target, or the draft alone (`draft`); with or without a KV cache.
    by_draft = method is not None and method.decoder == "draft"
    writer = pair.draft if by_draft else pair.target
    if method is None or method.cached:
        target = cached_lm(writer, pair.vocab_size, cache=cache, max_length=max_length, compile=compile,
                           buckets=buckets)
    else:
        target = recomputing_lm(writer, pair.vocab_size)
        cache = target.kind
    if drafter is not None and hasattr(drafter, "use_cache"):
        # The drafter feeds one token at a time, and one or two to catch up after a round.
        drafter.use_cache(cache, max_length, compile=compile, buckets=(1, 2))
    if source is not None:
        target.set_source(source)
        if drafter is not None and hasattr(drafter, "read_source"):
            drafter.read_source(source)
    reads_features = drafter is not None and getattr(drafter, "reads_target_features", False)
    if reads_features:
        target.read_features(drafter.feature_layers)
    result.memory = prepare_caches(params, pair, target, drafter)  # KV policies and the memory record
    target_top_k = getattr(drafter, "target_top_k", 0)
    result.cache = cache
    result.drafter = describe_drafter(pair, drafter, params)
    result.compile_seconds = 0.0  # compile and warm-up, outside every timed phase
    try:
        with torch.inference_mode():
            clock.start()
            if reads_features:
                # A feature-level drafter starts from the target's states over the prompt.
                drafter.start(sequence, target.prefill(sequence[:-1], hidden=True))
            else:
                target.prefill(sequence[:-1])
                if drafter is not None:
                    drafter.start(sequence)
            (result.prefill_seconds,) = clock.stop(wait=True)
            prefill_forwards = target.forwards
            engine_seconds = result.prefill_seconds
            if compile:
                result.compile_seconds = target.warm_up()
                if drafter is not None and hasattr(drafter, "lm"):
                    result.compile_seconds += drafter.lm.warm_up()

        # Inference mode is thread-local and a generator may be resumed on another thread (a page
        # streams rounds from worker threads), so each round enters it afresh; no yield sits inside it.
        while True:
            with torch.inference_mode():
                remaining = params.max_new_tokens - len(result.tokens)
                clock.start()
                tree_record = None
                if drafts_trees:
                    # Leave room for the target's own token so a round never overshoots.
                    outcome = tree_round(target, drafter, policy, sequence, remaining - 1, sampling, generator,
                                         clock, reads_features, target_top_k)
                    proposal, drafted, accepted, next_token = (outcome.proposal, outcome.drafted, outcome.accepted,
                                                               outcome.next_token)
                    entropies, target_logits, target_top = outcome.entropies, outcome.verified_logits, outcome.target_top
                    verified_hidden, tree_record = outcome.verified_hidden, outcome.record
                else:
                    if drafter is None:
                        proposal = Proposal.empty(0, device)
                    else:
                        proposal = drafter.propose(sequence, policy, remaining - 1, sampling, generator)
                    clock.lap()

                    # Nothing comes back to the host until the round's one read: the target verifies
                    # every draft from the device, an EOS among them included (cut below).
                    n_verified = len(proposal.tokens) + 1
                    target_logits = target.logits(sequence, n_verified, n_verified if reads_features else 0,
                                                  then=proposal.tokens)
                    target_scores = target_logits if sampling.greedy else probabilities(target_logits, sampling)
                    verdict = verify_on_device(target_scores, proposal.tokens, proposal.draft_probs, sampling,
                                               generator)
                    # p, q and the acceptance probability of every draft travel back with the verdict.
                    values, next_p = decision_values(target_scores, proposal.tokens, proposal.q_of_drafts, verdict,
                                                     sampling)
                    target_top = top_ids(target_logits, target_top_k) if target_top_k else None
                    (accepted, next_token), drafted, entropies, target_top, values, (next_p,) = read_together(
                        verdict, proposal.tokens, proposal.entropies, target_top, values, next_p)
                    target.note_fed(drafted)
                    verified_hidden = target.hidden
                drafts, accepted, next_token = _cut_at_eos(drafted, accepted, next_token, eos_ids)
                if tree_record is not None:
                    next_p = _tree_next_p(target_logits, accepted, next_token, sampling)
                    decisions = tree_decisions(tree_record, drafts, accepted, next_token, next_p, sampling.greedy)
                else:
                    decisions = draft_decisions(drafts, accepted, next_token, values, next_p,
                                                point_mass=proposal.q_of_drafts is None)
                new_tokens = drafts[:accepted] + ([] if next_token is None else [next_token])
                verified_from = len(sequence)
                sequence.extend(new_tokens)
                if drafter is not None:
                    seen = accepted + 1  # the positions the target verified that the output keeps
                    extras = {}
                    if reads_features:
                        extras["target_features"] = verified_hidden[:seen]
                    if target_top_k:
                        extras["target_top"] = target_top[:seen]
                    drafter.observe(sequence, verified_from, target_logits[:seen], **extras)
                policy.update(len(drafts), accepted)
                draft_seconds, verify_seconds = clock.stop()
                engine_seconds += draft_seconds + verify_seconds

                round_ = Round(
                    index=len(result.rounds), gamma=proposal.gamma, entropy=proposal.round_entropy,
                    drafted=drafts, accepted=accepted, next_token=next_token,
                    draft_entropies=entropies[: len(drafts)], draft_seconds=draft_seconds,
                    verify_seconds=verify_seconds, end_seconds=engine_seconds, new_tokens=new_tokens,
                    source=proposal.source if drafts else "", tree=tree_record,
                    decisions=decisions,
                    next_p=next_p if next_token is not None else None,
                )
                _record(result, round_, pair, sequence)
                result.seconds = engine_seconds
                result.target_forwards = target.forwards - prefill_forwards
                result.draft_forwards = drafter.forwards if drafter is not None else 0
                if by_draft:  # the draft wrote every token; the target never ran
                    result.target_forwards, result.draft_forwards = 0, result.target_forwards
                if new_tokens and new_tokens[-1] in eos_ids:
                    result.stop_reason = "eos"
                elif len(result.tokens) >= params.max_new_tokens:
                    result.stop_reason = "max_new_tokens"
            if result.stop_reason:
                result.done = True
                result.text = pair.tokenizer.decode(result.token_ids, skip_special_tokens=True)
                yield result
                return
            yield result
    finally:
        # Drop the caches now rather than whenever the generator is collected.
        target.close()
        if drafter is not None and hasattr(drafter, "close"):
            drafter.close()


def read_together(*parts: torch.Tensor | None) -> list[list]:
    """Device tensors as host lists, like `tolist()`, in one read (one synchronisation on a GPU);
    [] for None. They travel as float64, which holds token ids (below 2^53) and float32 values
    exactly; integer tensors come back as ints."""
    present = [p for p in parts if p is not None]
    values = torch.cat([p.reshape(-1).double() for p in present]).tolist() if present else []
    lists = []
    for part in parts:
        if part is None:
            lists.append([])
            continue
        chunk, values = values[: part.numel()], values[part.numel() :]
        if not part.is_floating_point():
            chunk = [int(v) for v in chunk]
        for size in reversed(part.shape[1:]):  # back into rows
            chunk = [chunk[i : i + size] for i in range(0, len(chunk), size)]
        lists.append(chunk)
    return lists


def _cut_at_eos(drafted: list[int], accepted: int, next_token: int, eos_ids) -> tuple[list[int], int, int | None]:
    """A verdict over every draft, read as one over the drafts up to the first EOS: those
    drafts, how many of them the target kept, and its next token (None when a kept EOS
    ends the output)."""
    drafts = cut_at_eos(drafted, eos_ids)
    accepted = min(accepted, len(drafts))
    ended = accepted > 0 and drafts[accepted - 1] in eos_ids
    return drafts, accepted, None if ended else next_token


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


def tree_decisions(tree: TreeRecord, drafts: list[int], accepted: int, next_token: int | None,
                   next_p: float | None, greedy: bool) -> list[DraftDecision]:
    """A tree round's drafts read as a chain's: the kept path, then the first child refused after it.
    Their p and q are the tree's own; under sampling the acceptance probability shown is min(1, p/q),
    exact for the first child tried at a node (a later sibling is judged against the residual, which
    the tree view shows)."""
    decisions, parent = [], 0
    for i, token in enumerate(drafts):
        node = next(n for n in range(1, tree.nodes + 1)
                    if tree.parents[n - 1] == parent and tree.tokens[n - 1] == token)
        q, p = tree.q[node - 1], tree.p[node - 1]
        kept = i < accepted
        accept_prob = float(kept) if greedy else min(1.0, p / q) if q else min(1.0, p)
        rejected_here = i == accepted and next_token is not None
        decisions.append(DraftDecision(
            token=token, q=1.0 if q is None else q, p=p, accept_prob=accept_prob, accepted=kept, decided=i <= accepted,
            point_mass=q is None, correction=next_token if rejected_here else None,
            correction_p=next_p if rejected_here else None,
        ))
        parent = node
    return decisions


def _tree_next_p(verified_logits: torch.Tensor, accepted: int, next_token: int | None,
                 sampling) -> float | None:
    """The target's p of a tree round's own token, at the last kept node (filters applied)."""
    if next_token is None:
        return None
    return float(probabilities(verified_logits[accepted], sampling)[next_token])


def describe_drafter(pair, drafter, params: DecodeParams) -> str:
    """The drafter as the page and the benchmark name it."""
    if drafter is None:
        return "none"
    if isinstance(drafter, NgramDrafter):
        return f"n-gram table (n={params.ngram_n}, {params.ngram_storage})"
    if isinstance(drafter, CopyFirstDrafter):
        return f"{describe_drafter(pair, drafter.inner, params)} + context copy (n={drafter.table.n})"
    return getattr(pair, "drafter_name", None) or type(drafter).__name__


def _record(result: GenerationResult, round_: Round, pair: ModelPair, sequence: list[int]) -> None:
    origins = ["accepted"] * len(round_.new_tokens)
    if round_.next_token is not None:
        origins[-1] = round_.next_origin
    start = len(sequence) - len(round_.new_tokens)
    for offset, (token, origin) in enumerate(zip(round_.new_tokens, origins)):
        position = start + offset
        text = token_text(pair.tokenizer, sequence, position, floor=len(result.output_context))
        result.tokens.append(TokenRecord(token, text, origin, round_.index))
    result.rounds.append(round_)
    result.text = "".join(t.text for t in result.tokens)
