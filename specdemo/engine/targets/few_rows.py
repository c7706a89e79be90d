"""Linear layers that multiply a few rows well on the CPU.

A verification forward pushes γ + 1 positions (a few rows) through every weight of the target.
On x86 CPUs torch's `linear` hands such a product to a general matrix kernel that, for two to
six rows, costs nearly twice the one-row product (measured with the embedded target's shapes
on an AVX2 machine: 5 rows 67 ms against 34 ms for one, over its 30 layers). The same product
written the other way round, W·xᵀ, streams each weight row once and costs 55 ms (and four
rows 44 ms); for the 49,152-row LM head it halves the time (24 → 14 ms).

`use_few_row_products(model)` switches a model's linear layers to that order for 2..FEW_ROWS
rows and leaves every other product as it was: one row (AR's step, where `linear` is already
a matrix-vector product), long inputs (the prefill) and anything on a GPU. Layers with fewer
than FEW_ROW_MIN_WEIGHTS weights are not switched: their product is too small for the kernel's
choice to matter, and the reordered product's extra steps (pad, transpose, copy) cost more than
it saves (on a 2-core AMD EPYC, 3 rows through 32×64 to 256×512 weights took 2–4×
`linear`'s time). The layers keep
their parameters, so tied weights, state dicts and hooks are untouched. The result equals
`linear`'s up to float rounding, like any change of summation order; greedy decoding compares
argmaxes that already come from one-row and several-row kernels.

It is applied when a pair is loaded on the CPU, to the model object every method shares,
transformers' peers included, so a benchmark compares decoders on the same kernels.
`SPECDEMO_FEW_ROW_PRODUCTS=0` turns it off (to measure what it changes).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

# Above this many rows the general kernel is as fast or faster (measured: even at 6, ahead at 8+).
FEW_ROWS = 6
# Measured on the same machine, three rows cost more than four (56 against 44 ms over the
# target's layers); five cost less than six. So only three is padded.
PADDED_ROWS = {3: 4}
# The smallest weight switched: 256 KiB in float32, within one core's L2 cache. Every linear layer of
# the embedded pair (the smallest: 576×192) is above it.
FEW_ROW_MIN_WEIGHTS = 2**16
SWITCH = "SPECDEMO_FEW_ROW_PRODUCTS"


class FewRowLinear(nn.Linear):
    """`nn.Linear` computing 2..FEW_ROWS rows on the CPU as (W·xᵀ)ᵀ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if not 2 <= rows <= FEW_ROWS or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, -1)
        padded = PADDED_ROWS.get(rows, rows)
        if padded > rows:
            flat = F.pad(flat, (0, 0, 0, padded - rows))
        # The rows' transposed view, not a transposed copy: the kernel is fast for that layout only.
        product = torch.mm(self.weight, flat.t())[:, :rows].t()
        if self.bias is not None:
            product = product + self.bias
        # Contiguous: callers `view` the output into heads.
        return product.contiguous().view(*x.shape[:-1], self.out_features)


class RowProducts:
    """`layer(x)` over a few rows from the layer's weight kept transposed and contiguous ([in, out]), x·Wᵀ: for a
    model small enough that a copy of its weights costs little (a draft head's step over a batch's rows,
    `FeatureHead.step_rows`). Here it beats `FewRowLinear`'s (W·xᵀ)ᵀ, which keeps no copy: one step of the
    embedded head at 1 / 2 / 4 rows, 2 threads, took 1.21 / 1.41 / 1.71 ms against 1.31 / 2.23 / 2.55.
    A weight written in place (an online head learns) or replaced is transposed again on its next use.
    For inference only: the kept copy carries no gradient."""

    def __init__(self):
        self._kept: dict[int, tuple[tuple[int, int], torch.Tensor]] = {}

    def __deepcopy__(self, memo) -> "RowProducts":
        # A copied model (the online head is a deep copy) has layers of its own: what was kept for these serves
        # none of them, and would only hold their memory.
        return RowProducts()

    def __call__(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        weight = layer.weight
        written = (weight.data_ptr(), weight._version)
        kept = self._kept.get(id(layer))
        if kept is None or kept[0] != written:
            kept = self._kept[id(layer)] = (written, weight.detach().t().contiguous())
        product = x @ kept[1]
        return product if layer.bias is None else product + layer.bias


def enabled() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def use_few_row_products(model: nn.Module) -> int:
    """Switch every plain `nn.Linear` of `model` with at least FEW_ROW_MIN_WEIGHTS weights to
    `FewRowLinear` (in place, when enabled); returns how many were switched."""
    if not enabled():
        return 0
    switched = 0
    for module in model.modules():
        if type(module) is nn.Linear and module.weight.numel() >= FEW_ROW_MIN_WEIGHTS:
            module.__class__ = FewRowLinear
            switched += 1
    return switched


class OneRowLinear(nn.Linear):
    """`nn.Linear` computing each of 2..row_attention.ROW_LIMIT rows alone, as a one-row step does.

    A product of several rows runs another kernel and summation order than a product of one, so
    in half precision a verified row rounds differently from AR's step and a greedy near-tie can
    flip. Fed one at a time, each row of a verification is AR's step bit for bit (with
    `row_attention` doing the same for attention). One row and long inputs (a long prefill, which
    every method shares) run unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from . import row_attention  # its limit is read per call, so a measurement can move it

        return one_row_at_a_time(x, lambda rows: F.linear(rows, self.weight, self.bias), row_attention.ROW_LIMIT)


def one_row_at_a_time(x: torch.Tensor, product, limit: int) -> torch.Tensor:
    """`product(x)`, computed one row at a time where x has 2..limit rows (each row's output is then
    what a one-row call gives), in one call otherwise."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not 2 <= rows <= limit:
        return product(x)
    flat = x.reshape(rows, x.shape[-1])
    out = torch.cat([product(flat[i : i + 1]) for i in range(rows)])
    return out.view(*x.shape[:-1], out.shape[-1])


def use_one_row_products(model: nn.Module) -> int:
    """Switch every plain (or few-row) linear layer of `model` to `OneRowLinear`, in place;
    returns how many were switched."""
    switched = 0
    for module in model.modules():
        if type(module) in (nn.Linear, FewRowLinear):
            module.__class__ = OneRowLinear
            switched += 1
    return switched
