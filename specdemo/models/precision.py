"""A model's precision: float32, bfloat16 and float16 as torch dtypes, int8 and int4 through a
quantization library, and the bytes its weights take.

A quantized model is first loaded in a float dtype (float32 on a CPU, bfloat16 on a GPU: the
dtype its activations keep), then its linear layers are swapped for quantized ones. The
embedding stays in that float dtype (a lookup reads one row a token). Which library runs
each quantized precision was chosen by measurement (docs/precision-and-memory.md):

  int8                  the fastest int8 path measured on the device: `int8-dynamic` on a CPU,
                        `int8-weight-only` on a GPU
  int8-dynamic          torch.ao's dynamic quantization (x86/fbgemm kernels: int8 weights, each
                        position's activations quantized on the fly, on their own); CPU only
  int8-weight-only      torchao's `Int8WeightOnlyConfig` (int8 weights, float activations)
  int8-dynamic-activation  torchao's `Int8DynamicActivationInt8WeightConfig`
  int4                  torchao: `Int4WeightOnlyConfig` on a GPU (group 128); on a CPU
                        `IntxWeightOnlyConfig(int4, group 32)`, 4-bit values held one a byte

Greedy decoding stays lossless against the target as loaded: an int8 target's speculative
output equals the same int8 target's AR output. It is not the float32 target's output. Whether a
loaded target's verification computes its rows exactly as AR's one-row step is decided in one
place, `verification_exactness`; every surface shows its label.

May import torch (and torchao when a precision asks for it); nothing of specdemo outside
``engine`` and ``models``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import warnings
from dataclasses import dataclass

import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from ..engine.targets.few_rows import one_row_at_a_time, use_one_row_products
from ..engine.targets.memory import weight_bytes  # noqa: F401  (re-exported: a model's bytes at its precision)
from ..engine.targets.row_attention import ROW_LIMIT, attend_row_by_row
from .errors import ModelLoadError

FLOATS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
QUANTIZED = ("int8", "int8-dynamic", "int8-weight-only", "int8-dynamic-activation", "int4")
PRECISIONS = ("float32", "bfloat16", "float16", *QUANTIZED)
# The prefix of a draft made of the target's own weights at another precision (`self:int8`).
SELF_DRAFT = "self:"


@dataclass(frozen=True)
class Precision:
    """A resolved precision: its name, the float dtype the model is loaded (and computes) in, and
    for a quantized one the scheme that quantizes its linear layers after loading."""

    name: str
    float_dtype: torch.dtype
    scheme: str | None = None  # a QUANTIZED name other than the device-dependent "int8"

    @property
    def quantized(self) -> bool:
        return self.scheme is not None

    @property
    def library(self) -> str:
        """Which library and kernels run it, as the docs' tables say."""
        return LIBRARIES.get(self.scheme or "", f"torch {str(self.float_dtype).removeprefix('torch.')}")


LIBRARIES = {
    "int8-dynamic": "torch.ao dynamic int8 (x86/fbgemm)",
    "int8-weight-only": "torchao Int8WeightOnlyConfig",
    "int8-dynamic-activation": "torchao Int8DynamicActivationInt8WeightConfig",
    "int4": "torchao int4 weight-only",
}


def resolve_precision(value: str | torch.dtype | None, device: str | torch.device) -> Precision:
    """A precision name (None or "auto": bfloat16 on a GPU, float32 on a CPU) for `device`;
    ValueError naming the accepted values."""
    cuda = torch.device(device).type == "cuda"
    base = torch.bfloat16 if cuda else torch.float32
    if isinstance(value, torch.dtype):
        name = next((n for n, d in FLOATS.items() if d == value), str(value))
        return Precision(name, value)
    name = ALIASES.get(value, value) if isinstance(value, str) else value
    if name in (None, "", "auto"):
        return Precision("bfloat16" if cuda else "float32", base)
    if name in FLOATS:
        return Precision(name, FLOATS[name])
    if name not in QUANTIZED:
        raise ValueError(f"dtype must be one of {', '.join(PRECISIONS)} (or fp32, bf16, fp16), got {value!r}")
    scheme = ("int8-weight-only" if cuda else "int8-dynamic") if name == "int8" else name
    if scheme == "int8-dynamic" and cuda:
        raise ValueError("dtype int8-dynamic runs on the CPU only (torch.ao's x86 kernels); on a GPU use int8 "
                         "or int8-weight-only")
    return Precision(name, base, scheme)


def served_precisions(device: str | torch.device) -> tuple[str, ...]:
    """The precision names `resolve_precision` accepts on `device` whose library this install has
    (torchao's schemes only where it is installed), in PRECISIONS order: what a page offers."""
    cuda = torch.device(device).type == "cuda"
    has_torchao = importlib.util.find_spec("torchao") is not None

    def served(name: str) -> bool:
        if name not in QUANTIZED:
            return True
        scheme = ("int8-weight-only" if cuda else "int8-dynamic") if name == "int8" else name
        if scheme == "int8-dynamic":
            return not cuda
        return has_torchao

    return tuple(name for name in PRECISIONS if served(name))


