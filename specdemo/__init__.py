"""specdemo: AR, speculative decoding (SD), NASD and EGAG on one target, traced round by round.

The package is layered; lower layers never import upper ones:

    engine/     the decoding core: sampling, cached LM, drafters, γ policies, methods,
                parameters, the decode loop and its trace (torch only)
    models/     loading model pairs, the embedded pair, shared token helpers
    bench/      the prompt suite, runners, statistics and the report
    training/   training and evaluating the embedded draft
    app/        the Gradio page
    cli/        ``python -m specdemo …``

The names below are the public API. They are resolved on first use, so importing one
subpackage (e.g. ``specdemo.engine``) loads nothing above it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    # A method the target's runtime cannot run runs on the pair's torch copy (models.torch_copy).
    "generate": "models.torch_copy", "iter_generate": "models.torch_copy", "generate_batch": "models.torch_copy",
    "DEFAULT_METHODS": "engine.methods", "METHODS": "engine.methods", "get_method": "engine.methods",
    "parse_methods": "engine.methods",
    "DecodeParams": "engine.params",
    "GenerationResult": "engine.trace", "Round": "engine.trace", "TokenRecord": "engine.trace",
    "PRESETS": "models.loading", "ModelPair": "models.loading", "load_pair": "models.loading",
    "ModelLoadError": "models.errors",
    "record": "engine.replay", "replay": "engine.replay",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"

if TYPE_CHECKING:
    from .models.torch_copy import generate, generate_batch, iter_generate
    from .engine.methods import DEFAULT_METHODS, METHODS, get_method, parse_methods
    from .engine.params import DecodeParams
    from .engine.trace import GenerationResult, Round, TokenRecord
    from .models.errors import ModelLoadError
    from .engine.replay import record, replay
    from .models.loading import PRESETS, ModelPair, load_pair


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specdemo' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
