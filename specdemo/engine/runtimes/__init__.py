"""Target runtimes: what runs the target's forwards. torch is the reference; ONNX Runtime
(onnxruntime-genai) is the second, with its export (`onnx_export`), its target behind the cached
LM's feed / score / roll-back calls (`onnx_lm`) and the feature head's steps beside it (`onnx_head`).
A further runtime goes here, as one more set of these modules and one more `Runtime` below.

`Runtime.reason` is the one rule saying what a runtime cannot run, each reason written once, here:
`refusal` adds what to choose instead (loading, the decode loop and the tabs refuse with it), and the
torch copy (`models.torch_copy`) says it when a method runs on the pair's torch weights instead.
"""

from __future__ import annotations

from dataclasses import dataclass

TORCH, ONNX = "torch", "onnx"
# The default everywhere: onnx where it runs the target (`onnx_export.resolve_runtime`), torch otherwise.
AUTO = "auto"
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
    captures_graphs: bool = True  # torch.compile's graph capture of the target's steps
    returns_inner_layers: bool = True  # hands a drafter the states of layers before the last
    rewinds_rows: bool = True  # rolls back each row of a batch by its own count (a batch's rows accept apart)

    def reason(self, **asked) -> str | None:
        """Why this runtime cannot run what is `asked` (see `_why`), or None when it can."""
        why = self._why(**asked)
        return why[0] if why else None

    def refusal(self, **asked) -> str | None:
        """`reason` with what to choose instead, for a surface that refuses rather than falls back."""
        why = self._why(**asked)
        return f"{why[0]}: {why[1]}" if why else None

    def _why(self, *, device: str | None = None, precision: str | None = None, trees: bool = False,
             torch_loop: str | None = None, target_kv: str = "full", compile: bool = False,
             inner_layers: bool = False, batch: bool = False) -> tuple[str, str] | None:
        """(why not, what to choose instead) for a target on `device` at `precision`, a method that drafts
        `trees`, runs torch's own `torch_loop` ("beam search", "no KV cache"), compresses the target's cache
        (`target_kv`), captures graphs, or drafts from the target's `inner_layers`; None when it runs them."""
        name = f"the {self.name} runtime"
        if self.cpu_only and device is not None and not str(device).startswith("cpu"):
            return f"{name} runs the target on the CPU, and the device is {device!r}", REMEDY
        if self.precisions is not None and precision is not None and precision not in self.precisions:
            return (f"{name} runs the target at {', '.join(self.precisions)}, not {precision}",
                    f"choose one of those, or {REMEDY}")
        if trees and not self.verifies_trees:
            return (f"the method drafts a tree, and {name} verifies a chain only (no tree attention mask)",
                    f"choose a chain method (sd, egag, nasd, rest, the adaptive stops), or {REMEDY}")
        if torch_loop and not self.runs_torch_loops:
            return f"the method runs torch's own loop over the target ({torch_loop}), not {name}'s", REMEDY
        if target_kv != "full" and not self.compresses_target_cache:
            return f"{name} keeps its own full cache, so target_kv={target_kv} cannot compress it", f"use full, or {REMEDY}"
        if compile and not self.captures_graphs:
            return f"graph capture is torch's, and {name} runs its own graph", f"turn compile off, or {REMEDY}"
        if inner_layers and not self.returns_inner_layers:
            return f"the drafter reads the target's inner layers, and {name} returns the last state only", REMEDY
        if batch and not self.rewinds_rows:
            return (f"a batch's rows accept different numbers of drafts, and {name} rewinds every row of a batch "
                    "together", f"give one prompt at a time, or {REMEDY}")
        return None


_BY_NAME = {
    TORCH: Runtime(TORCH),
    ONNX: Runtime(ONNX, cpu_only=True, precisions=("float32", "int8", "int4"), verifies_trees=False,
                  runs_torch_loops=False, compresses_target_cache=False, captures_graphs=False,
                  returns_inner_layers=False, rewinds_rows=False),
}
RUNTIMES = tuple(_BY_NAME)
RUNTIME_CHOICES = (AUTO, *RUNTIMES)


def runtime_named(name: str) -> Runtime:
    """The runtime called `name` (auto resolved already); ValueError naming the choices there are."""
    if name not in _BY_NAME:
        raise ValueError(f"runtime: {name!r} is not one of {', '.join(RUNTIME_CHOICES)}")
    return _BY_NAME[name]
