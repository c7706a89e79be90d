"""A Llama-family forward without transformers' wrappers, for the CPU's small models.

transformers' `LlamaForCausalLM.forward` goes through five decorators, an output-capturing
context, mask preprocessing and two output dataclasses before and after the work itself. For a
model as small as a draft or a test pair, that bookkeeping costs as much as the arithmetic: a
one-layer model with 32-wide states spends about a third of each forward there.

`lean_logits` runs the same modules, in the same order, on the same tensors: the embedding, the
rotary table, each layer's norms, projections, transformers' own `apply_rotary_pos_emb`, the
cache's `update`, whatever is registered as transformers' sdpa attention (so a replacement, such
as the KV policy's mass-keeping sdpa or an int8 target's row-by-row attention, still runs), and the
LM head. A module with a hook of its own is called as a module, so the hook fires; any other has
its forward called directly, as `Module.__call__` would after finding no hook, since at this size
the call's bookkeeping costs about as much as a 32-wide product (a χ² test's sampled SD run takes about
8 % less). The logits and the cache's
keys and values are bitwise those of `model(...)` (tests/test_lean.py holds them to it).

It serves the plain cases only, and `lean_forward_fits` says when that is: a Llama causal LM with
sdpa attention (the causal mask below is sdpa's) and a dynamic or static cache, in eval mode, with no hook on
the model, its decoder, a layer or an attention module (a hook there expects transformers' own
calls). The engine feeds it a chain's new tokens (on a dynamic cache no mask and the cache's next
positions; on a static one the positions and mask from its host-side length, as transformers builds
them) and a tree's (a prepared mask and the tree's positions). A compiled step, a batch's padding, a
compressed cache's evicted positions and everything else go through `model(...)` as before.
`SPECDEMO_LEAN_FORWARD=0` sends every forward there (to measure what this changes).
"""

from __future__ import annotations

import os
from itertools import islice

import torch
from transformers import DynamicCache, StaticCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaMLP, apply_rotary_pos_emb
from torch.nn.modules import module as torch_module

# Causal LMs whose forward is exactly the one below (SmolLM2, the embedded target, is a Llama).
LEAN_FAMILIES: tuple[type, ...] = (LlamaForCausalLM,)
# A static cache's rows are placed by the caller's positions and mask (its `update` writes at its own length).
LEAN_CACHES: tuple[type, ...] = (DynamicCache, StaticCache)
SWITCH = "SPECDEMO_LEAN_FORWARD"


def _hooked(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or module._backward_pre_hooks)


def _run(module: torch.nn.Module, *args):
    """`module(*args)`: its forward called directly where it has no hook of its own, as `Module.__call__`
    does then (global hooks keep `lean_forward_fits` from being true). For a model this small the call's
    own bookkeeping costs more than a 32-wide product."""
    return module(*args) if _hooked(module) else module.forward(*args)


def _mlp(mlp: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """A layer's MLP: LlamaMLP's forward spelled out so that each of its leaves goes through `_run`."""
    if type(mlp) is not LlamaMLP or _hooked(mlp):
        return _run(mlp, hidden)
    return _run(mlp.down_proj, _run(mlp.act_fn, _run(mlp.gate_proj, hidden)) * _run(mlp.up_proj, hidden))


def lean_forward_fits(model: torch.nn.Module, cache) -> bool:
    """Whether `lean_logits` may stand in for `model(...)` on this model and cache now."""
    if os.environ.get(SWITCH) == "0" or type(model) not in LEAN_FAMILIES or type(cache) not in LEAN_CACHES:
        return False
    if model.training:
        return False
    if model.config._attn_implementation != "sdpa" or getattr(model.config, "pretraining_tp", 1) > 1:
        return False
    if torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
        return False
    decoder = model.model
    if _hooked(model) or _hooked(decoder):
        return False
    return not any(_hooked(layer) or _hooked(layer.self_attn) for layer in decoder.layers)


def causal_mask(first: int, n: int, keys: int, device: torch.device) -> torch.Tensor:
    """Boolean [1, 1, n, keys]: rows at positions first .. first + n − 1, each seeing the keys up to its own."""
    queries = torch.arange(first, first + n, device=device)
    return (torch.arange(keys, device=device)[None, :] <= queries[:, None])[None, None]


def _sdpa_causal_mask(past: int, n: int, device: torch.device) -> torch.Tensor | None:
    """transformers' mask for n new positions after `past` cached ones, with no padding: none where
    sdpa's own causal flag (or a single query) does the same, else a boolean [1, 1, n, past + n]."""
    return None if n == 1 or past == 0 else causal_mask(past, n, past + n, device)


def lean_logits(model: torch.nn.Module, input_ids: torch.Tensor, cache: DynamicCache | StaticCache,
                logits_to_keep: int, hidden_layers: tuple[int, ...] | None = None,
                position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Logits [1, logits_to_keep, V] for input_ids [1, n] appended to `cache`, as `model(...)` gives them.

    A static cache's feed and a tree's verification pass their own position_ids [1, n] and a prepared
    4D attention_mask (as transformers takes one: used as it is); both go together, since positions
    that are not a dynamic cache's next ones need a mask that says so.

    With `hidden_layers` (indices as in transformers' `hidden_states`: 0 the embedding, i < L the
    output of layer i, L the normed final state), also the states a feature drafter reads: those k
    layers' states and then the final normed state, concatenated [1, n, (k + 1) · d], as
    `lm.forward_with_features` gives them; with logits_to_keep 0 the LM head is skipped.
    """
    decoder = model.model
    n = input_ids.shape[1]
    hidden = _run(decoder.embed_tokens, input_ids)
    if position_ids is None:
        past = cache.get_seq_length()
        positions = torch.arange(past, past + n, device=hidden.device).unsqueeze(0)
        mask = _sdpa_causal_mask(past, n, hidden.device)
    else:
        positions, mask = position_ids, attention_mask
    cos, sin = _run(decoder.rotary_emb, hidden, positions)
    attention = ALL_ATTENTION_FUNCTIONS["sdpa"]
    extra = {"position_ids": positions, "use_cache": True}
    depth = model.config.num_hidden_layers
    kept = [hidden] if hidden_layers and 0 in hidden_layers else []
    # islice, not a slice: slicing a ModuleList builds a new module every forward.
    for index, layer in enumerate(islice(decoder.layers, depth), start=1):
        attn = layer.self_attn
        shape = (1, n, -1, attn.head_dim)
        normed = _run(layer.input_layernorm, hidden)
        query = _run(attn.q_proj, normed).view(shape).transpose(1, 2)
        key = _run(attn.k_proj, normed).view(shape).transpose(1, 2)
        value = _run(attn.v_proj, normed).view(shape).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        key, value = cache.update(key, value, attn.layer_idx, kwargs=extra)
        out, _ = attention(attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling, **extra)
        hidden = hidden + _run(attn.o_proj, out.reshape(1, n, -1).contiguous())
        hidden = hidden + _mlp(layer.mlp, _run(layer.post_attention_layernorm, hidden))
        if hidden_layers and index in hidden_layers and index < depth:
            kept.append(hidden)
    final = _run(decoder.norm, hidden)
    if hidden_layers and depth in hidden_layers:
        kept.append(final)  # transformers' last hidden state is the normed one
    logits = _run(model.lm_head, final[:, -logits_to_keep:]) if logits_to_keep else None
    if hidden_layers is None:
        return logits, None
    return logits, torch.cat(kept + [final], dim=-1) if kept else final
