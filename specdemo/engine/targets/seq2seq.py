"""Encoder-decoder models (T5, BART, ...) and their cache, beside `lm.CachedLM`.

`EncoderDecoderLM` runs the source through the encoder once; the sequence the decode loop
grows is the decoder's, from its start token (`decoder_start`). Its cache is transformers'
`EncoderDecoderCache`: a self-attention part that grows and rolls back with the decoder's
sequence, and a cross-attention part (keys and values of the encoder's output) that the
first decoder forward fills and every later one reads. Rolling back touches the
self-attention part only. `cached_lm` picks the class for a model.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, EncoderDecoderCache, StaticCache
from transformers.cache_utils import StaticLayer

from .lm import CACHE_KINDS, CachedLM


def is_encoder_decoder(model: torch.nn.Module) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def decoder_start(model: torch.nn.Module) -> list[int]:
    """The ids an encoder-decoder's decoder starts from: its decoder start token."""
    configs = (getattr(model, "generation_config", None), model.config)
    for config in configs:
        start = getattr(config, "decoder_start_token_id", None)
        if isinstance(start, int):
            return [start]
    for config in configs:  # some configs name only the padding token, which T5 and BART start from
        start = getattr(config, "pad_token_id", None)
        if isinstance(start, int):
            return [start]
    raise ValueError(f"{type(model).__name__} names no decoder start token (decoder_start_token_id) in its config")


def cached_lm(model: torch.nn.Module, vocab_size: int | None = None, **options) -> CachedLM:
    """A `CachedLM` for a decoder-only model, an `EncoderDecoderLM` for an encoder-decoder one."""
    return (EncoderDecoderLM if is_encoder_decoder(model) else CachedLM)(model, vocab_size, **options)


class EncoderDecoderLM(CachedLM):
    """An encoder-decoder LM: `set_source(ids)` names the encoder's input; the encoder runs
    once, at the first `prefill` or `feed` after it. Everything else (`logits`, `feed`,
    `rollback`, `cached_ids`) speaks of the decoder's sequence, as `CachedLM` does.

    cache="static" keeps the decoder's self-attention in a `StaticCache` of `max_length`
    positions (rolled back by moving its length) and the cross-attention in one sized to
    the source. Graph capture (`compile`) is refused: its steps are built for decoder-only models.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None, cache: str = "dynamic",
                 max_length: int | None = None, compile: bool = False, buckets: tuple[int, ...] = (1,)):
        if compile:
            raise ValueError(f"compile: graph capture runs decoder-only models; {type(model).__name__} is an "
                             "encoder-decoder model: turn compile off")
        # The parent sets up the bookkeeping; the cache itself is made per source (`_fresh_cache`).
        super().__init__(model, vocab_size, cache="dynamic", max_length=max_length)
        self.cache = None
        if cache not in CACHE_KINDS:
            raise ValueError(f"cache: {cache!r} is not one of {', '.join(CACHE_KINDS)}")
        if cache == "static" and (not max_length or max_length < 1):
            raise ValueError("cache: a static cache needs max_length ≥ 1")
        self.kind = cache
        self.source: list[int] = []
        self.encoder_output = None
        self.encodes = 0  # encoder forwards: one per source

    def set_source(self, source_ids: list[int]) -> None:
        """The encoder's input for the generation; forgets every decoder position."""
        if not source_ids:
            raise ValueError("prompt is empty: the encoder needs at least one token")
        self.source = list(source_ids)
        self.encoder_output = None
        self.cache = None

    def _encode(self) -> None:
        if not self.source:
            raise ValueError("an encoder-decoder model needs its source: call set_source first")
        ids = torch.tensor([self.source], dtype=torch.long, device=self.device)
        self.encoder_output = self.model.get_encoder()(input_ids=ids)
        self.encodes += 1
        self.cache = self._fresh_cache()
        self.cached_ids, self.length = [], 0

    def _fresh_cache(self) -> EncoderDecoderCache:
        config = self.model.config
        if self.kind == "static":
            cache = EncoderDecoderCache(StaticCache(config=config, max_cache_len=self.max_length),
                                        StaticCache(config=config, max_cache_len=len(self.source)))
            if not all(type(layer) is StaticLayer for layer in cache.self_attention_cache.layers):
                raise ValueError("cache: static rollback supports full-attention layers only; use cache='dynamic'")
            return cache
        return EncoderDecoderCache(DynamicCache(), DynamicCache())

    def _set_length(self, length: int) -> None:
        with torch.inference_mode():
            for layer in self.cache.self_attention_cache.layers:
                layer.cumulative_length.fill_(length)

    def prefill(self, sequence: list[int], hidden: bool = False) -> torch.Tensor | None:
        if hidden:
            raise ValueError("a feature-level drafter reads a decoder-only target's states; "
                             f"{type(self.model).__name__} is an encoder-decoder model")
        if self.encoder_output is None:
            self._encode()
        return super().prefill(sequence)

    def feed(self, new_ids: torch.Tensor, n_logits: int, n_hidden: int = 0) -> torch.Tensor:
        """Append new_ids [n] to the decoder's cache; logits [n_logits, V]."""
        if n_hidden:
            raise ValueError("a feature-level drafter reads a decoder-only target's states")
        if self.encoder_output is None:
            self._encode()
        n = new_ids.shape[0]
        if self.kind == "static" and self.length + n > self.max_length:
            raise ValueError(f"static cache: {self.length} + {n} positions exceed its max_length {self.max_length}")
        output = self.model(encoder_outputs=self.encoder_output, decoder_input_ids=new_ids.view(1, -1),
                            cache=self.cache, use_cache=True)
        self.counts.add(n, n_logits)
        self.length += n
        self._note_kv()
        logits = output.logits[0, -n_logits:]
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        return logits

    def warm_up(self) -> float:
        return 0.0

    def set_kv_policy(self, policy, who: str = "kv") -> None:
        if policy.compresses:
            raise ValueError(f"{who}={policy.kind}: KV policies run on decoder-only models; "
                             f"{type(self.model).__name__} is an encoder-decoder model: use {who}=full")
        self.kv_policy = policy

    def close(self) -> None:
        self.cache = None
        self.encoder_output = None