def quantize(model: torch.nn.Module, precision: Precision) -> torch.nn.Module:
    """Swap the linear layers of a loaded float model for `precision`'s quantized ones (in place
    where the library allows; the model to use is returned). Float precisions pass through."""
    if not precision.quantized:
        return model
    try:
        if precision.scheme == "int8-dynamic":
            return _torch_ao_dynamic(model)
        _torchao(model, precision.scheme, next(model.parameters()).device)
    except ImportError as error:
        raise ModelLoadError(f"dtype {precision.name} needs a library this install lacks ({error}); "
                             "`pip install torchao` serves int8 and int4, or use int8-dynamic on a CPU") from error
    except (RuntimeError, NotImplementedError) as error:
        raise ModelLoadError(f"dtype {precision.name} is not served on this device by {precision.library}: "
                             f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}") from error
    return model


def _torch_ao_dynamic(model: torch.nn.Module) -> torch.nn.Module:
    from torch.ao.quantization import quantize_dynamic

    # torch.ao's eager quantization is deprecated in favour of torchao, whose int8 paths measured
    # 2 to 3 times slower on the CPU (docs/precision-and-memory.md); it stays the CPU's int8 until
    # a faster one is measured, and its warnings are not the caller's to act on.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        model = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    for module in model.modules():
        if type(module) is DynamicLinear:
            module.__class__ = RowwiseDynamicLinear
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        attend_row_by_row(model)
    return model


# A verification feeds γ + 1 ≤ 65 positions (a tree a few more); a prompt's prefill may feed more.
# The same limit as row-by-row attention's: a row goes one at a time through both or through neither.
ROWWISE_LIMIT = ROW_LIMIT


