"""Published draft heads (EAGLE-1/2, EAGLE-3 in the authors' and in vLLM's speculators' layout, Medusa)
from a folder or a Hub id, recognised from their config, checked against the target, bound to it.

What is recognised, from config.json (and, for EAGLE-1/2, whose config is a plain Llama config, from
the weight names):
  speculators_config / speculators_model_type "eagle3"   EAGLE-3, speculators' layout
  medusa_num_heads                                        Medusa
  draft_vocab_size, or an architecture naming Eagle3      EAGLE-3, the authors' layout
  weights fc.weight + layers.0.self_attn.* (a Hub id: a one-layer config)   EAGLE-1/2
A head whose hidden size, vocabulary or layers do not fit the target is refused with a ValueError
(`ModelLoadError`) that names both sides, before anything runs. The torch modules live in
`specdemo.engine.drafters.published`; this module reads files and checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..engine.drafters.published import Eagle3Head, EagleHead, MedusaHead, PublishedHead
from ..engine.drafters.published.eagle3 import SPECULATORS_LAYOUT, default_layers
from .errors import ModelLoadError

CONFIG = "config.json"
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
EAGLE_KEYS = ("fc.weight", "layers.0.self_attn.q_proj.weight")
SPECULATORS = SPECULATORS_LAYOUT


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def config_of(ref: str) -> dict | None:
    """The config.json of a folder or a Hub id (None where there is none, or the Hub cannot be reached)."""
    if Path(ref).is_dir():
        return _read_json(Path(ref) / CONFIG)
    if Path(ref).exists() or ref.count("/") != 1:
        return None
    try:
        from huggingface_hub import hf_hub_download

        return _read_json(Path(hf_hub_download(ref, CONFIG)))
    except Exception:  # offline, unknown id, gated: the caller treats it as a draft model, whose loading explains
        return None


def kind_of(config: dict | None, weight_names: set[str] | None = None) -> tuple[str, str] | None:
    """(kind, layout) of a published head's config ("eagle", "eagle3" or "medusa"; the layout "" or
    "speculators"), or None for anything else (a draft model). `weight_names`: the checkpoint's keys,
    where known, which tell an EAGLE-1/2 head from a Llama model."""
    if not config:
        return None
    if "speculators_config" in config or "speculators_model_type" in config:
        algorithm = config.get("speculators_model_type") or (config.get("speculators_config") or {}).get("algorithm")
        if algorithm != "eagle3":
            raise ModelLoadError(f"a speculators checkpoint of type {algorithm!r}: only its eagle3 heads load here")
        return "eagle3", SPECULATORS
    if "medusa_num_heads" in config:
        return "medusa", ""
    if "draft_vocab_size" in config or any("eagle3" in a.lower() for a in config.get("architectures") or []):
        return "eagle3", ""
    if weight_names is not None:
        return ("eagle", "") if all(k in weight_names for k in EAGLE_KEYS) else None
    # A Hub id before its weights are fetched: a one-layer decoder is taken for an EAGLE head, and
    # `load_published` checks its weight names once they are here.
    return ("eagle", "") if config.get("num_hidden_layers") == 1 else None


def published_kind(ref: str | None) -> str | None:
    """The kind of a published head at `ref` without loading it, or None (never raises: the page asks
    this of whatever is typed)."""
    if not ref:
        return None
    try:
        names = weight_names(Path(ref)) if Path(ref).is_dir() else None
        found = kind_of(config_of(ref), names)
    except Exception:
        return None
    return found[0] if found else None


def weight_files(folder: Path) -> list[Path]:
    for pattern in WEIGHT_PATTERNS:
        files = sorted(p for p in folder.glob(pattern) if p.is_file())
        if files:
            return files
    return []


def weight_names(folder: Path) -> set[str]:
    """The keys of a folder's checkpoint, read from the safetensors headers or a lazily mapped .bin."""
    names: set[str] = set()
    for path in weight_files(folder):
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                names.update(f.keys())
        else:
            names.update(torch.load(path, map_location="cpu", weights_only=True, mmap=True).keys())
    return names


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(path)))
        else:
            state.update(torch.load(path, map_location="cpu", weights_only=True))
    if not state:
        raise ModelLoadError(f"no weights in {str(folder)!r}: expected {', '.join(WEIGHT_PATTERNS)} files")
    return state


