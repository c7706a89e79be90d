"""The matmul parameters of a model, which with the tokens it was fed (`trace.FedCounts`) estimate its FLOPs.

Counted on the torch weights a pair keeps, also where another runtime runs the target (the same weights).
"""

from __future__ import annotations

import torch

from .drafters.feature_head import FeatureHead
from .drafters.published import PublishedHead


def matmul_parameters(model: torch.nn.Module | None) -> tuple[int, int]:
    """(body, head) parameter counts that multiply activations: every weight once, less
    the input embedding (a lookup) unless it is tied to the output head. A quantized layer's
    packed weight (torch.ao's dynamic int8 Linear keeps it outside `parameters()`) counts too.
    (0, 0) for no model."""
    if model is None:
        return 0, 0
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
