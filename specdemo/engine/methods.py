"""The registry of decoding methods: each is a drafter and a γ policy, nothing more.

Adding a method is adding an entry; the decode loop never branches on a name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .context_copy import CopyFirstDrafter
from .drafters import Drafter, ModelDrafter, NgramDrafter
from .feature_drafter import FeatureDrafter
from .feature_head import FeatureHead
from .params import DecodeParams
from .policies import ConfidenceStop, EntropyGamma, FixedGamma, HeuristicGamma


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    needs_draft: bool
    description: str
    build: Callable[["object", DecodeParams], tuple[Drafter | None, object]]


def _model_drafter(pair, params: DecodeParams) -> Drafter:
    """The pair's draft as a drafter: a feature-level head reads the target, a model runs alone;
    with copy_n, rounds where the context repeats itself are copied instead."""
    drafter = FeatureDrafter(pair.draft) if isinstance(pair.draft, FeatureHead) else ModelDrafter(pair.draft, pair.vocab_size)
    return CopyFirstDrafter(drafter, params.copy_n, pair.device) if params.copy_n else drafter


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    METHODS[method.name] = method
    return method


register(Method("ar", "AR", False, "the target alone, one token per forward",
                lambda pair, p: (None, FixedGamma(0))))
register(Method("sd", "SD", True, "the pair's draft (a model or a feature head) or a copy from the context, fixed γ",
                lambda pair, p: (_model_drafter(pair, p), FixedGamma(p.gamma))))
register(Method("nasd", "NASD", False, "n-gram table drafts, fixed γ",
                lambda pair, p: (NgramDrafter(p.ngram_n, p.ngram_storage, p.top_k_filler, pair.device),
                                 FixedGamma(p.gamma))))
register(Method("egag", "EGAG", True, "the pair's draft, γ from the drafter's entropy",
                lambda pair, p: (_model_drafter(pair, p), EntropyGamma(p.gamma_min, p.gamma_max, p.ema))))
register(Method("sd-heuristic", "SD (+2/−1)", True, "the pair's draft, transformers' +2/−1 γ schedule",
                lambda pair, p: (_model_drafter(pair, p), HeuristicGamma(p.gamma))))
register(Method("sd-confidence", "SD (confidence)", True, "the pair's draft, stop drafting when its top probability < 0.4",
                lambda pair, p: (_model_drafter(pair, p), ConfidenceStop(p.gamma_max))))

DEFAULT_METHODS = ("ar", "sd", "nasd", "egag")


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return METHODS[name]


def parse_methods(value: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """'ar,sd' or ['ar', 'sd'] → validated names in order, duplicates dropped."""
    if value is None:
        return list(DEFAULT_METHODS)
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [n.strip().lower() for n in names if n and n.strip()]
    if not names:
        raise ValueError(f"methods: choose at least one of {', '.join(METHODS)}")
    for name in names:
        get_method(name)
    return list(dict.fromkeys(names))
