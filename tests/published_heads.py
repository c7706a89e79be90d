"""Tiny checkpoints written in the published layouts of EAGLE-1/2, EAGLE-3 (the authors' and vLLM's
speculators') and Medusa: their key names, shapes, config fields and file names, at small sizes.

The weights start from the tiny target's own (its last layer, its LM head) plus noise, so the heads
draft tokens the target often keeps, and sometimes refuses."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

NOISE = 0.3


def _noisy(weight: torch.Tensor, scale: float = NOISE) -> torch.Tensor:
    return (weight + scale * weight.std() * torch.randn_like(weight)).detach().clone()


def _llama_fields(target, **extra) -> dict:
    c = target.config
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "num_hidden_layers": 1, "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": 1e-6,
            "rope_scaling": None, "rope_theta": 10000.0, "pad_token_id": None, "tie_word_embeddings": False,
            "torch_dtype": "float16", "vocab_size": c.vocab_size, **extra}


def _layer_weights(target, prefix: str, attention_width: int) -> dict[str, torch.Tensor]:
    """The target's last layer, noisy, under `prefix`; q, k and v widened to `attention_width` (EAGLE-3's 2d)."""
    layer = target.model.layers[-1]
    state = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        weight = getattr(layer.self_attn, name).weight
        if attention_width > weight.shape[1]:  # [embedding half (small); state half (the target's)]
            weight = torch.cat((0.1 * torch.randn_like(weight), weight), dim=1)
        state[f"{prefix}self_attn.{name}.weight"] = _noisy(weight)
    state[f"{prefix}self_attn.o_proj.weight"] = _noisy(layer.self_attn.o_proj.weight)
    for name in ("gate_proj", "up_proj", "down_proj"):
        state[f"{prefix}mlp.{name}.weight"] = _noisy(getattr(layer.mlp, name).weight)
    state[f"{prefix}post_attention_layernorm.weight"] = _noisy(layer.post_attention_layernorm.weight, 0.05)
    return state


def _target(target_dir: Path) -> LlamaForCausalLM:
    return LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float64)


def write_eagle(folder: Path, target_dir: Path, seed: int = 0) -> Path:
    """EAGLE-1/2 as the authors publish it: pytorch_model.bin with fc (and its bias), layers.0.* without an
    input norm, embed_tokens; a one-layer Llama config with `bias`."""
    target = _target(target_dir)
    torch.manual_seed(seed)
    d = target.config.hidden_size
    fc = torch.cat((0.02 * torch.randn(d, d, dtype=torch.float64), torch.eye(d, dtype=torch.float64)), dim=1)
    state = {"fc.weight": fc, "fc.bias": torch.zeros(d, dtype=torch.float64),
             "embed_tokens.weight": target.model.embed_tokens.weight.detach().clone(),
             **_layer_weights(target, "layers.0.", d)}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_llama_fields(target, bias=True)))
    torch.save(state, folder / "pytorch_model.bin")
    return folder


def draft_vocabulary(vocab: int, size: int) -> torch.Tensor:
    """The `size` ids a small draft vocabulary keeps: the even ids first, then the lowest odd ones."""
    ids = list(range(0, vocab, 2)) + list(range(1, vocab, 2))
    return torch.tensor(sorted(ids[:size]))


def _eagle3_state(target, draft_size: int, prefix: str) -> dict[str, torch.Tensor]:
    d, vocab = target.config.hidden_size, target.config.vocab_size
    ids = draft_vocabulary(vocab, draft_size)
    fc = 0.02 * torch.randn(d, 3 * d, dtype=torch.float64)
    fc[:, 2 * d :] += torch.eye(d, dtype=torch.float64)  # the high layer mostly
    return {"fc.weight": fc, f"{prefix}hidden_norm.weight": torch.ones(d, dtype=torch.float64),
            f"{prefix}input_layernorm.weight": torch.ones(d, dtype=torch.float64),
            **_layer_weights(target, prefix, 2 * d),
            "norm.weight": _noisy(target.model.norm.weight, 0.05),
            "lm_head.weight": _noisy(target.lm_head.weight[ids]),
            "d2t": ids - torch.arange(draft_size),
            "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True)}


def write_eagle3(folder: Path, target_dir: Path, draft_size: int, seed: int = 0) -> Path:
    """EAGLE-3 as the authors publish it: pytorch_model.bin with fc (3d -> d), midlayer.*, norm, lm_head over
    `draft_vocab_size` tokens, d2t and t2d; a Llama config with draft_vocab_size."""
    target = _target(target_dir)
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    config = _llama_fields(target, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_size)
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(_eagle3_state(target, draft_size, "midlayer."), folder / "pytorch_model.bin")
    return folder


def write_speculators_eagle3(folder: Path, target_dir: Path, draft_size: int, layer_ids: list[int],
                             seed: int = 0, norm_before_residual: bool | None = True) -> Path:
    """EAGLE-3 in vLLM's speculators layout: model.safetensors with layers.0.* for midlayer.*, a config that
    nests the layer's Llama fields in transformer_layer_config beside speculators_config
    (norm_before_residual None: the config leaves the field out)."""
    from safetensors.torch import save_file

    target = _target(target_dir)
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    layer = {k: v for k, v in _llama_fields(target).items() if k != "architectures"}
    config = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.1.0",
              "draft_vocab_size": draft_size, "norm_before_residual": True, "target_hidden_size": None,
              "eagle_aux_hidden_state_layer_ids": layer_ids, "transformer_layer_config": layer,
              "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                     "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                     "verifier": {"name_or_path": str(target_dir),
                                                  "architectures": ["LlamaForCausalLM"]}}}
    if norm_before_residual is None:
        del config["norm_before_residual"]
    else:
        config["norm_before_residual"] = norm_before_residual
    (folder / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in _eagle3_state(target, draft_size, "layers.0.").items()}
    save_file(state, str(folder / "model.safetensors"))
    return folder


def write_medusa(folder: Path, target_dir: Path, heads: int = 3, layers: int = 1, seed: int = 0) -> Path:
    """Medusa-1 as FasterDecoding publishes it: medusa_lm_head.pt holding the heads' state dict (keys
    `{k}.{i}.linear.weight/bias`, `{k}.{layers}.weight`) and a config with medusa_num_heads/_layers."""
    target = _target(target_dir)
    torch.manual_seed(seed)
    d = target.config.hidden_size
    state = {}
    for k in range(heads):
        for i in range(layers):
            state[f"{k}.{i}.linear.weight"] = 0.1 * torch.randn(d, d, dtype=torch.float64)
            state[f"{k}.{i}.linear.bias"] = torch.zeros(d, dtype=torch.float64)
        state[f"{k}.{layers}.weight"] = _noisy(target.lm_head.weight, 0.5)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"base_model_name_or_path": str(target_dir), "medusa_num_heads": heads, "medusa_num_layers": layers,
              "transformers_version": "4.33.2"}
    (folder / "config.json").write_text(json.dumps(config))
    torch.save(state, folder / "medusa_lm_head.pt")
    return folder
