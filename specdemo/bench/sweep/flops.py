"""What each model of a pair is fed during a sweep's run: forwards, tokens and an estimate
of the FLOPs (2 × matmul parameters × tokens fed), counted by forward hooks so that every
code path that calls the model is counted alike.

Only forwards under inference mode count: decoding runs in it, and what a method does between
requests does not (OSD's learning needs gradients, and its time is off the clock too).
"""

from __future__ import annotations

import torch

from ...engine.drafters.feature_head import FeatureHead
from ...engine.drafters.published import PublishedHead


def matmul_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(body, head) parameter counts that multiply activations: every weight once, less
    the input embedding (a lookup) unless it is tied to the output head. A quantized layer's
    packed weight (torch.ao's dynamic int8 Linear keeps it outside `parameters()`) counts too."""
    if isinstance(model, PublishedHead):
        return model.matmul_parameters()
    if isinstance(model, FeatureHead):  # its own layer, then the target's LM-head rows of its subset
        return sum(p.numel() for p in model.parameters()), model.config.subset_size * model.config.hidden_size
    params = {p.data_ptr(): p.numel() for p in model.parameters()}
    for module in model.modules():
        if _is_packed(module):
            params.setdefault(id(module), weight_of(module).numel())
    total = sum(params.values())
    inputs, head = model.get_input_embeddings(), model.get_output_embeddings()
    head_params = weight_of(head).numel() if head is not None else 0
    tied = (head is not None and inputs is not None and not _is_packed(head)
            and inputs.weight.data_ptr() == head.weight.data_ptr())
    if inputs is not None and not tied:
        total -= inputs.weight.numel()
    return total - head_params, head_params


def weight_of(module: torch.nn.Module) -> torch.Tensor:
    """A layer's weight, unpacked when the layer is quantized (its `weight` is then a method)."""
    return module.weight() if _is_packed(module) else module.weight


def _is_packed(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return callable(weight) and not isinstance(weight, torch.Tensor)


class FedCounter:
    """Counts the forwards, tokens and logit rows that one model is fed, by hooks on its decoder
    body and its output head (so a forward that calls them directly counts too)."""

    def __init__(self, model: torch.nn.Module | None):
        self.calls: list[list[int]] = []  # [tokens fed, logit rows computed] per forward
        self.body, self.head = matmul_parameters(model) if model is not None else (0, 0)
        self._handles = []
        self._followed: set[int] = set()
        if model is None:
            return
        if isinstance(model, (FeatureHead, PublishedHead)):
            self.follow(model.step_module if isinstance(model, PublishedHead) else model)
            return
        self._handles.append(model.get_decoder().register_forward_pre_hook(self._body_hook, with_kwargs=True))
        output = model.get_output_embeddings()
        if output is not None:
            self._handles.append(output.register_forward_pre_hook(self._logits_hook))

    def follow(self, head: FeatureHead) -> None:
        """Count a copy of the counted feature head as the head itself (OSD drafts with its online
        copy, which has the same shape)."""
        if id(head) not in self._followed:
            self._followed.add(id(head))
            self._handles.append(head.register_forward_pre_hook(self._head_hook, with_kwargs=True))

    def _body_hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and torch.is_inference_mode_enabled():
            self.calls.append([int(ids.shape[-1]), 0])

    def _logits_hook(self, module, args):
        if self.calls and args and torch.is_inference_mode_enabled():
            hidden = args[0]
            self.calls[-1][1] += int(hidden.shape[-2]) if hidden.dim() >= 2 else 1

    def _head_hook(self, module, args, kwargs):
        features = kwargs.get("features", args[0] if args else None)
        if features is not None and torch.is_inference_mode_enabled():
            # one position's subset logits a step; a Medusa step reads one state [d]
            self.calls.append([int(features.shape[-2]) if features.dim() >= 2 else 1, 1])

    def decoding(self, prefill_calls: int) -> tuple[int, int, float]:
        """(forwards, tokens fed, FLOPs) after the first prefill_calls calls."""
        calls = self.calls[prefill_calls:]
        tokens = sum(t for t, _ in calls)
        flops = 2.0 * (self.body * tokens + self.head * sum(k for _, k in calls))
        return len(calls), tokens, flops

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
