"""Memory a generation uses: the bytes each model's weights take, and the record of the most
bytes each model's KV cache held (`target_kv_bytes_peak`, `draft_kv_bytes_peak`), which the
cached LMs keep up to date as they grow (`CachedLM.kv_peak_sink`), a feature head's own cache as it grows
(`HeadCache.peak_sink`), and a cache on another runtime from its own buffers (`OnnxCachedLM._note_kv`).

Weights are counted from torch's modules (a runtime target's torch copy holds the same weights); caches
are counted as allocated, not as filled: a cache that holds max_length positions from the start (torch's
static cache, the runtime's shared buffer) counts them all.
"""

from __future__ import annotations

import weakref

import torch

MEMORY_STATS = ("target_weight_bytes", "draft_weight_bytes", "target_kv_bytes_peak", "draft_kv_bytes_peak")
_WEIGHT_BYTES: "weakref.WeakKeyDictionary[torch.nn.Module, int]" = weakref.WeakKeyDictionary()


def model_weight_bytes(model: torch.nn.Module | None) -> int:
    """`weight_bytes`, counted once per model (weights do not change while a model decodes)."""
    if model is None:
        return 0
    if model not in _WEIGHT_BYTES:
        _WEIGHT_BYTES[model] = weight_bytes(model)
    return _WEIGHT_BYTES[model]


def weight_bytes(model: torch.nn.Module | None) -> int:
    """Bytes the model's weights take as held in memory: parameters and buffers, quantized
    layers' packed weights included, each tensor counted once (tied weights, shared storage)."""
    if model is None:
        return 0
    # Held until the sum is done: a packed weight's unpacked copy is fresh, and a freed one's
    # address could be reused by the next and wrongly read as shared.
    parts = [part for tensor in _weight_tensors(model) for part in _storage_parts(tensor)]
    seen: set[tuple[int, int]] = set()
    total = 0
    for part in parts:
        key = (part.untyped_storage().data_ptr(), part.storage_offset())
        if key not in seen:
            seen.add(key)
            total += part.numel() * part.element_size()
    return total


def _weight_tensors(model: torch.nn.Module):
    yield from model.parameters()
    yield from model.buffers()
    for module in model.modules():
        packed = getattr(module, "_packed_params", None)
        if packed is not None and hasattr(packed, "_weight_bias"):
            weight, bias = packed._weight_bias()
            yield weight
            if bias is not None:
                yield bias


def _storage_parts(tensor: torch.Tensor):
    """The plain tensors behind a tensor (a torchao subclass holds its data and scales apart)."""
    names = getattr(tensor, "tensor_data_names", None)
    if names:
        for name in names:
            yield from _storage_parts(getattr(tensor, name))
        return
    if tensor.is_quantized:  # torch.ao's qint8 tensor: one byte a value, plus its scales
        yield tensor.int_repr()
        if tensor.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            yield tensor.q_per_channel_scales()
        return
    yield tensor
