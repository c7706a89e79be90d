"""The decode loop: every method is a sequence of rounds.

A round drafts ≤ γ tokens, verifies them with one target forward, keeps a prefix and
adds one target token (the correction after a rejection, the bonus after a full
accept). AR's rounds draft nothing.

For an encoder-decoder pair the prompt is the encoder's input (the source, encoded once
per model) and the sequence the loop grows is the decoder's, from its start token; the
cached LMs (`engine/targets/lm.py`) keep that difference to themselves.
"""

from __future__ import annotations

import math

import random
from typing import Iterator, Sequence

import torch

from .chain_round import chain_round
from .clock import phase_clock
from .drafters.base import Drafter, NoDrafter
from .targets.kv_policy import prepare_caches
from .targets.lm import CACHE_KINDS, CachedLM, buckets_up_to
from .methods import FIXED_GAMMA, Method, get_method
from .targets.nocache import recomputing_lm
from .runtimes import refusal
from .runtimes.onnx_lm import torch_threads
from .pair import DRAFT_ROLE, TARGET_ROLE, Pair
from .params import DecodeParams, EngineOptions
from .rounds import Decoding, RoundOutcome
from .targets.seq2seq import cached_lm, decoder_start, is_encoder_decoder
from .tokens import token_text
from .flops import matmul_parameters
from .trace import FedCounts, GenerationResult, Round, TokenRecord
from .tree_round import tree_round


