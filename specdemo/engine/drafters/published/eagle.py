"""EAGLE-1/2 heads in the EAGLE authors' layout (EAGLE-2 drafts with the same heads, as a dynamic tree).

At position j the head reads the target's final (normed) state f_j and the embedding of x_{j+1}:
x = fc([embedding; f_j]) (2d -> d, with a bias when the config's `bias` says so), then one Llama
decoder layer whose first layer norm the authors leave out, so x goes into attention as it is. Its
output stands in for f_{j+1}: the target's own LM head turns it into q(x_{j+2}), and it is fed back
as the next input feature.

Weights: `fc.weight` (`fc.bias`), `layers.0.self_attn.{q,k,v,o}_proj.weight`,
`layers.0.mlp.{gate,up,down}_proj.weight`, `layers.0.post_attention_layernorm.weight`, and often
`embed_tokens.weight` (a copy of the target's, frozen in training). The config is a Llama config
with `num_hidden_layers` 1 and `bias`.

Optional keys, read where present, let a feature head trained here travel in this layout with the
same q: `layers.0.input_layernorm.weight` (the norm the authors' layer 0 omits, as a plain Llama
layer has it), `norm.weight` (a norm on the layer's output, which is then both the fed-back feature
and the LM head's input), and `d2t`/`t2d` (a draft vocabulary, as EAGLE-3 names it: q is zero
outside it).
"""

from __future__ import annotations

import torch
from torch import nn

from ..feature_head import FeatureHead, HeadCache, RMSNorm
from .base import DecoderLayer, LayerShape, PublishedHead

LAYER = "layers.0."


class EagleHead(PublishedHead):
    kind = "eagle"

    def __init__(self, shape: LayerShape, vocab_size: int, fc_bias: bool = True, input_norm: bool = False,
                 final_norm: bool = False, draft_vocab_size: int | None = None, own_embedding: bool = False):
        super().__init__()
        self.config = shape
        self.vocab_size = vocab_size
        d = shape.hidden_size
        self.fc = nn.Linear(2 * d, d, bias=fc_bias)
        self.layers = nn.ModuleList([DecoderLayer(shape, d, input_norm=input_norm)])
        if final_norm:
            self.norm = RMSNorm(d, shape.rms_norm_eps)
        if draft_vocab_size is not None:
            self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
            self.register_buffer("t2d", torch.zeros(vocab_size, dtype=torch.bool))
        if own_embedding:
            self.embed_tokens = nn.Embedding(vocab_size, d)
        self.embed: torch.Tensor | None = None  # [V, d]
        self.head_rows: torch.Tensor | None = None  # [V or S, d]: the target's LM-head rows q is made from

    @classmethod
    def from_checkpoint(cls, config: dict, state: dict[str, torch.Tensor]) -> "EagleHead":
        """The head a published config and state dict describe (its keys decide the optional parts)."""
        layers = config.get("num_hidden_layers", 1)
        if layers != 1:
            raise ValueError(f"EAGLE head: {layers} decoder layers in its config; the published heads have one, "
                             "and only one is read here")
        d2t = state.get("d2t")
        head = cls(LayerShape.from_config(config, names=state), config["vocab_size"], fc_bias="fc.bias" in state,
                   input_norm=f"{LAYER}input_layernorm.weight" in state, final_norm="norm.weight" in state,
                   draft_vocab_size=None if d2t is None else d2t.shape[0], own_embedding="embed_tokens.weight" in state)
        head.load_state_dict(state, strict=True)
        return head

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """The target ids of the draft vocabulary (None: the whole vocabulary)."""
        return None if not hasattr(self, "d2t") else torch.arange(self.d2t.shape[0], device=self.d2t.device) + self.d2t

    def bind(self, target: nn.Module) -> "EagleHead":
        own = getattr(self, "embed_tokens", None)
        self.embed = (own.weight if own is not None else target.get_input_embeddings().weight).detach()
        rows = target.get_output_embeddings().weight.detach()
        ids = self.draft_ids
        if ids is not None:
            rows = rows.index_select(0, ids.to(rows.device))
        self.head_rows = rows.to(self.fc.weight.dtype)
        return self

    def matmul_parameters(self) -> tuple[int, int]:
        own, _ = super().matmul_parameters()
        return own, 0 if self.head_rows is None else self.head_rows.numel()

    def forward(self, features: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
                cache: HeadCache | None = None) -> torch.Tensor:
        """features [1, T, d] (f_j), next_ids [1, T] (x_{j+1}), positions [T] -> the predicted f_{j+1} [1, T, d]."""
        normed, x = self._layer_inputs(features, next_ids)
        out = self.layers[0](normed, x, positions, cache)
        return self.norm(out) if hasattr(self, "norm") else out

    def step_rows(self, features: torch.Tensor, next_ids: torch.Tensor, positions: list[int],
                  caches: list[HeadCache]) -> torch.Tensor:
        """One draft step of B rows in one forward: features [B, d], next_ids [B], positions (j + 1 of each
        row), each row's cache -> [B, d] (`DecoderLayer.step_rows`)."""
        normed, x = self._layer_inputs(features.unsqueeze(1), next_ids.view(-1, 1))
        out = self.layers[0].step_rows(normed, x, positions, caches)[:, 0]
        return self.norm(out) if hasattr(self, "norm") else out

    def _layer_inputs(self, features: torch.Tensor, next_ids: torch.Tensor):
        layer = self.layers[0]
        x = self.fc(torch.cat((self.embed[next_ids].to(features.dtype), features), dim=-1))
        return (layer.input_layernorm(x) if hasattr(layer, "input_layernorm") else x), x

    def draft_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """[..., d] -> [..., V or S] through the target's LM head rows (a draft vocabulary's, where it has one)."""
        return predicted @ self.head_rows.t()

    def drafter(self):
        from ..feature_drafter import FeatureDrafter

        return FeatureDrafter(self)


def eagle_layout(head: FeatureHead, target_config) -> tuple[dict, dict[str, torch.Tensor]]:
    """A feature head trained here (engine/drafters/feature_head.py, unfused) as an EAGLE checkpoint: its config
    and state dict, with the optional keys that keep its q (its input and output norms, its subset)."""
    if head.config.feature_layers:
        raise ValueError(f"a fused-feature head (layers {list(head.config.feature_layers)}) has no EAGLE layout: "
                         "its input mixes several of the target's layers")
    c = head.config
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "bias": False, "num_hidden_layers": 1,
              "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
              "num_attention_heads": c.num_heads,
              "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
              "rope_theta": c.rope_theta, "vocab_size": c.vocab_size, "hidden_act": "silu",
              "max_position_embeddings": getattr(target_config, "max_position_embeddings", 2048)}
    names = {"fc": "fc", "q_proj": "self_attn.q_proj", "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj",
             "o_proj": "self_attn.o_proj", "gate_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj",
             "down_proj": "mlp.down_proj", "input_norm": "input_layernorm", "post_norm": "post_attention_layernorm"}
    state = {("fc.weight" if ours == "fc" else f"{LAYER}{theirs}.weight"): getattr(head, ours).weight.detach().clone()
             for ours, theirs in names.items()}
    state["norm.weight"] = head.out_norm.weight.detach().clone()
    subset = head.subset.detach().cpu()
    state["d2t"] = subset - torch.arange(subset.shape[0])
    state["t2d"] = torch.zeros(c.vocab_size, dtype=torch.bool).index_fill_(0, subset, True)
    return config, state
