"""Beam search on the target, through transformers' `generate`: a method whose trace is
built from generate's output rather than from the decode loop's rounds.

Each beam step is one batched target forward that extends every beam by a token. The trace
records one round per token of the returned beam, each ending when the step that produced
it ended (a stopping criterion reads the clock after every step); the first round includes
the prompt's forward. Nothing is drafted, so every token is the target's.

Beam search keeps the `num_beams` most likely prefixes, so its output is not greedy
decoding's: the method is not lossless and its matches_ar is left empty. With a temperature
above 0 it is beam sampling (transformers' `do_sample` with beams), seeded by the run's
seed. The engine options (cache kind, compile) do not apply: transformers runs its own cache.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from .targets.seq2seq import decoder_start, is_encoder_decoder
from .params import DecodeParams
from .tokens import cut_at_eos, token_text
from .trace import TARGET, GenerationResult, Round, TokenRecord


class _StepClock:
    """A stopping criterion that never stops: it records when each generate step ended."""

    def __init__(self, device: torch.device):
        self.device = device
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def generation_config(pair, params: DecodeParams):
    """Beam search with the run's limits and EOS ids; every other setting explicit, so the
    checkpoint's own generation defaults (a repetition penalty, top-k...) never leak in."""
    from transformers import GenerationConfig

    eos = sorted(pair.eos_ids)
    sampled = not params.sampling.greedy
    settings = dict(
        max_new_tokens=params.max_new_tokens, min_new_tokens=0, num_beams=params.num_beams,
        use_cache=True, do_sample=sampled, eos_token_id=eos or None,
        pad_token_id=eos[0] if eos else pair.tokenizer.pad_token_id, repetition_penalty=1.0,
        no_repeat_ngram_size=0, length_penalty=1.0, early_stopping=False,
    )
    if sampled:
        settings.update(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, typical_p=1.0,
                        min_p=None, epsilon_cutoff=0.0, eta_cutoff=0.0)
    return GenerationConfig(**settings)


def run_beam(pair, params: DecodeParams, seed: int, result: GenerationResult) -> Iterator[GenerationResult]:
    """Decode result.prompt_ids with beam search and yield the finished trace once."""
    from transformers import StoppingCriteriaList

    device = pair.device
    clock = _StepClock(device)
    config = generation_config(pair, params)
    torch.manual_seed(seed)
    input_ids = torch.tensor([result.prompt_ids], device=device)
    with torch.inference_mode():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        output = pair.target.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                      generation_config=config, stopping_criteria=StoppingCriteriaList([clock]))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        end = time.perf_counter()
    # A decoder-only model returns the prompt and then the new tokens; an encoder-decoder model
    # returns the decoder's sequence, which starts with its decoder-start token.
    if is_encoder_decoder(pair.target):
        result.decoder_prefix = decoder_start(pair.target)
    new_ids = cut_at_eos(output[0, len(result.output_context):].tolist(), pair.eos_ids)
    steps = [t - start for t in clock.times] or [end - start]
    sequence = list(result.output_context)
    previous = 0.0
    for index, token in enumerate(new_ids):
        ended = steps[min(index, len(steps) - 1)]
        sequence.append(token)
        result.rounds.append(Round(
            index=index, gamma=0, entropy=None, drafted=[], accepted=0, next_token=token, draft_entropies=[],
            draft_seconds=0.0, verify_seconds=ended - previous, end_seconds=ended, new_tokens=[token],
        ))
        text = token_text(pair.tokenizer, sequence, len(sequence) - 1, floor=len(result.output_context))
        result.tokens.append(TokenRecord(token, text, TARGET, index))
        previous = ended
    result.seconds = end - start
    result.target_forwards = len(clock.times)
    result.cache = "dynamic"
    result.drafter = "none"
    result.stop_reason = "eos" if new_ids and new_ids[-1] in pair.eos_ids else "max_new_tokens"
    result.done = True
    result.text = pair.tokenizer.decode(new_ids, skip_special_tokens=True)
    yield result
