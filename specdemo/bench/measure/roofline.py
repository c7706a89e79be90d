"""The memory-bandwidth bound on decoding: how fast one token can possibly be made.

At batch 1, a decode step reads every weight once and the KV cache of every position
before it; the arithmetic is small beside that. So

    bytes per token = parameter bytes + KV bytes per position × context length
    bound (tokens/s) = bandwidth / bytes per token

and a measured tokens/s is reported as a fraction of that bound. The bandwidths in
`BANDWIDTHS` are the vendors' nominal peak figures (bytes/s); sustained copies reach
roughly 80–90 % of them, so a fraction near 1 is not to be expected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from ...engine.methods import REFERENCE

# Nominal peak memory bandwidth, bytes per second (datasheet figures).
BANDWIDTHS: dict[str, float] = {
    "H100 SXM": 3.35e12,
    "H100 PCIe": 2.0e12,
    "H200": 4.8e12,
    "A100 80GB": 2.0e12,
    "A100 40GB": 1.555e12,
    "L4": 3.0e11,
    "RTX 4090": 1.008e12,
    "A10G": 6.0e11,
    "T4": 3.2e11,
}


def bandwidth_for(device_name: str) -> float | None:
    """The nominal bandwidth of a device named like torch.cuda.get_device_name() ('NVIDIA H100 80GB HBM3')."""
    name = device_name.upper().replace("-", " ")
    if "H100" in name:
        return BANDWIDTHS["H100 PCIe" if "PCIE" in name else "H100 SXM"]
    if "A100" in name:
        return BANDWIDTHS["A100 40GB" if "40GB" in name.replace(" ", "") else "A100 80GB"]
    for key in ("H200", "L4", "RTX 4090", "A10G", "T4"):
        if key.upper() in name.split() or (" " in key and key.upper() in name):
            return BANDWIDTHS[key]
    return None


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes of every parameter (tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(config, dtype_bytes: int) -> int:
    """layers × 2 (keys and values) × kv_heads × head_dim × bytes per element."""
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    # A feature head's config (one layer, `num_kv_heads`) is read as well as a transformers one.
    heads = (getattr(config, "num_key_value_heads", None) or getattr(config, "num_kv_heads", None)
             or config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return getattr(config, "num_hidden_layers", 1) * 2 * heads * head_dim * dtype_bytes


@dataclass(frozen=True)
class Roofline:
    weight_bytes: int
    kv_bytes_per_token: int
    context_length: int
    bandwidth: float  # bytes/s

    @property
    def bytes_per_token(self) -> int:
        return self.weight_bytes + self.kv_bytes_per_token * self.context_length

    @property
    def tokens_per_s(self) -> float:
        """The most tokens per second the memory system allows at batch 1."""
        return self.bandwidth / self.bytes_per_token

    def fraction(self, measured_tokens_per_s: float) -> float:
        """Measured tokens/s as a fraction of the bound."""
        return measured_tokens_per_s / self.tokens_per_s


def roofline(weight_bytes: int, kv_bytes_per_token: int, context_length: int, bandwidth: float | str) -> Roofline:
    """bandwidth: bytes/s, or a device name from `BANDWIDTHS` (or as torch names it)."""
    if isinstance(bandwidth, str):
        value = BANDWIDTHS.get(bandwidth) or bandwidth_for(bandwidth)
        if value is None:
            raise ValueError(f"bandwidth: no nominal figure for {bandwidth!r}; pass bytes/s, e.g. 3.35e12, "
                             f"or one of {', '.join(BANDWIDTHS)}")
        bandwidth = value
    if bandwidth <= 0:
        raise ValueError("bandwidth must be positive (bytes per second)")
    if weight_bytes < 0 or kv_bytes_per_token < 0 or context_length < 0:
        raise ValueError("weight bytes, KV bytes per token and context length must not be negative")
    return Roofline(int(weight_bytes), int(kv_bytes_per_token), int(context_length), float(bandwidth))


# ---------------------------------------------------------------------------------------
# The bound beside a benchmark run (`python -m specdemo bench --roofline`).

ROOFLINE_COLUMNS = ["context_length", "bytes_per_token", "roofline_tokens_per_s", "roofline_fraction"]


def parse_bandwidth(value: float | str) -> float:
    """bytes/s from a number ("3.35e12") or a device name ("H100 SXM", "NVIDIA H100 80GB HBM3")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        text = str(value).strip()
        try:
            number = float(text)
        except ValueError:
            found = BANDWIDTHS.get(text) or bandwidth_for(text)
            if found is None:
                raise ValueError(f"bandwidth: no nominal figure for {text!r}; pass bytes/s, e.g. 3.35e12, "
                                 f"or one of {', '.join(BANDWIDTHS)}") from None
            return found
    if not number > 0 or number == float("inf"):
        raise ValueError(f"bandwidth must be positive (bytes per second), got {value!r}")
    return number


