"""Target runtimes: what runs the target's forwards. torch is the reference; ONNX Runtime
(onnxruntime-genai) is the second, with its export (`onnx_export`), its target behind the cached
LM's feed / score / roll-back calls (`onnx_lm`) and the feature head's steps beside it (`onnx_head`).
A further runtime goes here, as one more set of these modules and one more `Runtime` below.

`Runtime.refusal` is the one rule saying what a runtime cannot run; the API, the CLI and every tab
call it, so each reason is written once, here.
"""

from __future__ import annotations

from dataclasses import dataclass

TORCH, ONNX = "torch", "onnx"
# Said after every refusal: the reference runtime runs everything.
REMEDY = "choose the torch target runtime (runtime=torch)"


@dataclass(frozen=True)
class Runtime:
    """What one target runtime can run, declared once."""

    name: str
    cpu_only: bool = False
    precisions: tuple[str, ...] | None = None  # the target precisions it has an export for; None: any
    verifies_trees: bool = True  # takes a tree's attention mask in one verification forward
    runs_torch_loops: bool = True  # runs torch's own loops over the target (beam search, no KV cache)
    compresses_target_cache: bool = True  # lets a KV policy drop rows of the target's cache

    def refusal(self, *, device: str | None = None, precision: str | None = None, trees: bool = False,
                torch_loop: str | None = None, target_kv: str = "full") -> str | None:
        """Why this runtime cannot run a target on `device` at `precision`, a method that drafts `trees` or runs
        torch's own `torch_loop` ("beam search", "no KV cache"), or a target cache `target_kv`; None when it can."""
        if self.cpu_only and device is not None and not str(device).startswith("cpu"):
            return f"the {self.name} runtime runs the target on the CPU, and the device is {device!r}: {REMEDY}"
        if self.precisions is not None and precision is not None and precision not in self.precisions:
            return (f"the {self.name} runtime runs the target at {', '.join(self.precisions)}, not {precision}: "
                    f"choose one of those, or {REMEDY}")
        if trees and not self.verifies_trees:
            return (f"the method drafts a tree, and the {self.name} runtime verifies a chain only: choose a chain "
                    f"method (sd, egag, nasd, rest, the adaptive stops), or {REMEDY}")
        if torch_loop and not self.runs_torch_loops:
            return f"the method runs torch's own loop over the target ({torch_loop}), not the {self.name} runtime's: {REMEDY}"
        if target_kv != "full" and not self.compresses_target_cache:
            return (f"the {self.name} runtime keeps its own full cache, so target_kv={target_kv} cannot compress it: "
                    f"use full, or {REMEDY}")
        return None


_BY_NAME = {
    TORCH: Runtime(TORCH),
    ONNX: Runtime(ONNX, cpu_only=True, precisions=("float32", "int8", "int4"), verifies_trees=False,
                  runs_torch_loops=False, compresses_target_cache=False),
}
RUNTIMES = tuple(_BY_NAME)


def runtime_named(name: str) -> Runtime:
    """The runtime called `name`; ValueError naming the ones there are."""
    if name not in _BY_NAME:
        raise ValueError(f"runtime: {name!r} is not one of {', '.join(RUNTIMES)}")
    return _BY_NAME[name]
