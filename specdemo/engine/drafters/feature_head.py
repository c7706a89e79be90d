"""A feature-level draft head (EAGLE): drafts from the target's own hidden states.

At position j the head reads the target's final hidden state f_j and the embedding of the
token x_{j+1} that follows it, predicts the next hidden state f̂_{j+1} with one decoder layer,
and turns it into q(x_{j+2}) with the target's LM head restricted to a frequency-ranked subset
of the vocabulary. Drafting γ tokens feeds each prediction back as the next input feature.

A fused-feature head (EAGLE-3; `feature_layers` set) reads more than the final state: the
target hands it the states of a few intermediate layers beside the final one, [.., (k + 1) · d],
and a linear `fuse` mixes them into the d-wide input feature. Its own predictions, fed back
from a round's second draft on, are already d wide and skip the fusion.

Shapes: B batch, T positions, d the target's hidden size, S the subset size.

The head stores only what is its own (input projection, the decoder layer, a norm and the
subset's token ids); the embedding and LM-head rows are taken from the loaded target by
`bind`. Its KV cache is indexed by position, so rolling back rejected drafts moves an index.
Imports torch only.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..targets.few_rows import RowProducts

CONFIG_NAME = "feature_head.json"
WEIGHTS_NAME = "feature_head.safetensors"


@dataclass
class HeadConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's full vocabulary
    subset_size: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    kind: str = "feature-head"
    # Indices into the target's hidden_states (0: embeddings, i: after layer i) read beside the
    # final normed state; empty for a head that reads the final state alone.
    feature_layers: tuple[int, ...] = ()

    @classmethod
    def for_target(cls, config, subset_size: int) -> "HeadConfig":
        rope = getattr(config, "rope_parameters", None) or {}
        heads = config.num_attention_heads
        return cls(
            hidden_size=config.hidden_size, num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
            subset_size=subset_size, rope_theta=float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-5)),
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_normalised(x, self.eps) * self.weight


def rms_normalised(x: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class HeadCache:
    """Keys and values by position for one sequence; `length` positions are valid.

    peak_sink: (a record, its key) kept at the most bytes the keys and values have held, as the cached LMs
    keep theirs (`CachedLM.kv_peak_sink`): the whole allocation, grown rows included, since that is held."""

    def __init__(self, config: HeadConfig, device, dtype, capacity: int = 256,
                 peak_sink: tuple[dict, str] | None = None):
        self.k = torch.zeros(1, config.num_kv_heads, capacity, config.head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length = 0
        self.peak_sink = peak_sink
        self._note_held()

    @property
    def held_bytes(self) -> int:
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def _note_held(self) -> None:
        if self.peak_sink is not None:
            record, key = self.peak_sink
            record[key] = max(record.get(key, 0), self.held_bytes)

    def ensure(self, needed: int) -> None:
        capacity = self.k.shape[2]
        if needed <= capacity:
            return
        grown = max(needed, 2 * capacity)
        pad = (0, 0, 0, grown - capacity)
        self.k, self.v = F.pad(self.k, pad), F.pad(self.v, pad)
        self._note_held()

    def rollback(self, length: int) -> None:
        self.length = min(self.length, length)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Keep k, v [1, kv_heads, T, head_dim] after the positions held: (the keys and values of every position
        now held, the mask [T, held] by which each new position sees those before it and itself; None for one
        new position, which sees them all)."""
        t, start = k.shape[2], self.length
        self.ensure(start + t)
        self.k[:, :, start : start + t] = k
        self.v[:, :, start : start + t] = v
        self.length = start + t
        mask = None if t == 1 else torch.ones(t, start + t, dtype=torch.bool, device=k.device).tril(start)
        return self.k[:, :, : start + t], self.v[:, :, : start + t], mask


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Attention of q [B, heads, T, head_dim] over k, v [B, kv_heads, S, head_dim] under mask (None: every key);
    each key and value head serves heads ÷ kv_heads query heads (grouped-query attention)."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def attend_rows(q: torch.Tensor, caches: list[HeadCache]) -> torch.Tensor:
    """Attention of B rows' one query each, q [B, heads, 1, head_dim], over each row's own cache (its new key
    appended already), in one call: the rows' keys and values side by side, padded to the longest and masked.
    The query heads that share a key head ride as that head's positions, so no key or value is repeated."""
    b, heads, _, head_dim = q.shape
    kv_heads = caches[0].k.shape[1]
    grouped = q.view(b, kv_heads, heads // kv_heads, head_dim)
    if len(caches) == 1:
        cache = caches[0]
        keys, values, held = cache.k[:, :, : cache.length], cache.v[:, :, : cache.length], None
    else:
        lengths = [cache.length for cache in caches]
        longest = max(lengths)
        # Past its length a row's cache holds zeros or the keys a rollback left: finite either way, so the mask
        # alone keeps them out (a masked key's weight is zero, and zero times a finite value stays zero). A row
        # whose cache is shorter than the longest row is padded with zeros instead of grown.
        keys = torch.cat([leading_positions(cache.k, length, longest) for cache, length in zip(caches, lengths)])
        values = torch.cat([leading_positions(cache.v, length, longest) for cache, length in zip(caches, lengths)])
        held = (torch.arange(longest, device=q.device) < torch.tensor(lengths, device=q.device)[:, None])[:, None, None]
    return F.scaled_dot_product_attention(grouped, keys, values, attn_mask=held).view(b, heads, 1, head_dim)


def leading_positions(stored: torch.Tensor, length: int, longest: int) -> torch.Tensor:
    """A cache's keys or values [1, kv_heads, capacity, head_dim], its first `longest` positions (`length` valid)."""
    if stored.shape[2] >= longest:
        return stored[:, :, :longest]
    return F.pad(stored[:, :, :length], (0, 0, 0, longest - length))


def applied(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return layer(x)


def filled_subset(chosen: list[int], size: int, vocab_size: int) -> torch.Tensor:
    """`chosen` token ids, then the lowest ids not among them up to `size`, sorted by id: a BPE
    vocabulary numbers its merges roughly by frequency, so low ids are the next most likely."""
    taken = set(chosen)
    chosen = list(chosen) + [t for t in range(vocab_size) if t not in taken][: size - len(taken)]
    return torch.tensor(sorted(chosen), dtype=torch.long)


class FeatureHead(nn.Module):
    def __init__(self, config: HeadConfig):
        super().__init__()
        c = self.config = config
        d = c.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=False)  # [embedding of x_{j+1}; f_j] -> d
        if c.feature_layers:  # [layer states ...; final state] -> the d-wide feature f_j
            self.fuse = nn.Linear((len(c.feature_layers) + 1) * d, d, bias=False)
        self.input_norm = RMSNorm(d, c.rms_norm_eps)
        self.q_proj = nn.Linear(d, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(d, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(d, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, d, bias=False)
        self.post_norm = RMSNorm(d, c.rms_norm_eps)
        self.gate_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, d, bias=False)
        self.out_norm = RMSNorm(d, c.rms_norm_eps)
        self.register_buffer("subset", torch.arange(c.subset_size, dtype=torch.long))
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.embed: torch.Tensor | None = None  # [V, d], the target's input embedding
        # [d, S]: the target's LM-head rows of the subset, stored as columns because a one-row
        # product with a contiguous right operand runs about three times faster on the CPU.
        self.head_columns: torch.Tensor | None = None
        self.row_products = RowProducts()  # the layer's products in a step over rows (`step_rows`, `read_rows`)

    # -- the target's rows ------------------------------------------------------------
    def bind(self, target: nn.Module) -> "FeatureHead":
        """Read the embedding and the subset's LM-head rows from the loaded target."""
        embed = target.get_input_embeddings().weight
        head = target.get_output_embeddings().weight
        dtype = self.fc.weight.dtype
        self.embed = embed.detach()
        rows = head.detach().index_select(0, self.subset.to(head.device)).to(dtype)
        self.head_columns = rows.t().contiguous()
        return self

    @torch.no_grad()
    def init_from_target(self, target: nn.Module, layer_index: int = -1) -> None:
        """Start the decoder layer from one of the target's (its last by default): the head
        then begins with attention and MLP weights that already read the target's features."""
        layer = target.get_decoder().layers[layer_index]
        pairs = [
            (self.q_proj, layer.self_attn.q_proj), (self.k_proj, layer.self_attn.k_proj),
            (self.v_proj, layer.self_attn.v_proj), (self.o_proj, layer.self_attn.o_proj),
            (self.gate_proj, layer.mlp.gate_proj), (self.up_proj, layer.mlp.up_proj),
            (self.down_proj, layer.mlp.down_proj),
            (self.input_norm, layer.input_layernorm), (self.post_norm, layer.post_attention_layernorm),
            (self.out_norm, target.get_decoder().norm),
        ]
        for mine, theirs in pairs:
            mine.weight.copy_(theirs.weight.to(mine.weight.dtype))
        d = self.config.hidden_size
        # The feature half starts as the identity: at first f̂_{j+1} is f_j pushed through one layer.
        self.fc.weight.zero_()
        self.fc.weight[:, d:].copy_(torch.eye(d))
        self.fc.weight[:, :d].normal_(0.0, 0.02)

    # -- the model --------------------------------------------------------------------
    def _rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq  # [T, hd/2]
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    @property
    def feature_width(self) -> int:
        """The width of the target states the head reads: d, or (k + 1) · d when fused."""
        return (len(self.config.feature_layers) + 1) * self.config.hidden_size

    def fuse_features(self, features: torch.Tensor, product=applied) -> torch.Tensor:
        """[..., (k + 1) · d] target states -> [..., d]; d-wide input (the head's own prediction,
        or any input of an unfused head) passes unchanged."""
        d = self.config.hidden_size
        if features.shape[-1] == d:
            return features
        blocks = features.split(d, dim=-1)
        # Intermediate layers are raw residual streams whose scale grows with depth: normalise
        # them to the final state's scale before mixing, so no layer swamps the others.
        lower = [rms_normalised(b, self.config.rms_norm_eps) for b in blocks[:-1]]
        return product(self.fuse, torch.cat(lower + [blocks[-1]], dim=-1))

    def project(self, features: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                embedded: torch.Tensor | None = None, product=applied):
        """The layer's first half: (residual, q, k, v) for features [B, T, d or (k + 1) · d]; `embedded`
        [B, T, d], the embeddings of next_ids where they were looked up already. product(layer, x): how each
        linear layer is applied (`RowProducts` over several rows)."""
        c = self.config
        b, t, _ = features.shape
        embedded = self.embed[next_ids] if embedded is None else embedded
        x = product(self.fc, torch.cat((embedded.to(features.dtype), self.fuse_features(features, product)), dim=-1))
        h = self.input_norm(x)
        q = product(self.q_proj, h).view(b, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = product(self.k_proj, h).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = product(self.v_proj, h).view(b, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._rope(positions, q.dtype)
        return x, q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def finish(self, residual: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               mask: torch.Tensor) -> torch.Tensor:
        """The layer's second half: attention of q over (k, v) under `mask`, the MLP, the norm."""
        return self.after_attention(residual, attend(q, k, v, mask))

    def after_attention(self, residual: torch.Tensor, attended: torch.Tensor, product=applied) -> torch.Tensor:
        """The rest of the layer after its attention output attended [B, heads, T, head_dim]: the output
        projection, the MLP, the norm."""
        b, t = residual.shape[:2]
        x = residual + product(self.o_proj, attended.transpose(1, 2).reshape(b, t, -1))
        h = self.post_norm(x)
        x = x + product(self.down_proj, F.silu(product(self.gate_proj, h)) * product(self.up_proj, h))
        # The target's features are read after its final norm, so the prediction is too.
        return self.out_norm(x)

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None = None, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """features [B, T, d or (k + 1) · d] (f_j), next_ids [B, T] (x_{j+1}), positions [T] (j+1)
        -> f̂_{j+1} [B, T, d].

        With a cache (B = 1) the T positions are appended after `cache.length` and attend to
        everything cached; without one attention is causal over the T positions, with an
        optional key mask [B, T] for padding.
        """
        assert self.embed is not None, "call bind(target) first"
        t = features.shape[1]
        residual, q, k, v = self.project(features, next_ids, positions)
        if cache is not None:
            k, v, mask = cache.append(k, v)
        else:
            mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
            if attention_mask is not None:
                mask = mask[None, None] & attention_mask[:, None, None, :].bool()
        return self.finish(residual, q, k, v, mask)

    def step_rows(self, features: torch.Tensor, next_ids: torch.Tensor, positions: list[int],
                  caches: list[HeadCache]) -> torch.Tensor:
        """One draft step of B independent sequences in one forward: features [B, d] (f_j of each row),
        next_ids [B], positions (j + 1 of each row), each row's own cache -> f̂ [B, d]. The products run
        over all rows at once; each row attends over its own cache with the mask it has alone."""
        residual, q, k, v = self.project(features.to(self.fc.weight.dtype).unsqueeze(1), next_ids.view(-1, 1),
                                         torch.zeros(1, device=features.device), product=self.row_products)
        # project rotated every row at position 0 (the identity); each row turns to its own position here.
        cos, sin = self._rope(torch.as_tensor(positions, device=features.device).view(-1, 1, 1), q.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        for row, cache in enumerate(caches):
            cache.append(k[row : row + 1], v[row : row + 1])
        return self.after_attention(residual, attend_rows(q, caches), self.row_products)[:, 0]

    def read_rows(self, features: list[torch.Tensor], next_ids: list[torch.Tensor], first_positions: list[int],
                  caches: list[HeadCache]) -> torch.Tensor:
        """B rows' true features read in one forward: features[i] [n_i, d or (k + 1) · d] (f_j of row i from
        j = first_positions[i]), next_ids[i] [n_i], each row appended to its own cache -> f̂ at each row's
        last position [B, d]. Every position's key and value are computed, over the rows' positions packed one
        after another (no padding), and kept in its row's cache; only the last position of each row, whose
        prediction is the one drafting reads, attends and runs the rest of the layer."""
        lengths = [f.shape[0] for f in features]
        device, dtype = features[0].device, self.fc.weight.dtype
        packed = torch.cat([f.to(dtype) for f in features]).unsqueeze(0)
        residual, q, k, v = self.project(packed, torch.cat(next_ids).view(1, -1), torch.zeros(1, device=device),
                                         product=self.row_products)
        # project rotated every position at 0 (the identity); each turns to its own row's position here.
        positions = torch.cat([torch.arange(first + 1, first + 1 + n, device=device)
                               for first, n in zip(first_positions, lengths)])
        cos, sin = self._rope(positions, q.dtype)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        ends = list(itertools.accumulate(lengths))  # on the host: reading them back would cost a device sync
        for cache, n, end in zip(caches, lengths, ends):
            cache.append(k[:, :, end - n : end], v[:, :, end - n : end])
        last = torch.tensor(ends, device=device) - 1
        attended = attend_rows(q[0, :, last].transpose(0, 1).unsqueeze(2), caches)
        return self.after_attention(residual[0, last].unsqueeze(1), attended, self.row_products)[:, 0]

    def subset_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., S]: logits over the subset, through the target's LM head."""
        return predicted @ self.head_columns

    draft_logits = subset_logits  # what the drafter's q is a softmax of (`feature_drafter.draft_q`)

    @property
    def draft_ids(self) -> torch.Tensor:
        """[S]: the vocabulary ids of draft_logits' columns."""
        return self.subset

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @classmethod
    def widened(cls, head: "FeatureHead", feature_layers: tuple[int, ...]) -> "FeatureHead":
        """A fused-feature head that starts as `head`: the fusion first passes the final state
        through and ignores the intermediate layers, which training then learns to use."""
        config = HeadConfig(**{**asdict(head.config), "feature_layers": tuple(feature_layers)})
        wide = cls(config).to(head.fc.weight.dtype)
        missing, unexpected = wide.load_state_dict(head.state_dict(), strict=False)
        assert not unexpected and all(name.startswith("fuse.") for name in missing), (missing, unexpected)
        d = config.hidden_size
        with torch.no_grad():
            wide.fuse.weight.zero_()
            wide.fuse.weight[:, -d:].copy_(torch.eye(d))
        return wide

    def with_subset_size(self, size: int) -> "FeatureHead":
        """The same head drafting over `size` tokens: its subset plus the lowest ids it lacks
        (`filled_subset`). Only LM-head rows are selected, so no weight changes; this measures
        what the subset's limit costs. Bind it afterwards."""
        vocab = self.config.vocab_size
        if not self.config.subset_size <= size <= vocab:
            raise ValueError(f"a subset of {size} tokens: give between {self.config.subset_size} and {vocab}")
        wider = type(self)(HeadConfig(**{**asdict(self.config), "subset_size": size}))
        wider.load_state_dict({k: v for k, v in self.state_dict().items() if k != "subset"}, strict=False)
        wider.subset.copy_(filled_subset(self.subset.tolist(), size, vocab))
        return wider.to(device=self.fc.weight.device, dtype=self.fc.weight.dtype).eval()

    # -- files ------------------------------------------------------------------------
    def save(self, folder: Path, dtype: torch.dtype = torch.float16, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype if v.is_floating_point() else v.dtype).contiguous().cpu()
                 for k, v in self.state_dict().items()}
        save_file(state, str(folder / WEIGHTS_NAME))
        (folder / CONFIG_NAME).write_text(json.dumps({**asdict(self.config), **(extra or {})}, indent=1))

    @classmethod
    def load(cls, folder: Path, dtype: torch.dtype = torch.float32, device="cpu") -> "FeatureHead":
        from safetensors.torch import load_file

        folder = Path(folder)
        raw = json.loads((folder / CONFIG_NAME).read_text())
        fields = {k: raw[k] for k in HeadConfig.__dataclass_fields__ if k in raw}
        fields["feature_layers"] = tuple(fields.get("feature_layers", ()))
        head = cls(HeadConfig(**fields))
        state = load_file(str(folder / WEIGHTS_NAME))
        head.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()})
        return head.to(device=device, dtype=dtype).eval()

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def step_macs(self) -> int:
        """Multiply-accumulates of one drafted token, the subset LM head included."""
        c = self.config
        d = c.hidden_size
        layer = d * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim + c.num_heads * c.head_dim * d
        return 2 * d * d + layer + 3 * d * c.intermediate_size + c.subset_size * d


def is_feature_head(folder) -> bool:
    return Path(folder, CONFIG_NAME).is_file()