def device_bandwidth(device: torch.device | str, override: float | str | None = None) -> tuple[float | None, str]:
    """(bytes/s or None when unknown, the device's name): `override` if given, else the table's
    figure for the CUDA device's name; no figure is known for CPUs."""
    device = torch.device(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    if override is not None:
        return parse_bandwidth(override), name
    return (bandwidth_for(name) if device.type == "cuda" else None), name


def mean_context_length(prompt_tokens, new_tokens) -> float:
    """Positions a decode step reads on average, over every generated token of the runs:
    token i of a run (0-based) is made from prompt + i positions."""
    total = sum(int(n) for n in new_tokens)
    if total == 0:
        return float("nan")
    return sum(int(n) * (int(p) + (int(n) - 1) / 2) for p, n in zip(prompt_tokens, new_tokens)) / total


def add_roofline(result, pair, bandwidth: float | str | None = None) -> list[str]:
    """Add the target's memory-bandwidth bound to a `BenchResult`: ROOFLINE_COLUMNS in its
    summary (each (category, method) at the mean context length of its own runs) and
    `meta["roofline"]`; returns the lines to print. Without a known bandwidth the bytes
    per token are still given, and the bound and fractions are NaN."""
    value, device_name = device_bandwidth(pair.device, bandwidth)
    rows = result.rows[result.rows.error.fillna("") == ""]
    summary = result.summary
    target_weights = parameter_bytes(pair.target)
    dtype_bytes = next(pair.target.parameters()).element_size()
    target_kv = kv_bytes_per_token(pair.target.config, dtype_bytes)

    def bound_at(context: float) -> tuple[float, float]:
        if context != context:  # NaN: no tokens
            return float("nan"), float("nan")
        per_token = target_weights + target_kv * context
        return per_token, (value / per_token if value else float("nan"))

    contexts, per_token, bounds = [], [], []
    for _, row in summary.iterrows():
        mine = rows[rows.method == row.method]
        if row.category != "all":
            mine = mine[mine.category == row.category]
        context = mean_context_length(mine.prompt_tokens, mine.new_tokens)
        size, bound = bound_at(context)
        contexts.append(context)
        per_token.append(size)
        bounds.append(bound)
    summary["context_length"] = contexts
    summary["bytes_per_token"] = per_token
    summary["roofline_tokens_per_s"] = bounds
    summary["roofline_fraction"] = summary.tokens_per_s_mean / summary.roofline_tokens_per_s

    ar = rows[rows.method == REFERENCE]
    context = mean_context_length((ar if len(ar) else rows).prompt_tokens, (ar if len(ar) else rows).new_tokens)
    size, bound = bound_at(context)
    overall = summary[summary.category == "all"].set_index("method")
    info = {"device_name": device_name, "bandwidth": value, "context_length": context,
            "target_weight_bytes": target_weights, "target_kv_bytes_per_token": target_kv,
            "bytes_per_token": size, "tokens_per_s": bound}
    lines = [f"roofline on {device_name}: the target reads {target_weights / 1e6:,.1f} MB of weights + "
             f"{target_kv / 1e3:,.2f} kB of KV per position × {context:.1f} positions (mean context of the "
             f"{'AR' if len(ar) else 'measured'} runs) = {size / 1e6:,.2f} MB per token"]
    if pair.draft is not None:
        draft_weights = parameter_bytes(pair.draft)
        draft_kv = kv_bytes_per_token(pair.draft.config, next(pair.draft.parameters()).element_size())
        info.update(draft_weight_bytes=draft_weights, draft_kv_bytes_per_token=draft_kv)
        lines.append(f"  the draft reads {(draft_weights + draft_kv * context) / 1e6:,.2f} MB per draft token")
    if not value:
        lines.append(f"  no memory bandwidth is known for this device ({device_name}); pass --bandwidth "
                     f"BYTES_PER_S or a GPU name ({', '.join(BANDWIDTHS)}) for the bound")
    else:
        lines.append(f"  bandwidth {value / 1e9:,.1f} GB/s → bound {bound:,.1f} tokens/s at batch 1")
        for method in [m for m in (REFERENCE, "hf-generate", "hf-generate-static") if m in overall.index]:
            fraction = overall.loc[method, "roofline_fraction"]
            info[f"{method}_fraction"] = float(fraction)
            lines.append(f"  {method}: {overall.loc[method, 'tokens_per_s_mean']:,.1f} tokens/s = "
                         f"{100 * fraction:.1f} % of the bound")
    result.meta["roofline"] = info
    return lines
