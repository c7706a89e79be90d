"""EAGLE-3 heads, in the EAGLE authors' layout and in vLLM's speculators' layout (the same weights
under other names).

The head reads three of the target's layers, low, middle and high: the states entering layers 2,
L // 2 and L − 3 of an L-layer target (transformers' hidden_states at those indices), concatenated
in that order. At position j:
  g_j = fc([h_low; h_mid; h_high])                 (3 · d_target -> d; skipped for its own predictions)
  a   = [input_layernorm(embedding of x_{j+1}); hidden_norm(g_j)]     (2d: what attention reads)
  out = g_j (or hidden_norm(g_j) with `norm_before_residual`) + attention(a), then the MLP block
`out` is fed back as the next input state; q(x_{j+2}) = softmax(lm_head(norm(out))) over the draft
vocabulary of S tokens, draft id i being target id i + d2t[i]: q is zero outside it.

Names: `fc.weight`, `midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight`,
`midlayer.self_attn.{q,k,v,o}_proj.weight` (q, k, v read 2d), `midlayer.mlp.*`, `norm.weight`,
`lm_head.weight` [S, d], buffers `d2t` [S] and `t2d` [V], `embed_tokens.weight` where the head keeps
its own. The speculators' layout says `layers.0.` for `midlayer.`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..feature_head import HeadCache, RMSNorm
from .base import DecoderLayer, LayerShape, PublishedHead


def default_layers(target_layers: int) -> tuple[int, ...]:
    """The target layers the authors' EAGLE-3 reads: the inputs of layers 2, L // 2 and L − 3."""
    return tuple(sorted({2, target_layers // 2, target_layers - 3}))


# The layout whose configs may leave `norm_before_residual` out and mean true by it.
SPECULATORS_LAYOUT = "speculators"


def norm_before_residual_of(config: dict, layout: str = "") -> bool:
    """Whether the head adds the normed state to the residual, as its config means it. The authors' code
    adds the state as it comes, so their configs mean false where the field is absent; vLLM reads a
    speculators config without the field as true, so a speculators config means true there."""
    return bool(config.get("norm_before_residual", layout == SPECULATORS_LAYOUT))


class Eagle3Head(PublishedHead):
    kind = "eagle3"

    def __init__(self, shape: LayerShape, vocab_size: int, draft_vocab_size: int, target_hidden_size: int,
                 norm_before_residual: bool = False, own_embedding: bool = False, layout: str = ""):
        super().__init__()
        self.config = shape
        self.layout = layout
        self.vocab_size = vocab_size
        self.target_hidden_size = target_hidden_size
        self.norm_before_residual = norm_before_residual
        d = shape.hidden_size
        self.fc = nn.Linear(len(shape.feature_layers) * target_hidden_size, d, bias=False)
        self.midlayer = DecoderLayer(shape, 2 * d, input_norm=True, hidden_norm=True)
        self.norm = RMSNorm(d, shape.rms_norm_eps)
        self.lm_head = nn.Linear(d, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(vocab_size, dtype=torch.bool))
        if own_embedding:
            self.embed_tokens = nn.Embedding(vocab_size, d)
        self.embed: torch.Tensor | None = None

    @classmethod
    def from_checkpoint(cls, config: dict, state: dict[str, torch.Tensor], feature_layers: tuple[int, ...],
                        target_hidden_size: int, layout: str = "") -> "Eagle3Head":
        """The head a config (the Llama fields, `draft_vocab_size`, ...) and a state dict describe, reading
        `feature_layers` of a target whose states are `target_hidden_size` wide."""
        layers = config.get("num_hidden_layers", 1)
        if layers != 1:
            raise ValueError(f"EAGLE-3 head: {layers} decoder layers in its config; only one-layer heads are read here")
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        vocab = config["vocab_size"]
        shape = LayerShape.from_config(config, feature_layers, names=state)
        head = cls(shape, vocab, config.get("draft_vocab_size") or vocab, target_hidden_size,
                   norm_before_residual_of(config, layout), own_embedding="embed_tokens.weight" in state,
                   layout=layout)
        missing, unexpected = head.load_state_dict(state, strict=False)
        # A head drafting over the whole vocabulary may come without its (identity) map.
        missing = [k for k in missing if k not in ("d2t", "t2d")]
        if missing or unexpected:
            raise ValueError(f"EAGLE-3 head: weights missing {missing} / not of this layout {unexpected}")
        if "t2d" not in state:
            head.t2d.index_fill_(0, head.draft_ids, True)
        return head

    @property
    def draft_ids(self) -> torch.Tensor:
        return torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def bind(self, target: nn.Module) -> "Eagle3Head":
        own = getattr(self, "embed_tokens", None)
        self.embed = (own.weight if own is not None else target.get_input_embeddings().weight).detach()
        return self

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None = None) -> torch.Tensor:
        """features [1, T, (3 + 1) · d_target] (the three layers, then the final state the loop appends, which
        this head does not read) or [1, T, d] (its own prediction); next_ids [1, T]; positions [T] -> [1, T, d]."""
        return self.midlayer(*self._layer_inputs(features, next_ids), positions, cache)

    def step_rows(self, features: torch.Tensor, next_ids: torch.Tensor, positions: list[int],
                  caches: list[HeadCache]) -> torch.Tensor:
        """One draft step of B rows in one forward: features [B, d] (each row's own prediction), next_ids [B],
        positions (j + 1 of each row), each row's cache -> [B, d] (`DecoderLayer.step_rows`)."""
        inputs = self._layer_inputs(features.unsqueeze(1), next_ids.view(-1, 1))
        return self.midlayer.step_rows(*inputs, positions, caches)[:, 0]

    def _layer_inputs(self, features: torch.Tensor, next_ids: torch.Tensor):
        """The layer's attention input [embedding; normed state] and the residual it adds to."""
        fused_width = self.fc.in_features
        if features.shape[-1] in (fused_width, fused_width + self.target_hidden_size):
            features = self.fc(features[..., :fused_width])
        layer = self.midlayer
        normed = layer.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        embedded = layer.input_layernorm(self.embed[next_ids].to(features.dtype))
        return torch.cat((embedded, normed), dim=-1), residual

    def draft_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., S]: the draft vocabulary's logits (their target ids: draft_ids)."""
        return self.lm_head(self.norm(predicted))

    def drafter(self):
        from ..feature_drafter import FeatureDrafter

        return FeatureDrafter(self)