def local_folder(ref: str) -> Path:
    """A folder, or a Hub id's snapshot (its config, weights and tokenizer files only)."""
    if Path(ref).is_dir():
        return Path(ref)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(ref, allow_patterns=["*.json", *WEIGHT_PATTERNS, "tokenizer*"]))
    except Exception as error:
        raise ModelLoadError(f"cannot fetch the draft head {ref!r} from the Hugging Face Hub: "
                             f"{type(error).__name__}: {error}") from error


def load_published(ref: str, target_model, target_ref: str, device, dtype: torch.dtype) -> PublishedHead:
    """The published head at `ref`, checked against the target, at `dtype` on `device`, bound to it."""
    folder = local_folder(ref)
    config = _read_json(folder / CONFIG)
    state = read_weights(folder)
    found = kind_of(config, set(state))
    if found is None:
        raise ModelLoadError(f"{ref!r} is not a published draft head this project reads (EAGLE, EAGLE-3, Medusa)")
    kind, layout = found
    build = {"eagle": _eagle, "eagle3": _eagle3, "medusa": _medusa}[kind]
    head = build(config, state, target_model, ref, target_ref, layout)
    return head.to(device=device, dtype=dtype).eval().bind(target_model)


def _target_sizes(target_model) -> tuple[int, int, int]:
    """The target's hidden size, the number of tokens its LM head predicts, its decoder layers."""
    config = target_model.config
    return config.hidden_size, target_model.get_output_embeddings().weight.shape[0], config.num_hidden_layers


def _refuse_mismatch(what: str, ref: str, theirs, target_ref: str, ours) -> None:
    if theirs != ours:
        raise ModelLoadError(f"the draft head {ref!r} has {what} {theirs}; the target {target_ref!r} has {ours}")


def _built(kind: str, ref: str, build):
    try:
        return build()
    except (ValueError, RuntimeError, KeyError) as error:  # a shape or a name the layout does not have
        raise ModelLoadError(f"cannot read the {kind} head in {ref!r}: {error}") from error


def _eagle(config, state, target_model, ref, target_ref, layout) -> EagleHead:
    hidden, vocab, _ = _target_sizes(target_model)
    _refuse_mismatch("hidden size", ref, state["fc.weight"].shape[0], target_ref, hidden)
    _refuse_mismatch("a vocabulary of", ref, config["vocab_size"], target_ref, vocab)
    return _built("EAGLE", ref, lambda: EagleHead.from_checkpoint(config, state))


def _eagle3(config, state, target_model, ref, target_ref, layout) -> Eagle3Head:
    if layout == SPECULATORS:
        config = {**config.get("transformer_layer_config", {}),
                  **{k: v for k, v in config.items() if k != "transformer_layer_config"}}
    hidden, vocab, layers = _target_sizes(target_model)
    _refuse_mismatch("target hidden size", ref, config.get("target_hidden_size") or config["hidden_size"], target_ref,
                     hidden)
    _refuse_mismatch("a vocabulary of", ref, config["vocab_size"], target_ref, vocab)
    if "embed_tokens.weight" not in state:  # it embeds with the target's embedding
        _refuse_mismatch("hidden size", ref, config["hidden_size"], target_ref, hidden)
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    ids = tuple(ids) if ids else default_layers(layers)
    width = state["fc.weight"].shape[1]
    if len(ids) * hidden != width or not all(0 <= i < layers for i in ids):
        raise ModelLoadError(f"the EAGLE-3 head {ref!r} fuses {width // hidden} layers of its target (states "
                             f"{width} wide) and reads the states entering layers {list(ids)}; the target "
                             f"{target_ref!r} has {layers} layers of hidden size {hidden}")
    return _built("EAGLE-3", ref, lambda: Eagle3Head.from_checkpoint(config, state, ids, hidden, layout))


def _medusa(config, state, target_model, ref, target_ref, layout) -> MedusaHead:
    hidden, vocab, _ = _target_sizes(target_model)
    head = _built("Medusa", ref, lambda: MedusaHead.from_checkpoint(config, state))
    _refuse_mismatch("hidden size", ref, head.hidden_size, target_ref, hidden)
    _refuse_mismatch("a vocabulary of", ref, head.vocab_size, target_ref, vocab)
    return head


def save_eagle(folder: Path, config: dict, state: dict[str, torch.Tensor],
               file_name: str = "pytorch_model.bin") -> None:
    """Write a head in a published layout: config.json and its weights (.bin as the EAGLE authors
    publish theirs, or a .safetensors name)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(json.dumps(config, indent=1))
    state = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    if file_name.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(state, str(folder / file_name))
    else:
        torch.save(state, folder / file_name)
