"""Token and device helpers shared by loading, the benchmark and training, written once:
the EOS ids of a model, chat-template encoding, the default device and dtype, and a device's
name as a run's record gives it.

May import torch; nothing of specdemo outside ``engine``.
"""

from __future__ import annotations

import os
import platform
from typing import Iterable, Sequence

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
          "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float64": torch.float64}


def collect_eos_ids(model, tokenizer) -> set[int]:
    """Every id that ends a generation: the model's generation_config EOS (an id or a list) and the tokenizer's."""
    ids: set[int] = set()
    generation_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (generation_eos, tokenizer.eos_token_id):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def encode_messages(tokenizer, messages: Iterable[tuple[str, str]]) -> list[int]:
    """Token ids of (role, content) turns in the tokenizer's chat template, ready for the answer.

    Rendering to text and tokenizing separately behaves the same across transformers
    versions, whose ``apply_chat_template(tokenize=True)`` return types differ.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("chat: this model's tokenizer has no chat template; turn chat off")
    text = tokenizer.apply_chat_template(
        [{"role": role, "content": content} for role, content in messages], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_chat(tokenizer, prompt: str) -> list[int]:
    """One user turn through the chat template."""
    return encode_messages(tokenizer, [("user", prompt)])


def default_device(device: str | torch.device | None = None) -> torch.device:
    """The device asked for, else CUDA when there is one, else the CPU."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_name() -> str:
    """The processor's name where the platform knows it (often it does not), else its architecture."""
    return platform.processor() or platform.machine()


def device_name(device: torch.device) -> str:
    """The GPU's model, or the CPU with its core count: what a measurement ran on."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({cpu_name()}, {os.cpu_count()} cores)"


def resolve_dtype(dtype: str | torch.dtype | None, device: str | torch.device) -> torch.dtype:
    """A dtype name (or None/"auto" for the default: bfloat16 on a GPU, float32 on a CPU)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "", "auto"):
        # bf16 halves GPU memory traffic; CPUs run float32 fastest and exactly.
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def check_token_ids(ids: Sequence[int], limit: int) -> list[int]:
    bad = [t for t in ids if not 0 <= t < limit]
    if bad:
        raise ValueError(f"prompt token ids must lie in [0, {limit}); got {bad[:5]}")
    return list(ids)
