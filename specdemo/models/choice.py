"""Which model pair a fresh page opens with.

Offline, or without a GPU, the embedded pair. On a GPU with the Hub in reach, a real hub pair
sized to the GPU's memory: a 135 M target on a GPU is bound by kernel launches, not by its
weights, and speculative decoding cannot win there with any draft.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .loading import EMBEDDED, PRESETS

# (least GPU memory in GiB, preset): the target and draft in bfloat16 plus room for the caches.
GPU_CHOICES = ((24.0, "qwen2.5-7b"), (8.0, "qwen2.5-1.5b"))


@dataclass(frozen=True)
class Machine:
    gpu_memory_gib: float | None  # None: no CUDA device
    hub_reachable: bool


def choose_preset(machine: Machine, allowed: tuple[str, ...] | None = None) -> str:
    """The largest hub pair the GPU holds, if the Hub answers and the preset is allowed."""
    if machine.gpu_memory_gib is not None and machine.hub_reachable:
        for least, name in GPU_CHOICES:
            if machine.gpu_memory_gib >= least and name in PRESETS and (allowed is None or name in allowed):
                return name
    return EMBEDDED


def hub_reachable(preset: str, timeout: float = 3.0) -> bool:
    """Whether both models of a preset can be had: cached locally, or the Hub answers in time."""
    from huggingface_hub import try_to_load_from_cache

    refs = [PRESETS[preset].target, PRESETS[preset].draft]
    if all(isinstance(try_to_load_from_cache(ref, "config.json"), str) for ref in refs):
        return True
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(refs[0], timeout=timeout)
        return True
    except Exception:  # no network, a proxy, the Hub down: the offline default serves
        return False


def detect_machine(candidate: str = GPU_CHOICES[-1][1]) -> Machine:
    import torch

    if not torch.cuda.is_available():
        return Machine(None, False)
    memory = torch.cuda.get_device_properties(0).total_memory / 2**30
    return Machine(memory, hub_reachable(candidate))


def default_preset(allowed: tuple[str, ...] | None = None) -> str:
    """The preset a page opens with on this machine (`SPECDEMO_DEFAULT_PRESET` overrides)."""
    chosen = os.environ.get("SPECDEMO_DEFAULT_PRESET")
    if chosen:
        return chosen
    return choose_preset(detect_machine(), allowed)
