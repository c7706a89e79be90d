"""specdemo: AR, speculative decoding (SD), NASD and EGAG on one target, traced round by round."""

from .engine.decoding import generate, iter_generate
from .models.loading import PRESETS, ModelLoadError, ModelPair, load_pair
from .engine.methods import DEFAULT_METHODS, METHODS, get_method, parse_methods
from .engine.params import DecodeParams
from .engine.trace import GenerationResult, Round, TokenRecord

__all__ = [
    "DEFAULT_METHODS", "METHODS", "PRESETS", "DecodeParams", "GenerationResult", "ModelLoadError", "ModelPair",
    "Round", "TokenRecord", "generate", "get_method", "iter_generate", "load_pair", "parse_methods",
]
__version__ = "0.1.0"
