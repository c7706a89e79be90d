"""The decoding core: sampling, the cached LM, drafters, γ policies, methods, parameters,
the decode loop and its trace.

Owns every step of a round (draft, verify in one target forward, accept, roll back).
May import: torch, transformers' cache classes and the standard library. Never imports
gradio, pandas or plotly, nor any other specdemo subpackage (model pairs are duck-typed:
anything with ``target``, ``draft``, ``tokenizer``, ``encode`` and ``eos_ids``).
"""

from .batch import generate_batch
from .decoding import generate, iter_generate
from .methods import DEFAULT_METHODS, METHODS, get_method, parse_methods
from .params import DecodeParams
from .trace import GenerationResult, Round, TokenRecord

__all__ = [
    "DEFAULT_METHODS", "METHODS", "DecodeParams", "GenerationResult", "Round", "TokenRecord",
    "generate", "generate_batch", "get_method", "iter_generate", "parse_methods",
]
