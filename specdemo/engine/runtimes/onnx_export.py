"""The target exported for ONNX Runtime (runtime="onnx"): written once per model and precision, then reused.

onnxruntime-genai's model builder (`python -m onnxruntime_genai.models.builder`) turns a
transformers folder into an ONNX graph with a KV cache it manages itself, for the CPU, at
fp32, int8 or int4; `include_hidden_states` makes the graph return the final normed hidden
states beside the logits, which the feature head reads. The export runs in a child process
(the builder is a command, and its memory goes when it ends) into a temporary sibling folder
that is renamed into place, so a crash never leaves a folder that looks complete.

Where: ``$SPECDEMO_CACHE/onnx/`` or ``~/.cache/specdemo/onnx/``, one folder per source and
precision. The embedded target's fp32 export takes about 30 s and 540 MB on disk.
"""

from __future__ import annotations

import hashlib
import json
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError
from . import AUTO, ONNX, RUNTIMES, TORCH, runtime_named

# The builder's names for the runtime's weight precisions, by the names the rest of specdemo uses.
ONNX_PRECISIONS = dict(zip(runtime_named(ONNX).precisions, ("fp32", "int8", "int4")))
_MARKER = ".specdemo-onnx"
_EXPORT_VERSION = "1"


def onnx_runtime_missing() -> str | None:
    """Why runtime="onnx" cannot run here, or None when it can."""
    for module, package in (("onnxruntime_genai", "onnxruntime-genai"), ("onnx_ir", "onnx-ir"), ("onnx", "onnx")):
        if importlib.util.find_spec(module) is None:
            return (f"runtime onnx needs the {package} package, which is not installed: "
                    "pip install onnxruntime-genai onnx onnx-ir onnxscript")
    return None


def served_runtimes(device: str) -> tuple[str, ...]:
    """The runtimes a page on `device` offers for the target: onnx beside torch where it is installed
    and the device is the CPU (the one the runtime runs on)."""
    return RUNTIMES if str(device).startswith("cpu") and onnx_runtime_missing() is None else (TORCH,)


def check_runtime(runtime: str, device: str, precision_name: str) -> None:
    """ValueError where `runtime` is none of auto, torch, onnx, or (not auto) cannot run a target at
    `precision_name` on `device`."""
    if runtime == AUTO:
        return
    refused = runtime_named(runtime).refusal(device=device, precision=precision_name)
    if refused:
        raise ValueError(refused)


@dataclass(frozen=True)
class RuntimeChoice:
    """The runtime a target runs on, and the one line the page's status and the trace say about it."""

    runtime: str  # torch or onnx, never auto
    reason: str


# Where the target's transformers folder has not been looked at yet (before loading it): only the device,
# the packages and the precision decide.
UNCHECKED = None


def resolve_runtime(requested: str, device: str, precision_name: str, source: Path | str | None = UNCHECKED
                    ) -> RuntimeChoice:
    """The runtime for a target: `requested` torch or onnx as it is (onnx checked against the device and
    the precision), and auto as onnx where onnxruntime-genai and the export's packages are installed, the
    device is the CPU, the precision is one the runtime runs and the target can be exported, torch
    otherwise, with the reason. source: the transformers folder the target would be exported from (its
    config.json is read), a sentence saying why there is none (a .gguf file), or UNCHECKED.
    The one place "auto" is decided; `load_pair`, the page and the CLI all come here."""
    check_runtime(requested, device, precision_name)
    if requested != AUTO:
        return RuntimeChoice(requested, f"the target on {requested}, as asked")
    why_not = onnx_refusal(device, precision_name, source)
    if why_not:
        return RuntimeChoice(TORCH, f"the target on torch (auto): {why_not}")
    return RuntimeChoice(ONNX, "the target on onnx (auto): ONNX Runtime is installed, the device is the CPU and "
                               "the target exports")


