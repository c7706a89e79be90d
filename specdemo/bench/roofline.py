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
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * heads * head_dim * dtype_bytes


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


def model_roofline(model: torch.nn.Module, context_length: int, bandwidth: float | str) -> Roofline:
    """The bound for one model at a context length, its KV cache in the weights' dtype."""
    dtype_bytes = next(model.parameters()).element_size()
    return roofline(parameter_bytes(model), kv_bytes_per_token(model.config, dtype_bytes), context_length, bandwidth)
