"""A causal LM with no KV cache: every call runs the model over the whole sequence.

`RecomputingLM` answers the calls the decode loop makes of a `CachedLM` (`prefill`,
`logits`, `note_fed`, `warm_up`, `close`, `forwards`, `hidden`), so AR without a cache
(`ar-nocache`) is the same loop with this engine in place of the cached one. Step t
costs a forward over prompt + t positions, so a generation is quadratic in its length:
the baseline that shows what the cache buys.

An encoder-decoder model (`recomputing_lm` picks `EncoderDecoderRecomputingLM`) encodes its
source once, as transformers' `generate(use_cache=False)` does, and recomputes the whole
decoder sequence, its cross-attention over the encoder's output included, every step.
"""

from __future__ import annotations

import torch

from .lm import forward_with_features
from .seq2seq import is_encoder_decoder
from ..trace import FedCounts

KIND = "none"  # what a trace records as its cache kind


class RecomputingLM:
    kind = KIND
    torch_threads: int | None = None  # as `CachedLM.torch_threads`: torch's count between forwards (as it is)

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None):
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.counts = FedCounts()  # as `CachedLM.counts`: each step feeds the whole sequence again
        self.hidden: torch.Tensor | None = None
        self.feature_layers: tuple[int, ...] = ()
        self.source: torch.Tensor | None = None  # an encoder-decoder's input, encoded again at every step

    @property
    def forwards(self) -> int:
        """Forwards so far, prefill included: `counts.forwards`."""
        return self.counts.forwards

    def set_source(self, source: list[int]) -> None:
        """An encoder-decoder model's input: with no cache, every step runs the encoder over it again."""
        self.source = torch.tensor(source, dtype=torch.long, device=self.device).view(1, -1)

    def read_features(self, layers: tuple[int, ...]) -> None:
        self.feature_layers = tuple(layers)

    def prefill(self, sequence: list[int], hidden: bool = False) -> torch.Tensor | None:
        """Nothing is kept between calls, so there is nothing to fill: the first step reads the prompt."""
        if hidden and sequence:
            self.logits(sequence, 1, n_hidden=len(sequence))
            return self.hidden
        return None

    def logits(self, sequence: list[int], n_logits: int = 1, n_hidden: int = 0,
               then: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [n_logits, V] at the last positions of `sequence` + `then`, from one forward over all of it."""
        ids = torch.tensor(sequence, dtype=torch.long, device=self.device)
        if then is not None and then.shape[0]:
            ids = torch.cat([ids, then])
        if self.source is not None:
            logits = self.model(input_ids=self.source, decoder_input_ids=ids.view(1, -1), use_cache=False).logits
            logits = logits[0, -n_logits:]
        elif n_hidden:
            logits, hidden = forward_with_features(self.model, self.feature_layers, input_ids=ids.view(1, -1), use_cache=False)
            self.hidden = hidden[0, -n_hidden:]
            logits = logits[0, -n_logits:]
        else:
            logits = self.model(input_ids=ids.view(1, -1), use_cache=False, logits_to_keep=n_logits).logits[0]
        self.counts.add(ids.shape[0], n_logits)
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        return logits

    def note_fed(self, ids: list[int]) -> None:
        pass  # nothing is cached, so nothing needs its ids

    def warm_up(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


class EncoderDecoderRecomputingLM(RecomputingLM):
    """No KV cache for an encoder-decoder model: `set_source` names the encoder's input, encoded
    once at the first call; each call runs the decoder over the whole decoder sequence."""

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None):
        super().__init__(model, vocab_size)
        self.source: list[int] = []
        self.encoder_output = None
        self.encodes = 0

    def set_source(self, source_ids: list[int]) -> None:
        self.source, self.encoder_output = list(source_ids), None

    def prefill(self, sequence: list[int], hidden: bool = False) -> torch.Tensor | None:
        if hidden:
            raise ValueError("a feature-level drafter reads a decoder-only target's states")
        return None

    def logits(self, sequence: list[int], n_logits: int = 1, n_hidden: int = 0,
               then: torch.Tensor | None = None) -> torch.Tensor:
        if n_hidden:
            raise ValueError("a feature-level drafter reads a decoder-only target's states")
        if self.encoder_output is None:
            ids = torch.tensor([self.source], dtype=torch.long, device=self.device)
            self.encoder_output = self.model.get_encoder()(input_ids=ids)
            self.encodes += 1
        ids = torch.tensor(sequence, dtype=torch.long, device=self.device)
        if then is not None and then.shape[0]:
            ids = torch.cat([ids, then])
        output = self.model(encoder_outputs=self.encoder_output, decoder_input_ids=ids.view(1, -1), use_cache=False)
        self.counts.add(ids.shape[0], n_logits)
        logits = output.logits[0, -n_logits:]
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        return logits


def recomputing_lm(model: torch.nn.Module, vocab_size: int | None = None) -> RecomputingLM:
    """A `RecomputingLM`, or its encoder-decoder variant for an encoder-decoder model."""
    return (EncoderDecoderRecomputingLM if is_encoder_decoder(model) else RecomputingLM)(model, vocab_size)
