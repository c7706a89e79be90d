"""One causal LM and its KV cache. Every transformers cache detail lives here.

A `CachedLM` belongs to one generation: the model weights are shared between
requests, the cache never is.

Two cache kinds:
  dynamic  transformers' `DynamicCache`: keys and values grow by concatenation;
           rolling back slices them (`crop`).
  static   transformers' `StaticCache`: keys and values are preallocated for
           `max_length` positions [1, kv_heads, max_length, head_dim] per layer and
           written in place at the cache's length. Rolling back only moves that
           length (an in-place fill of a device scalar): nothing is copied or
           reallocated, and stale positions past the length are hidden by the causal
           mask (a query at position t attends to keys 0..t only).

With `compile=True` (static cache only) the forward over a few new tokens runs
through `torch.compile`: on CUDA in "reduce-overhead" mode (CUDA graphs), elsewhere
in the default mode. Feeds are padded to a small set of lengths (`buckets`), so a
changing draft length never recompiles; padding writes past the real length, which
the next rollback or feed hides like any stale position. Longer feeds, and the prefill
whatever its length, run eagerly: the prefill is timed and comes before `warm_up`, so a
short prompt through a step not yet compiled would count its compilation as decoding. Compiled steps and their caches are kept per model and reused by later
generations, so a graph is compiled once per model and bucket.

Encoder-decoder models (T5, BART, ...) go through `seq2seq.EncoderDecoderLM`, a `CachedLM`
whose source runs through the encoder once.

A dynamic cache may be given a KV policy (`set_kv_policy`, see `kv_policy.py`): it then keeps
a bounded set of positions, and new tokens are fed at their true positions. Every cache
records the most bytes its keys and values held (`kv_bytes_peak`).
"""

from __future__ import annotations

import threading
import time
import weakref

import torch
from transformers import DynamicCache, StaticCache
from transformers.cache_utils import StaticLayer

from .kv_policy import KVPolicy, check_cache_takes, compress, kv_bytes, track_attention
from .lean import causal_mask, lean_forward_fits, lean_logits
from ..tokens import common_prefix_length
from ..trace import FedCounts

CACHE_KINDS = ("dynamic", "static")


def buckets_up_to(longest: int) -> tuple[int, ...]:
    """Padded feed lengths: powers of two below `longest`, then `longest` itself (1, 2, 4, 7 for 7)."""
    sizes, b = [], 1
    while b < longest:
        sizes.append(b)
        b *= 2
    return tuple(sizes + [longest])


_STEPS: "weakref.WeakKeyDictionary[torch.nn.Module, dict[tuple[int, ...], object]]" = weakref.WeakKeyDictionary()
_POOL: "weakref.WeakKeyDictionary[torch.nn.Module, dict[int, list[StaticCache]]]" = weakref.WeakKeyDictionary()
_POOL_LOCK = threading.Lock()
# Compiled caches are reused across generations: lengths are rounded up to this, so
# that graphs see a few cache shapes (and, pooled, the same addresses) again and again.
POOLED_LENGTH_STEP = 256


