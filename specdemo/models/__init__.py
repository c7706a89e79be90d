"""Model pairs: loading a target and its draft from a hub id, a folder, a GGUF file or a
preset, the embedded offline pair, and the token helpers every layer shares (EOS ids, chat
encoding, device and dtype defaults).

May import: ``specdemo.engine``, torch, transformers, huggingface_hub. Never imports the page,
the benchmark, training or the command line.
"""

from .loading import EMBEDDED, PRESETS, ModelLoadError, ModelPair, Preset, load_pair
from .spec import PairSpec

__all__ = ["EMBEDDED", "PRESETS", "ModelLoadError", "ModelPair", "PairSpec", "Preset", "load_pair"]
