"""Target runtimes: what runs the target's forwards. torch is the reference; ONNX Runtime
(onnxruntime-genai) is the second, with its export (`onnx_export`), its target behind the cached
LM's feed / score / roll-back calls (`onnx_lm`) and the feature head's steps beside it (`onnx_head`).
A further runtime goes here, as one more set of these modules and one more `Runtime` below.

`refusal(pair, method, params, batch=, compile=)` is the one rule saying whether a method runs here: what
the pair lacks, what its target's runtime cannot run (`Runtime.reason`, each reason written once; its
`refusal` adds what to choose instead) and what a batch cannot run, each as the sentence the user reads.
The decode loop, `generate_batch`, the benchmark, the sweep and the page ask it; the torch copy
(`models.torch_copy`) runs a method on the pair's torch weights where `runtime_reason` says the runtime
refuses it, and says that reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..pair import DRAFT_ROLE, TARGET_ROLE

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


def drafts_a_tree(method: str, params) -> bool:
    """Whether `method` with these parameters drafts a tree (its registry entry says: `Method.drafts_a_tree`):
    what a runtime without tree attention cannot verify, and a batch does not run."""
    from ..methods import get_method  # the registry imports this module

    return get_method(method).drafts_a_tree(params)


def runtime_reason(pair, method: str, params=None, *, batch: int = 1, compile: bool = False) -> str | None:
    """The clause of the pair's target runtime (`Runtime.reason`) that refuses `method` with these settings, or
    None; None always for a pair whose target runs on torch. What the torch copy (`models.torch_copy`) says
    when it runs the method on the pair's torch weights instead."""
    if getattr(pair, "target_runtime", None) is None:
        return None
    return runtime_named(pair.runtime).reason(**_asked(pair, method, params, batch, compile))


def refusal(pair, method: str, params=None, *, batch: int = 1, compile: bool = False) -> str | None:
    """Why `pair` cannot run `method` with `params` (a `DecodeParams`; None: the defaults) in a batch of `batch`
    prompts, with graph capture where `compile`: the one sentence the user reads, or None when it runs. The
    decode loop, `generate_batch`, the benchmark, the sweep, the torch copy and the page all ask this."""
    from ..methods import FEATURE_HEAD, HEAD_KINDS, get_method  # the registry imports this module
    from ..params import DecodeParams

    spec, params = get_method(method), params if params is not None else DecodeParams()
    kind = getattr(pair, "draft_kind", None)
    if compile and _encoder_decoder(pair):
        return ("compile: graph capture runs decoder-only models; this pair's target is an encoder-decoder model: "
                "turn compile off")
    if spec.needs_draft and pair.draft is None:
        return f"method {method!r} needs a draft model; load the pair with draft=... or pick ar or nasd"
    if spec.needs_feature_head and kind != FEATURE_HEAD:
        return (f"method {method!r} adapts the pair's feature head while serving, and this pair drafts with "
                "a draft model; load a pair with a feature head (e.g. the embedded preset)")
    if spec.decoder == DRAFT_ROLE and kind in HEAD_KINDS:
        return (f"method {method!r} runs the pair's draft model alone, and this pair drafts with a feature "
                "head, which cannot write without the target's hidden states; load a pair with a draft model "
                "(e.g. the embedded-lm preset)")
    refused = runtime_named(getattr(pair, "runtime", TORCH)).refusal(**_asked(pair, method, params, batch, compile))
    if refused:
        return f"method {method!r}: {refused}"
    tree = spec.drafts_a_tree(params)
    if tree and _encoder_decoder(pair):
        return (f"method {method!r} drafts a tree, which runs on decoder-only pairs only; this pair is "
                "encoder-decoder: pick sd, egag, nasd or rest (without nasd_tree or rest_tree)")
    if batch <= 1:
        return None
    if spec.run is not None or not spec.cached or spec.decoder != TARGET_ROLE:
        return (f"method {method!r} runs its own loop over one request; a batch runs the chain methods "
                "(ar, sd, egag, nasd, rest, the adaptive stops): pick one of those, or one prompt")
    if _encoder_decoder(pair):
        return "a batch runs decoder-only pairs; this pair is encoder-decoder: give one prompt at a time"
    if params.target_kv != "full" or params.draft_kv != "full":
        return "target_kv/draft_kv: a batch keeps full caches: use full, or one prompt at a time"
    if tree:
        return (f"method {method!r} drafts a tree; a batch runs chain methods: pick sd, egag, nasd or rest "
                "(without nasd_tree or rest_tree), or one prompt")
    return None


def available_methods(pair) -> list[str]:
    """The registry's methods `pair` runs at their default parameters (`refusal` says None)."""
    from ..methods import METHODS  # the registry imports this module

    return [name for name in METHODS if refusal(pair, name) is None]


def _asked(pair, method: str, params, batch: int, compile: bool) -> dict:
    """What running `method` asks of the target's runtime (`Runtime.reason`'s keywords)."""
    from ..drafters.feature_head import FeatureHead
    from ..methods import get_method
    from ..params import DecodeParams

    spec, params = get_method(method), params if params is not None else DecodeParams()
    # Every pair declares its draft (`Pair.draft`, None where it has none).
    inner_layers = (spec.needs_draft and isinstance(pair.draft, FeatureHead)
                    and bool(pair.draft.config.feature_layers))
    return dict(trees=spec.drafts_a_tree(params), torch_loop=spec.torch_loop, compile=compile,
                inner_layers=inner_layers, target_kv=params.target_kv if spec.decoder == TARGET_ROLE else "full",
                batch=batch > 1)


def _encoder_decoder(pair) -> bool:
    from ..targets.seq2seq import is_encoder_decoder

    target = getattr(pair, "target", None)
    return target is not None and is_encoder_decoder(target)