class RowwiseDynamicLinear(DynamicLinear):
    """torch.ao's dynamic int8 linear with each position's activations quantized on their own.

    The library quantizes a whole input with one scale, so a position's output would depend on
    the positions fed beside it: a verification of γ + 1 drafts would not compute what AR's
    one-token steps compute, and greedy speculative decoding would leave AR's text. Inputs of up
    to ROWWISE_LIMIT rows therefore go one row at a time (per-token scales). A longer input (a
    long prompt's prefill) goes in one call: every method prefills the same rows, so they still
    agree. Per-row scales alone are not enough: attention over several query rows rounds
    differently from attention over one, and the next layer's quantization turns that into a
    different token, so the model's attention also goes row by row (`engine.row_attention`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return one_row_at_a_time(x, super().forward, ROWWISE_LIMIT)


# What a verification promises against AR's one-row steps (`GenerationResult.exactness`).
BIT_EXACT = "bit-exact"  # every verified row computes as AR's step: greedy output equals AR's
# Float rows differ from AR's step in their last bits only: at float32 a greedy near-tie that this
# flips has not been seen on the suite's prompts, so the promise holds in practice.
EXACT_AT = "exact at {}"
# Rounding that can flip a near-tie: greedy output may leave AR's (measured at bfloat16 on 2 of 6 prompts).
NEAR_TIES_AT = "up to near-ties at {}"
# Half precisions whose verification can be made row-exact on a CPU (`make_verification_row_exact`),
# where SPECDEMO_ROW_EXACT_HALF=1 asks for it. Off by default: measured on the embedded pair it
# takes greedy SD, EGAG and SD-tree at a bfloat16 target from about AR's speed to 0.55–0.75 of it
# (each verified row costs a one-row product) and slows AR's short prefills, while a CPU's
# default float32 is exact already; and a CPU's bfloat16 stays the rehearsal of a GPU's, whose
# kernels break near-ties the same way (docs/precision-and-memory.md).
ROW_EXACT_HALVES_ON_CPU = ("bfloat16", "float16")
ROW_EXACT_HALF_SWITCH = "SPECDEMO_ROW_EXACT_HALF"


def row_exact_halves() -> bool:
    """Whether SPECDEMO_ROW_EXACT_HALF asks for row-exact bfloat16 and float16 targets on the CPU."""
    return os.environ.get(ROW_EXACT_HALF_SWITCH, "0").strip().lower() in ("1", "true", "yes", "on")


def verification_rows_are_exact(precision: Precision | str, device: str | torch.device,
                                attention: str | None = "sdpa", runtime: str = "torch") -> bool:
    """Whether a target at `precision` on `device`, with this attention implementation and runtime,
    has its verification rows computed one at a time exactly as AR's step computes them: torch.ao's
    dynamic int8 (a CPU's) and, where SPECDEMO_ROW_EXACT_HALF=1, a CPU's bfloat16 and float16, each
    with sdpa attention. The rule that both
    the loading (what it switches on) and every label (`verification_exactness`) read."""
    if runtime != "torch" or attention != "sdpa" or torch.device(device).type != "cpu":
        return False
    resolved = precision if isinstance(precision, Precision) else resolve_precision(precision, device)
    if resolved.scheme == "int8-dynamic":
        return True
    return not resolved.quantized and resolved.name in ROW_EXACT_HALVES_ON_CPU and row_exact_halves()


def verification_exactness(precision: Precision | str, device: str | torch.device,
                           attention: str | None = "sdpa", runtime: str = "torch") -> str:
    """What greedy speculative decoding promises against AR on this target: BIT_EXACT where its rows
    compute as AR's step, "exact at float32" (or float64) for a full-precision float target, else
    "up to near-ties at PRECISION" (CUDA half precision, torchao's int8 and int4 paths, any target
    whose attention is not sdpa, another runtime's reduced precision): there a mismatch with AR
    is the precision's rounding, not a fault of the method."""
    resolved = precision if isinstance(precision, Precision) else resolve_precision(precision, device)
    if verification_rows_are_exact(resolved, device, attention, runtime):
        return BIT_EXACT
    if not resolved.quantized and resolved.float_dtype in (torch.float32, torch.float64):
        return EXACT_AT.format(resolved.name)
    return NEAR_TIES_AT.format(resolved.name)


def is_exact(exactness: str | None) -> bool:
    """False for an "up to near-ties" label, where AR's text may differ at that precision."""
    return not (exactness or "").startswith(NEAR_TIES_AT.format(""))


def exactness_sentence(exactness: str | None) -> str:
    """What a label means for greedy output against AR, in one sentence every surface can print."""
    if not exactness:
        return ""
    if exactness == BIT_EXACT:
        return "greedy output equals AR's bit for bit (every verified row computes as AR's one-row step)"
    if is_exact(exactness):
        return (f"greedy output equals AR's ({exactness}: verified rows differ from AR's step in their last "
                "bits only)")
    return (f"not lossless at this precision: greedy output equals AR's {exactness} (a verification "
            "rounds its rows unlike AR's one-row step, so a near-tie can flip; a difference from AR is "
            "that rounding, not a fault of the method)")


def mismatch_reading(exactness: str | None) -> str:
    """How a greedy run that differs from AR reads at this exactness."""
    if is_exact(exactness):
        return "differs from AR"
    return f"differs from AR: not lossless at {exactness.removeprefix(NEAR_TIES_AT.format(''))}"


def attention_of(model: torch.nn.Module) -> str | None:
    """A model's attention implementation as the exactness rule reads it; an encoder-decoder's
    cross-attention is not row-by-row attention's, whatever its self-attention runs."""
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    return getattr(config, "_attn_implementation", None)


def make_verification_row_exact(model: torch.nn.Module, precision: Precision) -> bool:
    """Switch a float half-precision target on the CPU to one-row linears and row-by-row attention
    where the rule asks for it (SPECDEMO_ROW_EXACT_HALF=1; torch.ao's int8 does its own in
    `quantize`); True if it did."""
    device = next(model.parameters()).device
    if precision.quantized or not verification_rows_are_exact(precision, device, attention_of(model)):
        return False
    use_one_row_products(model)
    attend_row_by_row(model)
    return True


def _torchao(model: torch.nn.Module, scheme: str, device: torch.device) -> None:
    from torchao.quantization import (Int4WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig,
                                      Int8WeightOnlyConfig, IntxWeightOnlyConfig, quantize_)
    from torchao.quantization.granularity import PerGroup

    if scheme == "int8-weight-only":
        config = Int8WeightOnlyConfig()
    elif scheme == "int8-dynamic-activation":
        config = Int8DynamicActivationInt8WeightConfig()
    elif device.type == "cuda":
        config = Int4WeightOnlyConfig(group_size=128)
    else:
        config = IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32))
    quantize_(model, config)


def self_draft_precision(draft: str | None) -> str | None:
    """The precision named by a `self:PRECISION` draft spec, else None."""
    if isinstance(draft, str) and draft.startswith(SELF_DRAFT):
        return draft[len(SELF_DRAFT):].strip() or "int8"
    return None


def self_draft(target_float: torch.nn.Module, precision: Precision) -> torch.nn.Module:
    """The target's own weights (as loaded, before any quantization of the target) at `precision`."""
    draft = copy.deepcopy(target_float)
    if draft.dtype != precision.float_dtype:
        draft = draft.to(precision.float_dtype)
    return quantize(draft, precision).eval()


# The three configurations of the research plan, as presets of precision and KV policy (decoding
# parameters beside the models' precisions). `--config NAME` on the command line; any setting
# given explicitly wins over the preset's.
CONFIGURATIONS: dict[str, dict[str, object]] = {
    # Short text at the most tokens/s: full caches, each model at its device's default precision.
    "short-text": {"max_new_tokens": 128},
    # Long text at bounded memory: the draft's cache streams (lossless), the target keeps its own.
    "long-text": {"max_new_tokens": 1024, "draft_kv": "streaming", "kv_budget": 256, "kv_sinks": 4},
    # Extreme memory: an int8 target and draft, both caches streaming in a small window (lossy).
    "low-memory": {"target_dtype": "int8", "draft_dtype": "int8", "max_new_tokens": 1024, "draft_kv": "streaming",
                   "target_kv": "streaming", "kv_budget": 128, "kv_sinks": 4},
}
