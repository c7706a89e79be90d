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
from .params import parse_shape
from .policies import ConfidenceStop, EntropyGamma, FixedGamma, HeuristicGamma
from .tree_drafting import DynamicTree, EntropyTree, StaticTree, TreeDrafter


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
    drafter = _plain_drafter(pair)
    return CopyFirstDrafter(drafter, params.copy_n, pair.device) if params.copy_n else drafter


def _plain_drafter(pair) -> Drafter:
    """The pair's draft without context copying (a tree's drafts come from one q per node)."""
    return FeatureDrafter(pair.draft) if isinstance(pair.draft, FeatureHead) else ModelDrafter(pair.draft, pair.vocab_size)


def _tree_policy(p: DecodeParams):
    if p.tree_policy == "static":
        return StaticTree(parse_shape(p.tree_shape), p.node_budget)
    return DynamicTree(p.max_width, p.max_depth, p.node_budget)


def _nasd(pair, p: DecodeParams):
    drafter = NgramDrafter(p.ngram_n, p.ngram_storage, p.top_k_filler, pair.device)
    return (TreeDrafter(drafter), _tree_policy(p)) if p.nasd_tree else (drafter, FixedGamma(p.gamma))


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    METHODS[method.name] = method
    return method


register(Method("ar", "AR", False, "the target alone, one token per forward",
                lambda pair, p: (None, FixedGamma(0))))
register(Method("sd", "SD", True, "the pair's draft (a model or a feature head) or a copy from the context, fixed γ",
                lambda pair, p: (_model_drafter(pair, p), FixedGamma(p.gamma))))
register(Method("nasd", "NASD", False, "n-gram table drafts, fixed γ (or, with nasd_tree, a tree of its continuations)",
                lambda pair, p: _nasd(pair, p)))
register(Method("egag", "EGAG", True, "the pair's draft, γ from the drafter's entropy",
                lambda pair, p: (_model_drafter(pair, p), EntropyGamma(p.gamma_min, p.gamma_max, p.ema))))
register(Method("sd-heuristic", "SD (+2/−1)", True, "the pair's draft, transformers' +2/−1 γ schedule",
                lambda pair, p: (_model_drafter(pair, p), HeuristicGamma(p.gamma))))
register(Method("sd-confidence", "SD (confidence)", True, "the pair's draft, stop drafting when its top probability < 0.4",
                lambda pair, p: (_model_drafter(pair, p), ConfidenceStop(p.gamma_max))))

register(Method("sd-tree", "SD-tree", True, "the pair's draft as a tree (dynamic or static shape), verified in one forward",
                lambda pair, p: (TreeDrafter(_plain_drafter(pair)), _tree_policy(p))))
register(Method("egag-tree", "EGAG-tree", True, "the pair's draft as a tree: depth from the smoothed entropy, "
                "width from each node's entropy", lambda pair, p: (TreeDrafter(_plain_drafter(pair)),
                EntropyTree(p.gamma_min, p.gamma_max, p.ema, p.max_width, p.node_budget))))

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