def forward_with_features(model: torch.nn.Module, layers: tuple[int, ...] = (), with_logits: bool = True,
                          **kwargs) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Logits and the states a feature-level drafter reads, [1, n, (len(layers) + 1) · d], from one pass.

    The states are the chosen `layers` (indices into transformers' `hidden_states`: 0 is the
    embedding, i the output of layer i) followed by the final, normed state the LM head reads.
    With no layers only the final state comes back and no intermediate state is kept. Without
    `with_logits` the LM head is skipped and None comes back in the logits' place (a prefill).
    """
    decoder = model.get_decoder()
    if layers:
        out = decoder(**kwargs, output_hidden_states=True)
        features = torch.cat([out.hidden_states[i] for i in layers] + [out.last_hidden_state], dim=-1)
    else:
        out = decoder(**kwargs)
        features = out.last_hidden_state
    logits = model.get_output_embeddings()(out.last_hidden_state) if with_logits else None
    return logits, features


def _compiled_step(model: torch.nn.Module, layers: tuple[int, ...] = ()):
    steps = _STEPS.setdefault(model, {})
    step = steps.get(layers)
    if step is None:
        def forward(input_ids: torch.Tensor, cache: StaticCache) -> tuple[torch.Tensor, torch.Tensor]:
            return forward_with_features(model, layers, input_ids=input_ids, cache=cache, use_cache=True)

        cuda = next(model.parameters()).device.type == "cuda"
        # One code object serves every model and bucket: leave room for several pairs.
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        step = torch.compile(forward, mode="reduce-overhead" if cuda else None, dynamic=False)
        steps[layers] = step
    return step


def _take_cache(model: torch.nn.Module, max_length: int) -> StaticCache:
    with _POOL_LOCK:
        free = _POOL.setdefault(model, {}).get(max_length)
        if free:
            return free.pop()
    return StaticCache(config=model.config, max_cache_len=max_length)


def _give_cache(model: torch.nn.Module, cache: StaticCache) -> None:
    with _POOL_LOCK:
        _POOL.setdefault(model, {}).setdefault(cache.layers[0].max_cache_len, []).append(cache)


def default_cache_kind(device: torch.device | str) -> str:
    """Static on CUDA (where launch overhead and cache copies dominate), dynamic elsewhere."""
    return "static" if torch.device(device).type == "cuda" else "dynamic"


class CachedLM:
    """A causal LM that remembers which token ids its KV cache holds.

    `logits(sequence, n)` feeds only the part of `sequence` the cache does not already
    hold (after rolling the cache back to the longest common prefix) and returns the
    logits of the last n positions. Rolling back never recomputes anything.

    cache: "dynamic" or "static"; a static cache needs `max_length`, the most
    positions the generation can ever hold (prompt + new tokens + padding slack).
    """

    # torch's thread count while a round runs between this writer's forwards; None: as it is. A target on
    # another runtime names one, since that runtime's own pool holds the cores during its forwards.
    torch_threads: int | None = None

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None, cache: str = "dynamic",
                 max_length: int | None = None, compile: bool = False, buckets: tuple[int, ...] = (1,)):
        if cache not in CACHE_KINDS:
            raise ValueError(f"cache: {cache!r} is not one of {', '.join(CACHE_KINDS)}")
        if compile and cache != "static":
            raise ValueError("compile: graph capture needs cache='static'")
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.kind = cache
        self.max_length = max_length
        self.cached_ids: list[int] = []
        self.length = 0  # positions the cache holds (cached_ids may lag behind until `note_fed`)
        self.counts = FedCounts()  # forwards, tokens fed and logit rows, prefill included
        self.hidden: torch.Tensor | None = None  # see feed(n_hidden=...)
        self.feature_layers: tuple[int, ...] = ()  # see read_features
        self.compiled = compile
        self.buckets = tuple(sorted(set(buckets)))
        self._step = None
        self._prefilling = False  # feeds run eagerly (see `prefill`)
        self.kv_policy = KVPolicy()
        self._attention_masses = None  # `head`: each layer's attention mass (kv_policy.track_attention)
        self.evicted = 0  # positions a KV policy dropped: the cache holds length − evicted
        self._compressed_at = 0  # the length at the last compression (no rollback goes below it)
        self.kv_bytes_peak = 0
        self.kv_peak_sink: tuple[dict, str] | None = None  # (a record, its key), kept at the peak too
        if cache == "static":
            if not max_length or max_length < 1:
                raise ValueError("cache: a static cache needs max_length ≥ 1")
            if compile:
                self.max_length = -(-(max_length + max(self.buckets)) // POOLED_LENGTH_STEP) * POOLED_LENGTH_STEP
                self.cache = _take_cache(model, self.max_length)
                if self.cache.is_initialized:
                    self._set_length(0)
                self._step = _compiled_step(model)
            else:
                self.cache = StaticCache(config=model.config, max_cache_len=max_length)
            if not all(type(layer) is StaticLayer for layer in self.cache.layers):
                kinds = sorted({type(layer).__name__ for layer in self.cache.layers})
                raise ValueError(f"cache: static rollback supports full-attention layers only, not {', '.join(kinds)};"
                                 " use cache='dynamic' for this model")
            # Keys and values are allocated by the first forward (prefill), with the
            # model's own head shapes and dtype; from then on their addresses never change.
        else:
            self.cache = DynamicCache(config=model.config)

    @property
    def forwards(self) -> int:
        """Forwards so far, prefill included: `counts.forwards`."""
        return self.counts.forwards

    def __len__(self) -> int:
        return len(self.cached_ids)

    def rollback(self, length: int) -> None:
        """Forget every cached position from `length` on."""
        surplus = self.length - length
        if surplus > 0 and self.evicted:
            surplus = self._rollback_compressed(length)
        if surplus > 0:
            if self.kind == "static":
                self._set_length(length)
            else:
                # transformers 5 counts the tokens to remove as a negative number.
                self.cache.crop(-surplus)
            self.length = length
        del self.cached_ids[length:]

    def _rollback_compressed(self, length: int) -> int:
        """Positions to crop to roll a compressed cache back to `length`: all of them for 0, else
        those after `length`, which must all have been added since the last compression."""
        if length == 0:
            surplus, self.evicted, self._compressed_at = self.length - self.evicted, 0, 0
            return surplus
        if length < self._compressed_at - 1:
            raise RuntimeError(f"cannot roll a compressed cache back to {length}: positions before "
                               f"{self._compressed_at - 1} may have been evicted")
        return self.length - length

    # -- KV policies and memory (kv_policy.py) ------------------------------------------------
    def set_kv_policy(self, policy: KVPolicy, who: str = "kv") -> None:
        """Keep at most `policy.budget` committed positions from now on (before the prefill)."""
        if policy.compresses and (self.kind != "dynamic" or self.compiled):
            raise ValueError(f"{who}={policy.kind}: KV policies compress the dynamic cache; this run uses the "
                             f"{self.kind} cache{' with compile' if self.compiled else ''}: use cache='dynamic' "
                             "without compile")
        check_cache_takes(self.cache, policy, who)
        self._attention_masses = track_attention(self.model, policy, who)  # what `head` scores positions by
        self.kv_policy = policy

    def _compress(self) -> None:
        """Apply the KV policy to what the cache holds now (committed positions only: see `logits`)."""
        if self.kv_policy.compresses and self.length - self.evicted > self.kv_policy.budget:
            self.evicted += compress(self.cache, self.kv_policy, self._attention_masses)
            self._compressed_at = self.length

    def _positions(self, n: int) -> dict:
        """position_ids for n new tokens where positions were evicted: their true positions, since
        transformers would count them from the cache's (smaller) length."""
        if not self.evicted:
            return {}
        return {"position_ids": torch.arange(self.length, self.length + n, device=self.device).view(1, -1)}

    def _note_kv(self) -> None:
        if self.kind == "static" and self.kv_bytes_peak:
            return  # allocated whole by the first forward: its size never changes
        self._note_held(kv_bytes(self.cache))

    def _note_held(self, held: int) -> None:
        """`held` bytes of keys and values now: the peak, and the record's, kept at the most."""
        if held > self.kv_bytes_peak:
            self.kv_bytes_peak = held
            if self.kv_peak_sink is not None:
                record, key = self.kv_peak_sink
                record[key] = max(record.get(key, 0), held)

    def _set_length(self, length: int) -> None:
        # In place: the length tensors keep their addresses (a captured graph reads them). Under
        # inference mode, because a cache that a generation initialised on a GPU holds inference
        # tensors, and only inference mode may write to those.
        with torch.inference_mode():
            for layer in self.cache.layers:
                layer.cumulative_length.fill_(length)

    def close(self) -> None:
        """Let go of the cache now (a compiled one goes back to the model's pool)."""
        if self.cache is not None and self._step is not None:
            _give_cache(self.model, self.cache)
        self.cache = None

    def warm_up(self) -> float:
        """Compile (or capture) the step for every bucket now; seconds spent. Call after the prefill.
        Nothing to do where dynamo is switched off (a CPU rehearsal of the GPU suite): the step runs eagerly."""
        if self._step is None or torch._dynamo.config.disable:
            return 0.0
        start, length, ids = time.perf_counter(), self.length, list(self.cached_ids)
        # CUDA graph trees record on the second or third call; elsewhere the first call compiles.
        calls = 3 if self.device.type == "cuda" else 1
        for size in self.buckets:
            for _ in range(calls):
                self.feed(torch.zeros(size, dtype=torch.long, device=self.device), 1)
                self.rollback(length)
        self.cached_ids = ids
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start

    def read_features(self, layers: tuple[int, ...]) -> None:
        """Keep these intermediate layers' states beside the final one wherever hidden states are
        asked for (a fused-feature drafter reads them); forwards without n_hidden are unchanged."""
        self.feature_layers = tuple(layers)
        if self._step is not None:
            self._step = _compiled_step(self.model, self.feature_layers)

    def feed(self, new_ids: torch.Tensor, n_logits: int, n_hidden: int = 0) -> torch.Tensor:
        """Append new_ids [n] (on the model's device) to the cache; logits [n_logits, V].

        With n_hidden > 0 the states of the last n_hidden fed positions are kept in `self.hidden`
        [n_hidden, d], or [n_hidden, (k + 1) · d] with k `feature_layers` (from the same forward:
        a feature-level drafter reads them).
        """
        n = new_ids.shape[0]
        compiled = self._step is not None and not self._prefilling
        size = next((b for b in self.buckets if b >= n), None) if compiled else None
        if self.kind == "static" and self.length + (size or n) > self.max_length:
            raise ValueError(f"static cache: {self.length} + {n} positions exceed its max_length {self.max_length}")
        if size is not None:
            padded = torch.nn.functional.pad(new_ids, (0, size - n)) if size > n else new_ids
            if self.device.type == "cuda":
                torch.compiler.cudagraph_mark_step_begin()
            # Clone: a captured graph overwrites its output on the next replay.
            logits, hidden = self._step(padded.view(1, -1), self.cache)
            logits = logits[0, n - n_logits : n].clone()
            if n_hidden:
                self.hidden = hidden[0, n - n_hidden : n].clone()
            if size > n:
                self._set_length(self.length + n)
        else:
            logits = self._forward_eagerly(new_ids.view(1, -1), n_logits, n_hidden)
        self.length += n
        self.counts.add(n, n_logits)
        self._note_kv()
        if self.vocab_size is not None:
            logits = logits[..., : self.vocab_size]
        return logits

    def _forward_eagerly(self, ids: torch.Tensor, n_logits: int, n_hidden: int) -> torch.Tensor:
        """One eager forward of ids [1, n] at the cache's length: logits [n_logits, V], and the hidden
        states as `feed` keeps them. Through the lean forward where it fits, else transformers' call."""
        n = ids.shape[1]
        if not self.evicted and lean_forward_fits(self.model, self.cache):
            # A static cache's rows are placed by the host-side length: the positions and the mask that
            # transformers would build from the cache (for one row too) come from it.
            placed = {} if self.kind == "dynamic" else dict(
                position_ids=torch.arange(self.length, self.length + n, device=self.device).view(1, -1),
                attention_mask=self._static_mask(n))
            logits, hidden = lean_logits(self.model, ids, self.cache, n_logits,
                                         self.feature_layers if n_hidden else None, **placed)
        else:
            logits, hidden = self._transformers_forward(n_logits, n_hidden, input_ids=ids,
                                                        attention_mask=self._explicit_mask(n), **self._positions(n))
        if n_hidden:
            self.hidden = hidden[0, -n_hidden:]
        return logits[0, -n_logits:]

    def _transformers_forward(self, n_logits: int, n_hidden: int, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """transformers' own call on the cache: logits [1, ≥ n_logits, V], and with n_hidden the feature states."""
        if n_hidden:
            return forward_with_features(self.model, self.feature_layers, **inputs, cache=self.cache, use_cache=True)
        return self.model(**inputs, cache=self.cache, use_cache=True, logits_to_keep=n_logits).logits, None

    def _explicit_mask(self, n: int) -> torch.Tensor | None:
        """A static cache's causal mask for n new tokens, built from the host-side length.

        transformers builds the same mask itself, but to decide whether it may skip it
        for n > 1 it reads the cache's device-side length back to the host: a sync per
        verification. Eager static feeds of several tokens pass this mask instead.
        """
        implementation = getattr(self.model.config, "_attn_implementation", None)
        if self.kind != "static" or n == 1 or implementation not in ("sdpa", "eager"):
            return None
        return self._static_mask(n)

    def _static_mask(self, n: int) -> torch.Tensor:
        """[1, 1, n, max_length]: each new row sees the cache's keys up to its own position."""
        return self._as_attention_mask(causal_mask(self.length, n, self.max_length, self.device))

    def note_fed(self, ids: list[int]) -> None:
        """Record ids that `feed` appended from a device tensor (read back later in one go)."""
        self.cached_ids.extend(ids)

    def logits(self, sequence: list[int], n_logits: int = 1, n_hidden: int = 0,
               then: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [n_logits, V] at the last n_logits positions of `sequence` followed by `then`
        (and, with n_hidden, their final hidden states in `self.hidden`).

        then [k]: ids on the device (a round's drafts), fed without reading them back; pass
        them to `note_fed` once they are on the host.
        """
        k = 0 if then is None else then.shape[0]
        keep = common_prefix_length(self.cached_ids, sequence)
        # At least n_logits (n_hidden) tokens must go through the model to get their outputs.
        keep = min(keep, len(sequence) + k - max(n_logits, n_hidden))
        self.rollback(keep)
        self._compress()  # only committed positions are cached now: none of them is rolled back later
        new = sequence[keep:]
        ids = torch.tensor(new, dtype=torch.long, device=self.device)
        logits = self.feed(torch.cat([ids, then]) if k else ids, n_logits, n_hidden)
        self.cached_ids.extend(new)
        return logits

    def prefill(self, sequence: list[int], hidden: bool = False) -> torch.Tensor | None:
        """Cache every position of `sequence` (no logits needed). With `hidden`, return the
        final hidden states at every position of `sequence` [len(sequence), d]. Eager, also where
        the steps are compiled: see the module's notes."""
        self._prefilling = True
        try:
            return self._prefill(sequence, hidden)
        finally:
            self._prefilling = False

    def _prefill(self, sequence: list[int], hidden: bool) -> torch.Tensor | None:
        if hidden:
            if not sequence:
                return None
            self.rollback(0)
            self.logits(sequence, 1, n_hidden=len(sequence))
            return self.hidden
        if len(sequence) > len(self.cached_ids) or sequence[: len(self.cached_ids)] != self.cached_ids:
            if self.kv_policy.compresses:  # in chunks of the budget, compressed between them: a bounded peak
                for end in range(self.kv_policy.budget, len(sequence), self.kv_policy.budget):
                    self.logits(sequence[:end], 1)
            self.logits(sequence, 1)
        return None

    # -- trees of drafts (one forward over every node, then keep the accepted path) ---------
    def tree_logits(self, sequence: list[int], tree_tokens: torch.Tensor, ancestors: torch.Tensor,
                    depths: torch.Tensor, n_hidden: bool = False) -> torch.Tensor:
        """Logits [n + 1, V] at the last position of `sequence` and after each of n tree drafts.

        tree_tokens [n], ancestors [n, n] (row i sees column j iff j is i or an ancestor of i)
        and depths [n] (≥ 1) describe the tree; every draft attends to the whole context and to
        its ancestors, at position len(sequence) − 1 + depth. With n_hidden the final hidden states
        of the same n + 1 rows are kept in `self.hidden`. Afterwards the cache holds the context
        and then every draft in row order; `keep_tree_path` keeps the accepted ones.
        Always eager: a tree's shape changes every round.
        """
        if self.kv_policy.compresses:
            raise ValueError(f"trees index the cache by position; a compressed cache ({self.kv_policy.kind}) "
                             "cannot verify one: use a chain method or the full cache")
        if getattr(self.model.config, "_attn_implementation", None) not in ("sdpa", "eager"):
            raise ValueError("trees need the model's attention to take a custom mask (sdpa or eager); "
                             f"this model uses {self.model.config._attn_implementation!r}")
        n = tree_tokens.shape[0]
        keep = min(common_prefix_length(self.cached_ids, sequence), len(sequence) - 1)
        self.rollback(keep)
        new = sequence[keep:]
        m, context = len(new), len(sequence)
        if self.kind == "static" and self.length + m + n > self.max_length:
            raise ValueError(f"static cache: {self.length} + {m + n} positions exceed its max_length {self.max_length}")
        device = self.device
        ids = torch.cat([torch.tensor(new, dtype=torch.long, device=device), tree_tokens])
        positions = torch.cat([torch.arange(keep, context, device=device), depths.to(device) + context - 1])
        keys = self.max_length if self.kind == "static" else context + n
        allowed = torch.zeros(m + n, keys, dtype=torch.bool, device=device)
        allowed[:m, :context] = causal_mask(keep, m, context, device)[0, 0]
        allowed[m:, :context] = True
        allowed[m:, context : context + n] = ancestors.to(device)
        inputs = dict(input_ids=ids.view(1, -1), position_ids=positions.view(1, -1),
                      attention_mask=self._as_attention_mask(allowed[None, None]))
        if lean_forward_fits(self.model, self.cache):
            logits, hidden = lean_logits(self.model, cache=self.cache, logits_to_keep=n + 1,
                                         hidden_layers=self.feature_layers if n_hidden else None, **inputs)
        else:
            logits, hidden = self._transformers_forward(n + 1, n_hidden, **inputs)
        if n_hidden:
            self.hidden = hidden[0, m - 1 :]
        self.counts.add(m + n, n + 1)
        self.length += m + n
        self._note_kv()
        self.cached_ids.extend(new)
        logits = logits[0, -(n + 1) :]
        return logits[..., : self.vocab_size] if self.vocab_size is not None else logits

    def _as_attention_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """A boolean [1, 1, q, k] mask as the model's attention takes it (sdpa: bool; else additive)."""
        if getattr(self.model.config, "_attn_implementation", None) == "sdpa":
            return allowed
        dtype = next(self.model.parameters()).dtype
        return torch.where(allowed, torch.zeros((), dtype=dtype, device=self.device), torch.finfo(dtype).min)

    def keep_tree_path(self, rows: list[int]) -> None:
        """After `tree_logits`: keep the drafts at these tree rows (0-based, in path order) right
        after the context and forget every other draft. Nothing is recomputed: the kept keys and
        values move into place (they were computed at the positions they now occupy)."""
        context = len(self.cached_ids)
        if rows != list(range(len(rows))):  # a path that is a prefix of the rows is in place already
            source = torch.tensor([context + r for r in rows], dtype=torch.long, device=self.device)
            target = torch.arange(context, context + len(rows), device=self.device)
            with torch.inference_mode():
                for layer in self.cache.layers:
                    layer.keys.index_copy_(2, target, layer.keys.index_select(2, source))
                    layer.values.index_copy_(2, target, layer.values.index_select(2, source))
        self.rollback(context + len(rows))
