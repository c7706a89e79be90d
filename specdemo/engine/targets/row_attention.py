"""Attention that computes each query row of a forward as the one-row step computes it.

A verification forward feeds several positions at once. Attention over several query rows runs
other kernels and other summation orders than attention over one (the one-row step of AR), so a
row's output differs from AR's in its last bits. In a float model that is rounding noise; in a
model whose activations are quantized on the fly (int8 dynamic quantization) such a difference can
move an activation across a rounding step of the next quantized linear, and a greedy choice flips:
speculative decoding would leave AR's text.

`attend_row_by_row(model)` marks a model's attention modules so that a forward of 2..ROW_LIMIT
query rows runs transformers' sdpa attention once per row, with exactly the inputs the one-row
step gives it: the query row, and the keys and values that row may see, gathered in cache order
into a contiguous tensor (with the mask a one-row step on that cache gets: none on a dynamic
cache; on a static cache the row's keys first, then masked padding to the cache's length). Rows
with ancestors in a tree of drafts see the context and their ancestors, which is what AR's step
sees after accepting that path. Together with linear layers that also take one row at a time
(`models.precision.RowwiseDynamicLinear`) and row-wise norms, rotary embeddings and activations,
every row of a verification equals AR's step bit for bit. A forward of one row, or of more than
ROW_LIMIT rows (a long prefill, which every method shares), runs unchanged.

The row-wise function wraps whatever is registered as transformers' "sdpa" attention when it is
installed and acts only on marked modules; every other model runs as before.
"""

from __future__ import annotations

import threading

import torch

# As many rows as `models.precision.ROWWISE_LIMIT`: verifications (γ + 1, a tree's nodes) and short prefills.
ROW_LIMIT = 128
MARK = "attends_row_by_row"

_lock = threading.Lock()
_inner = None  # the "sdpa" attention registered before ours; each row goes through it


def attend_row_by_row(model: torch.nn.Module) -> int:
    """Mark every self-attention module of `model` (sdpa attention) to compute its query rows one at a
    time; returns how many were marked. ValueError for a model whose attention is not sdpa."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation != "sdpa":
        raise ValueError(f"row-by-row attention wraps sdpa attention; this model uses {implementation!r}: "
                         "load it with attn_implementation='sdpa'")
    _install()
    marked = 0
    for module in model.modules():
        if type(module).__name__.endswith("Attention") and isinstance(getattr(module, "layer_idx", None), int):
            setattr(module, MARK, True)
            marked += 1
    return marked


def _install() -> None:
    global _inner
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    with _lock:
        if _inner is None:
            _inner = ALL_ATTENTION_FUNCTIONS["sdpa"]
            AttentionInterface.register("sdpa", _row_by_row_sdpa)


def _row_by_row_sdpa(module, query, key, value, attention_mask, *args, **kwargs):
    """query [1, H, n, D], key and value [1, KV, S, D]; attention_mask None (causal: the n rows are the
    last n positions) or [1, 1, n, S] (boolean or additive). Returns [1, n, H, D] and None, as sdpa does."""
    rows = query.shape[2]
    if not getattr(module, MARK, False) or not 2 <= rows <= ROW_LIMIT or query.shape[0] != 1:
        return _inner(module, query, key, value, attention_mask, *args, **kwargs)
    length = key.shape[2]
    if attention_mask is None:  # causal: row i sees the keys before the last rows − 1 − i, a view of the cache
        outputs = [_inner(module, query[:, :, i : i + 1], key[:, :, : length - rows + i + 1],
                          value[:, :, : length - rows + i + 1], None, *args, **kwargs)[0] for i in range(rows)]
        return torch.cat(outputs, dim=1), None
    # A mask (a tree's rows, a static cache): row i sees the keys its mask row allows, gathered in order.
    allowed = attention_mask[0, 0] if attention_mask.dtype == torch.bool else attention_mask[0, 0] == 0
    allowed = allowed[-rows:, :length]
    seen = [row.nonzero().view(-1) for row in allowed]
    # Keys no row may see at the end: a static cache's unwritten buffer, which its one-row step
    # also sees, masked. On a dynamic cache (a tree's rows) the last key is the last row itself.
    buffer = not bool(allowed[:, -1].any())
    outputs = []
    for i, positions in enumerate(seen):
        row_key, row_value = key.index_select(2, positions), value.index_select(2, positions)
        row_mask = None
        if buffer:
            pad = length - positions.shape[0]
            row_key = torch.nn.functional.pad(row_key, (0, 0, 0, pad))
            row_value = torch.nn.functional.pad(row_value, (0, 0, 0, pad))
            row_mask = (torch.arange(length, device=key.device) < positions.shape[0]).view(1, 1, 1, length)
            if attention_mask.dtype != torch.bool:
                row_mask = torch.where(row_mask, 0.0, torch.finfo(attention_mask.dtype).min).to(attention_mask.dtype)
        output, _ = _inner(module, query[:, :, i : i + 1], row_key, row_value, row_mask, *args, **kwargs)
        outputs.append(output)
    return torch.cat(outputs, dim=1), None
