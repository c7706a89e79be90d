"""One causal LM serving several requests at once: one forward per round for every row, each row
with its own positions, its own rollback and its own end.

Rows accept different numbers of drafts, so nothing may wait on the slowest row or roll the whole
batch back. The cache is transformers' `DynamicCache` with one slot axis shared by all rows
[rows, kv_heads, slots, head_dim]; each row remembers which slot holds each of its positions:

    row 0   p0 p1 p2 p3 ·· ·· d1 d2 ·· x  …     (·· a hole: padding, or a draft the target refused)
    row 1   p0 p1 ·· ·· ·· ·· q0 ·· ·· y  …

A forward appends the same number of slots to every row (its feed, padded to the longest); a
row's unused or refused slots become holes: masked out of every later query's attention, never
recomputed, never copied. Positions (and so the rotary phase) count a row's own tokens, not slots,
so a row computes what it would compute alone, up to the order of float sums. When holes outweigh
what rows hold, `compact` gathers each row's slots to the front; a row that has finished leaves the
batch (`drop`), so it stops costing the others work.

The mask is built here as a 4D boolean [rows, 1, queries, keys] and passed as is: each query sees
its row's live slots before it and the row's own earlier queries. A padded query sees itself, so
that no row of the softmax is empty.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .lm import forward_with_features
from ..tokens import common_prefix_length

# A layer's buffer grows to at least this many slots, and then by doubling.
FIRST_CAPACITY = 64
# Compact when the slot axis is longer than this many times the longest row (and by more than the
# floor): holes then cost more attention than a gather of the live slots.
COMPACT_RATIO = 2.0
COMPACT_FLOOR = 64


class BatchedLM:
    """A causal LM and one KV cache for `rows` requests; rows are named 0..rows − 1 for their life."""

    def __init__(self, model: torch.nn.Module, rows: int, vocab_size: int | None = None):
        attention = getattr(model.config, "_attn_implementation", None)
        if attention not in ("sdpa", "eager"):
            raise ValueError(f"a batch masks each row's own positions, which needs the model's attention to take a "
                             f"custom mask (sdpa or eager); this model uses {attention!r}")
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        if not all(type(layer) is DynamicLayer for layer in self.cache.layers):
            kinds = sorted({type(layer).__name__ for layer in self.cache.layers})
            raise ValueError(f"a batch keeps full-attention caches only, not {', '.join(kinds)}")
        self.cache.layers = [GrowingLayer() for _ in self.cache.layers]
        self.feature_layers: tuple[int, ...] = ()
        self.cached_ids: list[list[int]] = [[] for _ in range(rows)]
        self.slots: list[list[int]] = [[] for _ in range(rows)]  # the slot of each cached position, per row
        self.live = torch.zeros(rows, 0, dtype=torch.bool, device=self.device)  # [rows in the cache, slots]
        self.members = list(range(rows))  # which row each index of the cache's batch axis holds
        self.forwards = 0
        self.kv_bytes_peak = 0

    def read_features(self, layers: tuple[int, ...]) -> None:
        """Keep these intermediate layers' states beside the final one where hidden states are asked for."""
        self.feature_layers = tuple(layers)

    def prefill(self, sequences: dict[int, list[int]], hidden: bool = False) -> dict[int, torch.Tensor | None]:
        """Cache every position of each row's sequence; with `hidden`, each row's final states [len, d]
        (None for an empty sequence)."""
        return self.forward(sequences, {row: 0 for row in sequences}, hidden=hidden, all_states=True)[1]

    def forward(self, feeds: dict[int, list[int] | tuple[list[int], torch.Tensor]], n_out: dict[int, int],
                hidden: bool = False, all_states: bool = False):
        """One forward for the rows in `feeds`: each row's sequence so far, or (sequence, drafts on the
        device). A row keeps the longest prefix its cache shares with the sequence (the rest becomes
        holes) and feeds what follows, drafts last. Returns ({row: logits [n_out, V]}, {row: states
        [n_out, d] or None}) for the last n_out fed positions of each row (with `all_states`, the
        states of every fed position)."""
        fed: dict[int, torch.Tensor] = {}
        for row, feed in feeds.items():
            sequence, then = feed if isinstance(feed, tuple) else (feed, None)
            k = 0 if then is None else then.shape[0]
            keep = common_prefix_length(self.cached_ids[row], sequence)
            keep = min(keep, len(sequence) + k - max(n_out[row], 1 if k or not all_states else 0))
            self._rollback(row, max(keep, 0))
            new = torch.tensor(sequence[keep:], dtype=torch.long, device=self.device)
            fed[row] = torch.cat([new, then]) if k else new
            self.cached_ids[row].extend(sequence[keep:])
        return self._run(fed, n_out, hidden, all_states)

    def feed(self, drafts: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Append each row's ids on the device [k] after what it holds, with no rollback; {row: logits [k, V]}.
        The host learns the ids later (`note_fed` for those kept): a draft model feeds its own drafts so."""
        return self._run(drafts, {row: ids.shape[0] for row, ids in drafts.items()}, False, False)[0]

    def note_fed(self, row: int, ids: list[int]) -> None:
        """Record ids that `forward` appended from a device tensor (read back with the round's verdict)."""
        self.cached_ids[row].extend(ids)

    def drop(self, *rows: int) -> None:
        """These rows have finished: take them out of the cache, in one copy of what stays."""
        gone = set(rows)
        if not gone:
            return
        keep = [i for i, row in enumerate(self.members) if row not in gone]
        self.members = [self.members[i] for i in keep]
        for row in gone:
            self.slots[row], self.cached_ids[row] = [], []
        self._select(torch.tensor(keep, dtype=torch.long, device=self.device))

    def compact(self) -> None:
        """Gather each row's live slots to the front of the slot axis, dropping the holes."""
        held = [len(self.slots[row]) for row in self.members]
        width = max(held, default=0)
        if not self.members or self.live.shape[1] == width:
            return
        index = torch.zeros(len(self.members), width, dtype=torch.long, device=self.device)
        live = torch.zeros(len(self.members), width, dtype=torch.bool, device=self.device)
        for i, row in enumerate(self.members):
            n = len(self.slots[row])
            index[i, :n] = torch.tensor(self.slots[row], dtype=torch.long, device=self.device)
            live[i, :n] = True
            self.slots[row] = list(range(n))
        with torch.inference_mode():
            for layer in self.cache.layers:
                gather = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
                layer.replace(layer.keys.gather(2, gather), layer.values.gather(2, gather))
        self.live = live

    def close(self) -> None:
        self.cache = None

    # -- internals -----------------------------------------------------------------------------
    def _rollback(self, row: int, length: int) -> None:
        gone = self.slots[row][length:]
        if gone:
            self.live[self.members.index(row), gone] = False
            del self.slots[row][length:]
        del self.cached_ids[row][length:]

    def _run(self, fed: dict[int, torch.Tensor], n_out: dict[int, int], hidden: bool, all_states: bool):
        if any(row not in self.members for row in fed):
            raise ValueError("a row that left the batch cannot be fed")
        rows = len(self.members)
        width = max(ids.shape[0] for ids in fed.values())
        if width == 0:
            return {row: None for row in fed}, {row: None for row in fed}
        past = self.live.shape[1]
        ids = torch.zeros(rows, width, dtype=torch.long, device=self.device)
        positions = torch.zeros(rows, width, dtype=torch.long, device=self.device)
        new_live = torch.zeros(rows, width, dtype=torch.bool, device=self.device)
        for i, row in enumerate(self.members):
            n = fed[row].shape[0] if row in fed else 0
            start = len(self.slots[row])
            if n:
                ids[i, :n] = fed[row]
            positions[i] = torch.arange(start, start + width, device=self.device)
            new_live[i, :n] = True
            self.slots[row].extend(range(past, past + n))
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril()
        allowed = torch.cat([self.live[:, None, :].expand(rows, width, past),
                             (causal[None] & new_live[:, None, :]) | torch.eye(width, dtype=torch.bool,
                                                                             device=self.device)[None]], dim=2)
        kwargs = dict(input_ids=ids, position_ids=positions, attention_mask=self._as_mask(allowed[:, None]),
                      cache=self.cache, use_cache=True)
        logits, states = self._logits_and_states(kwargs, hidden, with_logits=any(n_out.values()))
        self.forwards += 1
        self.live = torch.cat([self.live, new_live], dim=1)
        self.kv_bytes_peak = max(self.kv_bytes_peak, sum(layer.allocated_bytes for layer in self.cache.layers))
        if self.vocab_size is not None and logits is not None:
            logits = logits[..., : self.vocab_size]
        out_logits, out_states = {}, {}
        for i, row in enumerate(self.members):
            if row not in fed:
                continue
            n = fed[row].shape[0]
            first = 0 if all_states else n - n_out[row]
            out_logits[row] = logits[i, n - n_out[row] : n] if n_out[row] else None
            out_states[row] = states[i, first:n] if states is not None and n > first else None
        if self.live.shape[1] > max(COMPACT_FLOOR, COMPACT_RATIO * max(len(self.slots[r]) for r in self.members)):
            self.compact()
        return out_logits, out_states

    def _logits_and_states(self, kwargs: dict, hidden: bool, with_logits: bool):
        """Logits [rows, width, V] (None when no row asked for any: a prefill) and, with `hidden`, the states a
        feature drafter reads, from one pass of the decoder."""
        if not hidden:
            if not with_logits:
                self.model.get_decoder()(**kwargs)
                return None, None
            return self.model(**kwargs).logits, None
        return forward_with_features(self.model, self.feature_layers, with_logits=with_logits, **kwargs)

    def _select(self, index: torch.Tensor) -> None:
        with torch.inference_mode():
            for layer in self.cache.layers:
                if layer.is_initialized and layer.keys.numel():
                    layer.replace(layer.keys.index_select(0, index), layer.values.index_select(0, index))
        self.live = self.live.index_select(0, index)

    def _as_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """The boolean mask as the model's attention takes it (sdpa: bool; eager: additive)."""
        if getattr(self.model.config, "_attn_implementation", None) == "sdpa":
            return allowed
        dtype = next(self.model.parameters()).dtype
        return torch.where(allowed, torch.zeros((), dtype=dtype, device=self.device), torch.finfo(dtype).min)


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values live in a buffer that doubles when full, so a forward writes its
    new slots in place instead of copying the whole cache (`DynamicLayer` concatenates, which for a batch of
    long rows costs as much as the forward's attention). `keys` and `values` are views of what is held."""

    buffers: tuple[torch.Tensor, torch.Tensor] | None = None
    held = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self._reserve(self.held + n, key_states)
        keys, values = self.buffers
        keys[:, :, self.held : self.held + n] = key_states
        values[:, :, self.held : self.held + n] = value_states
        self._hold(self.held + n)
        return self.keys, self.values

    def replace(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold these keys and values [rows, kv_heads, slots, head_dim] instead (rows dropped, slots gathered)."""
        self.buffers = None
        self._reserve(keys.shape[2], keys)
        self.buffers[0][:, :, : keys.shape[2]] = keys
        self.buffers[1][:, :, : keys.shape[2]] = values
        self._hold(keys.shape[2])

    @property
    def allocated_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers) if self.buffers else 0

    def _reserve(self, slots: int, like: torch.Tensor) -> None:
        if self.buffers is not None and self.buffers[0].shape[2] >= slots and self.buffers[0].shape[0] == like.shape[0]:
            return
        capacity = max(FIRST_CAPACITY, 2 * slots)
        shape = (like.shape[0], like.shape[1], capacity, like.shape[3])
        fresh = tuple(torch.empty(shape, dtype=like.dtype, device=like.device) for _ in range(2))
        if self.buffers is not None and self.held:
            for new, old in zip(fresh, self.buffers):
                new[:, :, : self.held] = old[:, :, : self.held]
        self.buffers = fresh

    def _hold(self, slots: int) -> None:
        self.held = slots
        self.keys, self.values = (b[:, :, :slots] for b in self.buffers)
