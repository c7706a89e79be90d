"""What the published heads share: the drafter they make, and one Llama decoder layer named as they
name it (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, its norms), with a KV cache by position."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from ..feature_head import HeadCache, RMSNorm, applied, attend, attend_rows, rotate_half
from ...targets.few_rows import RowProducts

# The kinds a published checkpoint is recognised as, and how tables and the page name them.
PUBLISHED_KINDS = ("eagle", "eagle3", "medusa")
KIND_NAMES = {"eagle": "EAGLE head", "eagle3": "EAGLE-3 head", "medusa": "Medusa heads"}


class PublishedHead(nn.Module):
    """A published draft head bound to its target; `drafter()` runs it through the Drafter base."""

    kind = ""
    layout = ""  # the file layout it was read from, when one kind has several (speculators' EAGLE-3)

    def drafter(self):
        raise NotImplementedError

    def bind(self, target: nn.Module) -> "PublishedHead":
        """Take what the head borrows from the loaded target (its embedding, its LM head)."""
        return self

    @property
    def name(self) -> str:
        return KIND_NAMES[self.kind] + (f", {self.layout} layout" if self.layout else "")

    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def step_module(self) -> nn.Module:
        """The module one draft step calls (what a sweep's counters hook)."""
        return self

    def matmul_parameters(self) -> tuple[int, int]:
        """(own, borrowed) parameters that multiply activations in a step: its weights less an embedding
        (a lookup), and the target's LM-head rows it reads (none: a head with its own)."""
        embedding = getattr(self, "embed_tokens", None)
        return self.parameter_count() - (embedding.weight.numel() if embedding is not None else 0), 0


@dataclass
class LayerShape:
    """One decoder layer's sizes (a Llama config's fields), and the target states its head reads."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False  # q, k and v have biases (Qwen2's layers)
    output_bias: bool = False  # o_proj has one
    rope: dict = field(default_factory=dict)  # rope_theta, rope_scaling / rope_parameters, max_position_embeddings
    feature_layers: tuple[int, ...] = ()  # indices into the target's hidden_states read beside its final state

    @classmethod
    def from_config(cls, config: dict, feature_layers: tuple[int, ...] = (), names=()) -> "LayerShape":
        """From a Llama config's fields; `names`, the checkpoint's keys, say which projections carry biases
        (a Qwen2 head's q, k and v do without a config field saying so)."""
        heads = config["num_attention_heads"]
        rope = {k: config[k] for k in ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings")
                if config.get(k) is not None}
        return cls(hidden_size=config["hidden_size"], num_heads=heads,
                   num_kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   intermediate_size=config["intermediate_size"], rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                   attention_bias=bool(config.get("attention_bias")) or any(k.endswith("q_proj.bias") for k in names),
                   output_bias=any(k.endswith("o_proj.bias") for k in names), rope=rope,
                   feature_layers=tuple(feature_layers))


def rope_frequencies(shape: LayerShape) -> tuple[torch.Tensor, float]:
    """inv_freq and the attention scaling of the head's RoPE, through transformers' own initialisers
    (default, linear, llama3, yarn ...), so a published config's rope_scaling means what it means there."""
    config = LlamaConfig(hidden_size=shape.num_heads * shape.head_dim, num_attention_heads=shape.num_heads,
                         head_dim=shape.head_dim, **shape.rope)
    rotary = LlamaRotaryEmbedding(config)
    return rotary.inv_freq.float(), float(rotary.attention_scaling)


class DecoderLayer(nn.Module):
    """A Llama decoder layer whose attention reads `attention_width` features (2d for EAGLE-3's
    [embedding; state]); the caller gives the attention input and the residual it adds to."""

    def __init__(self, shape: LayerShape, attention_width: int, input_norm: bool = False, hidden_norm: bool = False):
        super().__init__()
        self.shape = shape
        d, heads, kv, hd = shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim
        bias = shape.attention_bias
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(attention_width, heads * hd, bias=bias)
        self.self_attn.k_proj = nn.Linear(attention_width, kv * hd, bias=bias)
        self.self_attn.v_proj = nn.Linear(attention_width, kv * hd, bias=bias)
        self.self_attn.o_proj = nn.Linear(heads * hd, d, bias=shape.output_bias)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(d, shape.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(d, shape.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(shape.intermediate_size, d, bias=False)
        if input_norm:
            self.input_layernorm = RMSNorm(d, shape.rms_norm_eps)
        if hidden_norm:
            self.hidden_norm = RMSNorm(d, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, shape.rms_norm_eps)
        inv_freq, self.rope_scaling = rope_frequencies(shape)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.row_products = RowProducts()  # the layer's products in a step over rows (`step_rows`)

    def _rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        return (angles.cos() * self.rope_scaling).to(dtype), (angles.sin() * self.rope_scaling).to(dtype)

    def forward(self, attention_input: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None) -> torch.Tensor:
        """attention_input [1, T, attention_width], residual [1, T, d] at `positions` [T] -> [1, T, d].
        With a cache the T positions follow what it holds; without one attention is causal over them."""
        q, k, v = self._projected(attention_input, positions)
        k, v, mask = _cached(k, v, cache, attention_input.shape[1], q.device)
        return self._after_attention(attend(q, k, v, mask), residual)

    def step_rows(self, attention_input: torch.Tensor, residual: torch.Tensor, positions: list[int],
                  caches: list[HeadCache]) -> torch.Tensor:
        """One draft step of B independent rows in one forward: attention_input [B, 1, attention_width] and
        residual [B, 1, d], each row at its own position over its own cache -> [B, 1, d]. The products run
        over every row at once; each row attends over its cache as it would alone."""
        q, k, v = self._projected(attention_input, torch.as_tensor(positions, device=attention_input.device).view(-1, 1, 1),
                                  self.row_products)
        for row, cache in enumerate(caches):
            cache.append(k[row : row + 1], v[row : row + 1])
        return self._after_attention(attend_rows(q, caches), residual, self.row_products)

    def _projected(self, attention_input: torch.Tensor, positions: torch.Tensor, product=applied):
        """q, k, v [B, heads, T, head_dim], q and k rotated to `positions` ([T], or [B, 1, 1]: one per row)."""
        s, attn = self.shape, self.self_attn
        b, t, _ = attention_input.shape
        q = product(attn.q_proj, attention_input).view(b, t, s.num_heads, s.head_dim).transpose(1, 2)
        k = product(attn.k_proj, attention_input).view(b, t, s.num_kv_heads, s.head_dim).transpose(1, 2)
        v = product(attn.v_proj, attention_input).view(b, t, s.num_kv_heads, s.head_dim).transpose(1, 2)
        cos, sin = self._rope(positions, q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def _after_attention(self, attended: torch.Tensor, residual: torch.Tensor, product=applied) -> torch.Tensor:
        b, _, t, _ = attended.shape
        x = residual + product(self.self_attn.o_proj, attended.transpose(1, 2).reshape(b, t, -1))
        h = self.post_attention_layernorm(x)
        mlp = self.mlp
        return x + product(mlp.down_proj, F.silu(product(mlp.gate_proj, h)) * product(mlp.up_proj, h))


def _cached(k: torch.Tensor, v: torch.Tensor, cache: HeadCache | None, t: int, device):
    """Keys and values with the cache's earlier positions in front, and the boolean mask over them."""
    if cache is None:
        return k, v, torch.ones(t, t, dtype=torch.bool, device=device).tril()
    return cache.append(k, v)
