"""The target on ONNX Runtime (onnxruntime-genai) instead of torch: the same cached-LM interface.

`OnnxTarget` holds an exported model folder (`specdemo.engine.runtimes.onnx_export` writes it) and one
runtime session per thread count; `OnnxTarget.cached_lm` gives the decode loop a writer that
answers exactly what `CachedLM` answers, so every chain method runs on it unchanged:

  feed      `Generator.append_tokens` over the new ids, one forward; the logits (and, for a
            drafter that reads them, the final normed hidden states) of every fed position come
            back from that forward (`get_output`, [1, n, V] and [1, n, d]).
  rollback  `Generator.rewind_to(length)`: the runtime's cache keeps its buffer and forgets the
            positions from `length` on.

What it cannot do is refused where it is asked for: trees (the runtime takes no attention mask
over a list of positions), intermediate layers' states, KV policies and graph capture.
onnxruntime-genai is imported only when a target is opened, so the engine runs without it.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import numpy as np
import torch

from ..targets.kv_policy import KVPolicy
from ..targets.lm import CachedLM
from ..trace import FedCounts
from . import ONNX, runtime_named

RUNTIME_NAME = ONNX
# ONNX Runtime's pool threads spin while they wait for work. Inside one forward that is what keeps a
# forward fast: a forward is a few hundred parallel sections, and waking sleeping threads for each one
# cost AR 15 % at 2 threads (46.7 against 55 tok/s, docs/runtime.md). After a forward, though, torch runs
# the drafter and the sampling, and threads still spinning take its cores: at 2 threads on a 2-core CPU
# that made AR 1.3x and the feature head's draft steps 1.7x slower. So the threads spin within a run and
# stop spinning when the run ends (`session.force_spinning_stop`).
SPIN_WITHIN_A_FORWARD = {"session.intra_op.allow_spinning": "1", "session.inter_op.allow_spinning": "1",
                         "session.force_spinning_stop": "1"}


# The runtime's pool takes the thread count asked for (torch's, as the page and the benchmark set it); torch's
# own work between two forwards (the drafter's steps, the sampling) runs on one thread. With both on 2
# threads on a 2-core CPU, torch's OpenMP workers, which wait on their last region a while, sat on the
# cores the runtime's next forward needed: AR 37 against 41 tok/s, SD and EGAG 5-8 % slower (docs/runtime.md).
TORCH_THREADS_BETWEEN_FORWARDS = 1


@contextlib.contextmanager
def torch_threads(count: int | None):
    """torch on `count` threads inside the block, and back to its count after (None: as it is)."""
    if count is None or count == torch.get_num_threads():
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def session_options(threads: int) -> dict:
    """onnxruntime-genai's `session_options` for a session of `threads` intra-op threads (the string
    entries that are not its own keys go to ONNX Runtime as session config entries)."""
    return {"intra_op_num_threads": threads, "inter_op_num_threads": 1, **SPIN_WITHIN_A_FORWARD}


class OnnxTarget:
    """An exported target folder and its runtime sessions, one per intra-op thread count (a
    session's thread count is fixed when it is created; the page and the benchmark set theirs
    through torch's, which the writer follows)."""

    def __init__(self, folder: Path | str, precision: str):
        import onnxruntime_genai  # noqa: F401  (fail here, with the loader's message, if missing)

        self.folder = Path(folder)
        self.precision = precision  # the runtime's weight precision: fp32, int8 or int4
        # Where the runtime's own search stops (its decoders as peers): the pair's EOS ids, set by the
        # loader before a session opens; the export's own config names one id only.
        self.eos_ids: tuple[int, ...] = ()
        config = json.loads((self.folder / "genai_config.json").read_text())
        self.vocab_size = int(config["model"]["vocab_size"])
        # What the cache's bytes are counted from (`OnnxCachedLM._note_kv`): the decoder's layers, whether past
        # and present share one buffer of max_length positions (the builder's choice on the CPU), and the name
        # of the first layer's key buffer among the outputs.
        decoder = config["model"]["decoder"]
        self.cache_layout = (int(decoder["num_hidden_layers"]),
                             bool(config.get("search", {}).get("past_present_share_buffer", False)),
                             decoder.get("outputs", {}).get("present_key_names", "present.%d.key") % 0)
        self._models: dict[int, object] = {}
        # (id(head), threads) -> (head, its step's session); the head is kept alive, so its id stays its own.
        self._head_steps: dict[tuple[int, int], tuple] = {}
        self._lock = threading.Lock()

    def model(self, threads: int):
        import onnxruntime_genai as og

        with self._lock:
            if threads not in self._models:
                config = og.Config(str(self.folder))
                # The export names the EOS id its padding id too, and the runtime's own search leaves padding
                # out of attention: a prompt ending in that id (a chat template's, a later turn's) lost its
                # last token. An id past the vocabulary pads nothing.
                overlay: dict = {"decoder": {"session_options": session_options(threads)},
                                 "pad_token_id": self.vocab_size}
                if self.eos_ids:
                    overlay["eos_token_id"] = list(self.eos_ids)
                config.overlay(json.dumps({"model": overlay}))
                self._models[threads] = og.Model(config)
            return self._models[threads]

    def feature_drafter(self, head):
        """The drafter for a feature head beside this target: its steps on the runtime too (one session
        per head, opened on first use), or torch's where the runtime cannot run them."""
        from ..drafters.feature_drafter import FeatureDrafter
        from .onnx_head import OnnxFeatureDrafter, open_head_step, runs_on_the_runtime

        if not runs_on_the_runtime(head):
            return FeatureDrafter(head)
        key = (id(head), torch.get_num_threads())  # the count asked for, as the target's session takes it
        with self._lock:
            if key not in self._head_steps:
                session = open_head_step(head, self.folder.parent / "heads", key[1], SPIN_WITHIN_A_FORWARD)
                self._head_steps[key] = (head, session)
            return OnnxFeatureDrafter(head, self._head_steps[key][1])

    def draft_lm(self, torch_model: torch.nn.Module, vocab_size: int | None, cache: str = "dynamic",
                 max_length: int | None = None, compile: bool = False, buckets=(1,)) -> CachedLM:
        """A draft LM's writer on this runtime (a `ModelDrafter`'s lm_factory). Until the decode loop names
        the cache's length, the torch copy's cache stands in: the runtime sizes its cache once, up front."""
        if max_length is None:
            from ..targets.seq2seq import cached_lm

            return cached_lm(torch_model, vocab_size, cache=cache)
        return self.cached_lm(torch_model, vocab_size, max_length, cache, compile)

    def cached_lm(self, torch_model: torch.nn.Module, vocab_size: int | None, max_length: int,
                  kind: str = "dynamic", compile: bool = False) -> "OnnxCachedLM":
        if compile:
            raise ValueError("compile: graph capture is torch's; the onnx runtime runs its own graph: turn compile off")
        return OnnxCachedLM(self.model(torch.get_num_threads()), torch_model, vocab_size, max_length,
                            self.cache_layout, kind)


class OnnxCachedLM(CachedLM):
    """A `CachedLM` whose forwards and cache are onnxruntime-genai's. `logits` and `prefill` are
    CachedLM's own (common prefix, rollback, one feed); only the forward and the rollback differ.

    torch_model: the same weights in torch, which the trace's weight count and a feature head read;
    cache_layout: (the decoder's layers, whether past and present share one buffer, the first layer's key
    buffer's name), `OnnxTarget.cache_layout`;
    kind: the cache kind the drafter's own torch cache takes (the writer's cache is the runtime's).
    """

    torch_threads = TORCH_THREADS_BETWEEN_FORWARDS  # torch's count while a round runs (`torch_threads`)

    def __init__(self, runtime_model, torch_model: torch.nn.Module, vocab_size: int | None, max_length: int,
                 cache_layout: tuple[int, bool, str], kind: str = "dynamic"):
        import onnxruntime_genai as og

        params = og.GeneratorParams(runtime_model)
        params.set_search_options(max_length=max_length)
        self.generator = og.Generator(runtime_model, params)
        self.model = torch_model
        self.vocab_size = vocab_size
        self.device = torch.device("cpu")
        self.kind = kind
        self.max_length = max_length
        self.cached_ids: list[int] = []
        self.length = 0
        self.counts = FedCounts()  # forwards, tokens fed and logit rows, as `CachedLM.counts`
        self.hidden: torch.Tensor | None = None
        self.feature_layers: tuple[int, ...] = ()
        self.compiled = False
        self.buckets = (1,)
        self._step = None
        self.kv_policy = KVPolicy()
        self.evicted = 0
        self._compressed_at = 0
        self.kv_bytes_peak = 0
        self.kv_peak_sink = None
        self._layers, self._shares_buffer, self._first_keys = cache_layout
        self.cache = self.generator

    def _note_kv(self) -> None:
        """The bytes the runtime's cache holds, read from its own first layer's key buffer (`present.0.key`,
        [1, kv heads, positions, head dim] at its dtype) times 2 (keys and values) times the layers, every
        layer of these decoders being alike. The export shares one buffer between past and present
        (`past_present_share_buffer`), which the runtime allocates for max_length positions and never
        resizes: what it holds is that whole buffer from the first forward on, however few positions are
        filled, as torch's static cache is counted, so it is read once. Without a shared buffer the runtime
        holds the positions so far, and the buffer is read after every forward."""
        if self.kv_bytes_peak and self._shares_buffer:
            return
        layer = np.asarray(self.generator.get_output(self._first_keys))
        self._note_held(2 * self._layers * layer.nbytes)

    def rollback(self, length: int) -> None:
        if length < self.length:
            self.generator.rewind_to(length)
            self.length = length
        del self.cached_ids[length:]

    def set_kv_policy(self, policy: KVPolicy, who: str = "kv") -> None:
        if policy.compresses:
            raise ValueError(f"{who}={policy.kind}: KV policies compress torch's cache; the onnx runtime keeps its "
                             "own full cache: use full, or runtime=torch")
        self.kv_policy = policy

    def read_features(self, layers: tuple[int, ...]) -> None:
        if layers:
            raise ValueError(f"this drafter reads the target's layers {list(layers)}; the onnx runtime exports "
                             "the final hidden state only: use a head that reads the final state, or runtime=torch")

    def warm_up(self) -> float:
        return 0.0

    def close(self) -> None:
        self.generator = self.cache = None

    def feed(self, new_ids: torch.Tensor, n_logits: int, n_hidden: int = 0) -> torch.Tensor:
        """Append new_ids [n] to the runtime's cache in one forward; logits [n_logits, V] (and
        with n_hidden, the last n_hidden positions' final states in `self.hidden`)."""
        n = new_ids.shape[0]
        if self.length + n > self.max_length:
            raise ValueError(f"onnx runtime cache: {self.length} + {n} positions exceed its max_length {self.max_length}")
        self.generator.append_tokens(new_ids.to(torch.int32).numpy().reshape(1, n))
        self.counts.add(n, n_logits)
        self.length += n
        self._note_kv()
        logits = torch.from_numpy(np.asarray(self.generator.get_output("logits"))[0, n - n_logits:])
        if n_hidden:
            self.hidden = torch.from_numpy(np.asarray(self.generator.get_output("hidden_states"))[0, n - n_hidden:])
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        return logits

    def tree_logits(self, *args, **kwargs):
        raise ValueError(runtime_named(RUNTIME_NAME).refusal(trees=True))