def onnx_refusal(device: str, precision_name: str, source: Path | str | None = UNCHECKED) -> str | None:
    """Why the onnx runtime cannot run this target (a clause for `resolve_runtime`), or None."""
    why = runtime_named(ONNX).reason(device=device, precision=precision_name) or onnx_runtime_missing()
    if why:
        return why
    if isinstance(source, str):
        return source
    if source is not None:
        try:
            check_exportable(Path(source))
        except ModelLoadError as error:
            return str(error)
    return None


def export_root() -> Path:
    root = os.environ.get("SPECDEMO_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "specdemo") / "onnx"


def export_folder(source: Path, precision_name: str) -> Path:
    """Where the export of the transformers folder `source` at this precision lives (a name per source path)."""
    source = Path(source).resolve()
    digest = hashlib.sha1(str(source).encode()).hexdigest()[:10]
    name = source.name
    if source.parent.name == "snapshots":  # a Hub snapshot: models--org--name/snapshots/<commit>
        name = source.parent.parent.name.removeprefix("models--") + "-" + source.name[:8]
    return export_root() / f"{name}-{digest}-{ONNX_PRECISIONS[precision_name]}"


def is_exported(folder: Path) -> bool:
    marker = folder / _MARKER
    return marker.is_file() and marker.read_text().strip() == _EXPORT_VERSION


def check_exportable(source: Path) -> None:
    """Refuse a model the runtime cannot run (heads not a multiple of 16 wide) or the builder would
    export wrongly: it takes the first linear layer whose
    output width is the vocabulary size for the LM head, so a vocabulary as wide as a projection
    (only ever a tiny test model) would get a layer's projection as its head."""
    config_file = Path(source) / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"runtime onnx exports a transformers folder; {source} has no config.json")
    config = json.loads(config_file.read_text())
    if config.get("is_encoder_decoder"):
        raise ModelLoadError(f"{source}: an encoder-decoder model; onnx runtime's builder exports decoder-only "
                             "models: use runtime=torch")
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads") or 1
    head_dim = config.get("head_dim") or (hidden // heads if hidden else None)
    widths = {hidden, config.get("intermediate_size"), heads * head_dim if head_dim else None,
              (config.get("num_key_value_heads") or heads) * head_dim if head_dim else None}
    if head_dim and head_dim % 16:  # the runtime's CPU attention kernel (GroupQueryAttention)
        raise ModelLoadError(f"{source}: its attention heads are {head_dim} wide; onnx runtime's attention takes a "
                             "multiple of 16: use runtime=torch")
    if config.get("vocab_size") in widths:
        raise ModelLoadError(f"{source}: its vocabulary ({config['vocab_size']}) is as wide as one of its projections, "
                             "which onnxruntime-genai's builder would take for the LM head; use runtime=torch")


def export(source: Path, precision_name: str) -> Path:
    """The ONNX folder for `source` at this precision, exported now if it is not on disk yet."""
    missing = onnx_runtime_missing()
    if missing:
        raise ModelLoadError(missing)
    target = export_folder(source, precision_name)
    if is_exported(target):
        return target
    check_exportable(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # a half-written folder from an export that was cut
        shutil.rmtree(target, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o", str(work / "model"),
                   "-p", ONNX_PRECISIONS[precision_name], "-e", "cpu", "-c", str(work / "hf-cache"),
                   "--extra_options", "include_hidden_states=true"]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-1500:]
            raise ModelLoadError(f"exporting {source} for onnx runtime failed (exit {done.returncode}): {tail}")
        (work / "model" / _MARKER).write_text(_EXPORT_VERSION + "\n")
        try:
            os.replace(work / "model", target)
        except OSError:  # another process exported it first, just as well
            if not is_exported(target):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def onnx_target(source: Path, precision_name: str):
    """An `OnnxTarget` for the transformers folder `source`, exported first if needed."""
    from .onnx_lm import OnnxTarget

    return OnnxTarget(export(source, precision_name), ONNX_PRECISIONS[precision_name])