def iter_generate(
    pair: Pair, prompt: str | Sequence[int], method: str = FIXED_GAMMA, limits=None,
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
    cache = EngineOptions.from_values(cache=cache, compile=compile).cache_for(pair.device)
    assert cache in CACHE_KINDS
    spec = get_method(method)
    decode_params = DecodeParams.resolve(decode, **params)
    refused = refusal(pair, method, decode_params, compile=compile)
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
    return decode_rounds(pair, drafter, policy, decode_params, seed, result, cache=cache, compile=compile,
                   method=spec)


def generate(
    pair: Pair, prompt: str | Sequence[int], method: str = FIXED_GAMMA, limits=None,
    decode: DecodeParams | None = None, *, cache: str | None = None, compile: bool = False, **params
) -> GenerationResult:
    """Decode to the end and return the full trace."""
    result = None
    for result in iter_generate(pair, prompt, method, limits, decode, cache=cache, compile=compile, **params):
        pass
    assert result is not None
    return result


def decode_rounds(pair: Pair, drafter: Drafter | None, policy, params: DecodeParams, seed: int,
            result: GenerationResult, cache: str = "dynamic", compile: bool = False,
            method: Method | None = None, writer: CachedLM | None = None) -> Iterator[GenerationResult]:
    """The loop's rounds for a drafter and policy already built, yielding the result after each (what
    `iter_generate` returns once it has validated a request). writer: a target given in the place of the
    pair's (the recorded target of `engine.replay`); None: the pair's own, cached as `cache` says."""
    run, sequence = _start(pair, drafter or NoDrafter(pair.device), policy, params, seed, result, cache, compile,
                           method, writer)
    play = tree_round if run.drafter.drafts_trees else chain_round
    prefill = (run.writer.counts.copy(), run.drafter.counts.copy())  # what decoding feeds is counted from here
    # A target on another runtime keeps the thread count for its own pool, and has torch's work between
    # its forwards run on the count it names (onnx_lm.TORCH_THREADS_BETWEEN_FORWARDS).
    between_forwards = run.writer.torch_threads
    try:
        while not result.done:
            # Inference mode is thread-local and a generator may be resumed on another thread (a page
            # streams rounds from worker threads), so each round enters it afresh; no yield sits inside it.
            with torch.inference_mode(), torch_threads(between_forwards):
                run.clock.start()
                # Leave room for the writer's own token so that a round never overshoots.
                outcome = play(run, sequence, params.max_new_tokens - len(result.tokens) - 1)
                verified_from = len(sequence)
                sequence.extend(outcome.new_tokens)
                run.drafter.observe(sequence, verified_from, **outcome.shown_to_drafter())
                run.policy.update(len(outcome.drafts), outcome.accepted)
                record_round(result, outcome, run.clock.stop(), pair, sequence)
                _count_forwards(result, run, prefill, method)
                check_stop(result, params.max_new_tokens, pair)
            yield result
        learn_after_request(result, run.drafter, pair, sequence)
    finally:
        # Drop the caches now rather than whenever the generator is collected.
        run.writer.close()
        run.drafter.close()


def _start(pair: Pair, drafter: Drafter, policy, params: DecodeParams, seed: int, result: GenerationResult,
           cache: str, compile: bool, method: Method | None,
           given_writer: CachedLM | None = None) -> tuple[Decoding, list[int]]:
    """The writer and the drafter with their caches, the prompt prefilled (timed) and, with compile,
    the steps captured (outside the timed phases); returns the decoding and the sequence to grow."""
    # An encoder-decoder reads the prompt as its source; its decoder starts from its own start token.
    source = list(result.prompt_ids) if is_encoder_decoder(pair.target) else None
    sequence = decoder_start(pair.target) if source is not None else list(result.prompt_ids)
    result.decoder_prefix = list(sequence) if source is not None else None
    # A static cache holds the whole generation; the slack covers padded verification (or a whole tree).
    longest_chain = max(params.gamma, params.gamma_max) + 1
    max_length = len(sequence) + params.max_new_tokens + max(longest_chain, policy.budget + 1)
    writer = given_writer or _writer(pair, drafter, longest_chain, max_length, cache, compile, method)
    # The drafter feeds one token at a time, and one or two to catch up after a round.
    drafter.use_cache(writer.kind, max_length, compile=compile, buckets=(1, 2))
    if source is not None:
        writer.set_source(source)
        drafter.read_source(source)
    if drafter.reads_target_features:
        writer.read_features(drafter.feature_layers)
    result.memory = prepare_caches(params, pair, writer, drafter)  # KV policies and the memory record
    generator = torch.Generator(device=pair.device)
    generator.manual_seed(seed)
    run = Decoding(writer, drafter, policy, params.sampling, generator, phase_clock(pair.device), pair.eos_ids)
    result.cache, result.drafter = writer.kind, drafter.describe(pair.drafter_name)
    # The torch weights the pair keeps, also where another runtime runs the target (the same weights).
    result.parameters = {TARGET_ROLE: matmul_parameters(pair.target), DRAFT_ROLE: matmul_parameters(pair.draft)}
    if writer.model is pair.target:
        result.exactness = pair.exactness
    if pair.target_runtime is not None and writer.model is pair.target:
        result.runtime = f"{pair.runtime} {pair.target_runtime.precision}"
    with torch.inference_mode():
        run.clock.start()
        states = writer.prefill(sequence[:-1], hidden=drafter.reads_target_features)
        drafter.start(sequence, states if drafter.reads_target_features else None)
        (result.prefill_seconds,) = run.clock.stop(wait=True)
        result.seconds = result.prefill_seconds
        result.compile_seconds = writer.warm_up() + drafter.warm_up() if compile else 0.0
    return run, sequence


def _writer(pair: Pair, drafter: Drafter, longest_chain: int, max_length: int, cache: str, compile: bool,
            method: Method | None) -> CachedLM:
    """The model whose tokens come out (the target, or the draft alone for `draft`), cached or not."""
    model = pair.draft if method is not None and method.decoder == DRAFT_ROLE else pair.target
    if method is not None and not method.cached:
        return recomputing_lm(model, pair.vocab_size)
    if pair.target_runtime is not None and model is pair.target:
        return pair.target_runtime.cached_lm(model, pair.vocab_size, max_length, kind=cache, compile=compile)
    # AR verifies one token a round; drafting methods up to γ + 1 (padded to a bucket).
    buckets = buckets_up_to(longest_chain) if drafter.drafts_tokens else (1,)
    return cached_lm(model, pair.vocab_size, cache=cache, max_length=max_length, compile=compile, buckets=buckets)


def _count_forwards(result: GenerationResult, run: Decoding, prefill: tuple[FedCounts, FedCounts],
                    method: Method | None) -> None:
    """The trace's counts so far: each model's forwards, and what decoding fed it (`GenerationResult.fed`)."""
    writer, drafter = run.writer.counts.since(prefill[0]), run.drafter.counts.since(prefill[1])
    writer_forwards = writer.forwards
    if method is not None and method.decoder == DRAFT_ROLE:  # the draft wrote every token; the target never ran
        result.target_forwards, result.draft_forwards = 0, writer_forwards
        result.fed = {TARGET_ROLE: FedCounts(), DRAFT_ROLE: writer}
    else:
        result.target_forwards, result.draft_forwards = writer_forwards, run.drafter.forwards
        result.fed = {TARGET_ROLE: writer, DRAFT_ROLE: drafter}


def learn_after_request(result: GenerationResult, drafter: Drafter, pair: Pair, sequence: list[int]) -> None:
    """A finished request taught to a drafter that adapts between requests (OSD), after the last
    round was yielded and its time recorded: the lesson is reported, never timed as decoding."""
    if not drafter.learns_online:
        return
    stats = result.stats
    result.lesson = drafter.learn(pair.target, sequence, len(sequence) - len(result.tokens), stats["drafted"],
                                  stats["accepted"])
    if result.lesson is not None:
        result.note = " ".join(filter(None, (result.note, result.lesson.describe())))


def check_stop(result: GenerationResult, max_new_tokens: int, pair: Pair) -> None:
    last = result.rounds[-1].new_tokens
    if last and last[-1] in pair.eos_ids:
        result.stop_reason = "eos"
    elif len(result.tokens) >= max_new_tokens:
        result.stop_reason = "max_new_tokens"
    if result.stop_reason:
        result.done = True
        result.text = pair.tokenizer.decode(result.token_ids, skip_special_tokens=True)


def top2_margins(verified_logits: torch.Tensor | None, count: int) -> torch.Tensor:
    """The top-1 minus top-2 logit of each of the first `count` verified rows (row i chose new token i), NaN
    where a row is missing: one topk(2) on logits the round computed already, off the clock and left where the
    logits are (the trace reads every round's at once, when asked)."""
    if verified_logits is None or verified_logits.dim() != 2 or verified_logits.shape[-1] < 2:
        return torch.full((count,), math.nan)
    rows = verified_logits[:count].float().topk(2, dim=-1).values
    margins = rows[:, 0] - rows[:, 1]
    return torch.cat([margins, margins.new_full((count - len(margins),), math.nan)]) if len(margins) < count else margins


def record_round(result: GenerationResult, outcome: RoundOutcome, phases: list[float], pair: Pair,
            sequence: list[int]) -> None:
    """The round into the trace: its `Round` (with the round's note on where drafting stopped
    early, if it did), and a `TokenRecord` per new token."""
    draft_seconds, verify_seconds = phases
    result.seconds += draft_seconds + verify_seconds
    round_ = Round(
        index=len(result.rounds), gamma=outcome.gamma, entropy=outcome.round_entropy, drafted=outcome.drafts,
        accepted=outcome.accepted, next_token=outcome.next_token, draft_entropies=outcome.entropies,
        draft_seconds=draft_seconds, verify_seconds=verify_seconds, end_seconds=result.seconds,
        new_tokens=outcome.new_tokens, source=outcome.source, tree=outcome.tree, decisions=outcome.decisions,
        next_p=outcome.next_p, early_stop=outcome.early_stop,
    )
    result.margin_parts.append(top2_margins(outcome.verified_logits, len(round_.new_tokens)))
    origins = ["accepted"] * len(round_.new_tokens)
    if round_.next_token is not None:
        origins[-1] = round_.next_origin
    start = len(sequence) - len(round_.new_tokens)
    for offset, (token, origin) in enumerate(zip(round_.new_tokens, origins)):
        text = token_text(pair.tokenizer, sequence, start + offset, floor=len(result.output_context))
        result.tokens.append(TokenRecord(token, text, origin, round_.index))
    result.rounds.append(round_)
    result.text = "".join(t.text for t in result.tokens)
