"""The registry of decoding methods: each is a drafter and a γ policy, nothing more.

Adding a method is adding an entry; the decode loop never branches on a name.

The baselines fit the same shape: `draft` is AR's rounds of one token with the pair's
draft model in the target's place (`decoder`), `ar-nocache` is AR with an engine that
keeps no KV cache (`cached=False`, its new tokens capped because each step recomputes
the whole prefix), and `beam` is a method whose trace is built from transformers'
`generate` (`run`) instead of the loop's rounds. A method that is not lossless against
greedy AR (`lossless=False`: beam search, the draft alone) has no matches_ar.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable

from .beam import run_beam
from .drafters.context_copy import CopyFirstDrafter
from .drafters.base import Drafter
from .drafters.model import ModelDrafter
from .drafters.ngram import NgramDrafter
from .drafters.feature_drafter import FeatureDrafter
from .drafters.feature_head import FeatureHead
from .params import PARAMS, DecodeParams, parse_shape
from .drafters.published import PUBLISHED_KINDS, PublishedHead
from .drafters.acceptance_head import cached_acceptance_head, round_features
from .drafters.policies import (AdaEDLStop, ConfidenceStop, EntropyGamma, FixedGamma, HeuristicGamma,
                                PredictedRejectionStop, TokenEntropyStop)
from .drafters.online import OnlineDrafter, online_head
from .drafters.rest import RestDrafter, load_datastore
from .drafters.tree_drafting import DynamicTree, EntropyTree, StaticTree, StopRuleTree, TreeDrafter


# Recomputing the whole prefix every step is quadratic; longer runs are cut to this many tokens.
NOCACHE_MAX_NEW_TOKENS = 128
FEATURE_HEAD = "feature-head"
# Drafts that read the target's states (ours and the published heads): none can write by itself.
HEAD_KINDS = (FEATURE_HEAD, *PUBLISHED_KINDS)


@dataclass(frozen=True)
class Sweep:
    """How a sweep grids a method: the parameters it varies (each given a list of values, crossed
    in this order) and a setting's label, formatted from the setting's values ({label} is the
    method's label, {copy} its copy phrase)."""

    axes: tuple[str, ...]
    label: str
    by_default: bool = False  # swept when the sweep names no methods and the grids of its axes are given
    rank: int = 0  # where its settings come in a sweep's grid and tables (lower first; ties in the registry's order)
    optional: tuple[str, ...] = ()  # axes a sweep may leave unset: the parameter's default applies, its column empty
    needs_values: bool = True  # False: an axis given no values runs at its parameter's default
    choice: str = ""  # how the page offers it among the methods to sweep ("": the method's label)
    at_drafts: bool = False  # the speedup chart places its settings at the drafts per round they made


@dataclass(frozen=True)
class Method:
    name: str
    label: str
    needs_draft: bool
    description: str
    build: Callable[["object", DecodeParams], tuple[Drafter | None, object]]
    decoder: str = "target"  # the model whose tokens come out: "target", or "draft" for the draft alone
    cached: bool = True  # False: no KV cache, every step reads the whole sequence again
    new_tokens_cap: int | None = None  # max_new_tokens above this is lowered to it, and the trace says so
    lossless: bool = True  # under greedy decoding its output is AR's, so matches_ar is asked of it
    run: Callable | None = None  # (pair, params, seed, result) → iterator of results, for a method not made of rounds
    drafts: bool = True  # False: every step writes one token (AR and the baselines), bound by memory, not compute
    needs_feature_head: bool = False  # drafts with the pair's feature head only (OSD adapts it online)
    params: tuple[str, ...] = ()  # the parameters of its own it reads (the schema's others every method reads)
    sweep: Sweep | None = None  # how a sweep grids it; None: a sweep never runs it as a contender
    adapts: bool = False  # sets its draft length (or its tree) as it goes: judged against the best fixed γ
    default_on: bool = False  # ticked by default on the page, the CLI and the API
    baseline: bool = False  # a reference beside AR (beam search, the draft alone, no cache), run once per prompt
    color: str | None = None  # its colour on the page's panels and charts (None: one from a fixed cycle)
    reading: str = ""  # a baseline: what its row shows beside AR, in the page's reading of the table
    # A chain whose γ policy changes its drafts round by round (a schedule, an entropy rule, a stop rule),
    # so the setting's γ is not what it drafted.
    varies_gamma: bool = False
    tree: bool = False  # drafts a tree every round
    tree_switch: str = ""  # the boolean parameter that turns its chain into a tree ("": none)

    @property
    def torch_loop(self) -> str | None:
        """The torch loop over the target this method runs instead of the decode loop's rounds, or None."""
        if self.decoder != "target":
            return None
        return "beam search" if self.run is not None else None if self.cached else "no KV cache"

    def drafts_a_tree(self, params: DecodeParams) -> bool:
        """Whether it drafts a tree with these parameters: what a runtime without tree attention cannot
        verify, and a batch does not run."""
        return self.tree or bool(self.tree_switch and getattr(params, self.tree_switch))

    def fit(self, params: DecodeParams) -> tuple[DecodeParams, str]:
        """The parameters this method runs with, and a note for the user when they differ from those asked."""
        cap = self.new_tokens_cap
        if cap is not None and params.max_new_tokens > cap:
            return (params.replace(max_new_tokens=cap),
                    f"{self.label} stops at {cap} new tokens (asked for {params.max_new_tokens}): without a KV "
                    "cache every step recomputes the whole prefix, so its cost grows with the square of the length")
        return params, ""


def _model_drafter(pair, params: DecodeParams) -> Drafter:
    """The pair's draft as a drafter: a feature-level head reads the target, a model runs alone;
    with copy_n, rounds where the context repeats itself are copied instead."""
    # The runtime keeps its own full cache: a draft whose cache a KV policy compresses drafts on torch.
    drafter = _plain_drafter(pair, draft_on_runtime=params.draft_kv == "full")
    return CopyFirstDrafter(drafter, params.copy_n, pair.device) if params.copy_n else drafter


def _plain_drafter(pair, draft_on_runtime: bool = True) -> Drafter:
    """The pair's draft without context copying (a tree's drafts come from one q per node); beside a
    runtime target, its steps on that runtime too where `draft_on_runtime` and the runtime runs it."""
    if isinstance(pair.draft, PublishedHead):
        return pair.draft.drafter()
    if isinstance(pair.draft, FeatureHead):
        runtime = getattr(pair, "target_runtime", None)
        return runtime.feature_drafter(pair.draft) if runtime is not None else FeatureDrafter(pair.draft)
    draft_runtime = getattr(pair, "draft_runtime", None) if draft_on_runtime else None
    return ModelDrafter(pair.draft, pair.vocab_size, lm_factory=draft_runtime.draft_lm if draft_runtime else None)


def _tree_policy(p: DecodeParams):
    if p.tree_policy == "static":
        return StaticTree(parse_shape(p.tree_shape), p.node_budget)
    return DynamicTree(p.max_width, p.max_depth, p.node_budget)


def _stop_rule_tree(pair, p: DecodeParams, rule) -> tuple[Drafter, StopRuleTree]:
    """The pair's draft as a tree, pruned where the per-token rule would stop a chain."""
    return TreeDrafter(_plain_drafter(pair)), StopRuleTree(p.max_width, p.max_depth, p.node_budget, rule,
                                                           _vocab(pair))


def _vocab(pair) -> int:
    """The vocabulary the target verifies over (logits are cut to it when the two models pad theirs)."""
    return pair.vocab_size or pair.target.config.vocab_size


def _nasd(pair, p: DecodeParams):
    drafter = NgramDrafter(p.ngram_n, p.ngram_storage, p.top_k_filler, pair.device)
    return (TreeDrafter(drafter), _tree_policy(p)) if p.nasd_tree else (drafter, FixedGamma(p.gamma))


def _osd_drafter(pair, p: DecodeParams) -> Drafter:
    """An online copy of the pair's feature head, shared by every osd request on this pair."""
    drafter = OnlineDrafter(online_head(pair.draft, pair.target, p.osd_lr), p.osd_steps)
    return CopyFirstDrafter(drafter, p.copy_n, pair.device) if p.copy_n else drafter


def _rest(pair, p: DecodeParams):
    store = load_datastore(p.rest_datastore) if p.rest_datastore else None
    drafter = RestDrafter(store, _vocab(pair), pair.device)
    return (TreeDrafter(drafter), _tree_policy(p)) if p.rest_tree else (drafter, FixedGamma(p.gamma))


METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    unknown = [name for name in method.params if name not in PARAMS]
    if unknown:
        raise ValueError(f"{method.name} reads {', '.join(unknown)}, which the parameter schema does not declare")
    if method.tree_switch and method.tree_switch not in method.params:
        raise ValueError(f"{method.name} turns into a tree by {method.tree_switch}, a parameter it does not read")
    METHODS[method.name] = method
    return method


def methods_reading(param: str) -> tuple[str, ...]:
    """The methods that declare `param` their own, in the registry's order; () for a parameter
    that every method reads (the schema's sampling, length, chat and target-cache settings)."""
    return tuple(name for name, method in METHODS.items() if param in method.params)


register(Method("ar", "AR", False, "the target alone, one token per forward",
                lambda pair, p: (None, FixedGamma(0)), drafts=False,
                default_on=True, color="#64748b"))
register(Method("sd", "SD", True, "the pair's draft (a model or a feature head) or a copy from the context, fixed γ",
                lambda pair, p: (_model_drafter(pair, p), FixedGamma(p.gamma)),
                params=("gamma", "copy_n", "draft_kv"),
                sweep=Sweep(("copy_n", "gamma"), "SD γ={gamma}{copy}", by_default=True, rank=0,
                            optional=("copy_n",), choice="SD (fixed γ)"),
                default_on=True, color="#7c3aed"))
register(Method("nasd", "NASD", False,
                "n-gram table drafts, fixed γ (or, with nasd_tree, a tree of its continuations)",
                lambda pair, p: _nasd(pair, p),
                params=("gamma", "ngram_n", "ngram_storage", "top_k_filler", "nasd_tree", "tree_policy",
                        "node_budget", "max_depth", "max_width", "tree_shape"),
                sweep=Sweep(("ngram_n",), "NASD n={ngram_n} (γ={gamma})", by_default=True, rank=2),
                default_on=True, color="#db2777", tree_switch="nasd_tree"))
register(Method("egag", "EGAG", True, "the pair's draft, γ from the drafter's entropy",
                lambda pair, p: (_model_drafter(pair, p), EntropyGamma(p.gamma_min, p.gamma_max, p.ema)),
                params=("gamma_min", "gamma_max", "ema", "copy_n", "draft_kv"),
                sweep=Sweep(("copy_n", "gamma_max", "ema"), "EGAG γmax/EMA {gamma_max}/{ema}{copy}",
                            by_default=True, rank=1, optional=("copy_n",)),
                adapts=True, default_on=True, color="#0e7490", varies_gamma=True))
register(Method("sd-heuristic", "SD (+2/−1)", True, "the pair's draft, transformers' +2/−1 γ schedule",
                lambda pair, p: (_model_drafter(pair, p), HeuristicGamma(p.gamma)),
                params=("gamma", "copy_n", "draft_kv"),
                sweep=Sweep((), "{label} γ={gamma}", rank=7, at_drafts=True),
                adapts=True, color="#4338ca", varies_gamma=True))
register(Method("sd-confidence", "SD (confidence)", True,
                "the pair's draft, stop drafting when its top probability < 0.4",
                lambda pair, p: (_model_drafter(pair, p), ConfidenceStop(p.gamma_max)),
                params=("gamma_max", "copy_n", "draft_kv"),
                sweep=Sweep((), "{label} (γ ≤ {gamma_max})", rank=6, at_drafts=True),
                adapts=True, color="#a16207", varies_gamma=True))
register(Method("adaedl", "AdaEDL", True, "the pair's draft up to γ_max, stopping when AdaEDL's entropy bound on "
                "the next draft's acceptance falls below λ", lambda pair, p: (
                    _model_drafter(pair, p), AdaEDLStop(p.gamma_max, p.adaedl_lambda, p.adaedl_scale)),
                params=("gamma_max", "adaedl_lambda", "adaedl_scale", "copy_n", "draft_kv"),
                sweep=Sweep(("adaedl_lambda",), "{label} λ {adaedl_lambda} (γ ≤ {gamma_max})",
                            by_default=True, rank=4, needs_values=False, at_drafts=True),
                adapts=True, varies_gamma=True))
register(Method("egag-token", "EGAG-token", True, "the pair's draft up to γ_max, stopping when a position's "
                "(smoothed) normalised entropy exceeds a threshold", lambda pair, p: (
                    _model_drafter(pair, p), TokenEntropyStop(p.gamma_max, p.entropy_stop, p.token_ema)),
                params=("gamma_max", "entropy_stop", "token_ema", "copy_n", "draft_kv"),
                sweep=Sweep(("entropy_stop",), "{label} H > {entropy_stop} (γ ≤ {gamma_max})",
                            by_default=True, rank=4, needs_values=False, at_drafts=True),
                adapts=True, varies_gamma=True))
register(Method("specdecpp", "SpecDec++", True, "the pair's draft up to γ_max, stopping when a trained head's "
                "predicted probability of a rejection so far exceeds a threshold", lambda pair, p: (
                    _model_drafter(pair, p), PredictedRejectionStop(
                        p.gamma_max, cached_acceptance_head(p.specdecpp_head or None), round_features,
                        p.specdecpp_threshold)),
                params=("gamma_max", "specdecpp_threshold", "specdecpp_head", "copy_n", "draft_kv"),
                sweep=Sweep(("specdecpp_threshold",), "{label} P(reject) > {specdecpp_threshold} (γ ≤ {gamma_max})",
                            by_default=True, rank=4, needs_values=False, at_drafts=True),
                adapts=True, varies_gamma=True))
register(Method("rest", "REST", False, "retrieval: the continuation of the longest match of the context's end in a "
                "datastore (rest_datastore) or earlier in the context, fixed γ (or, with rest_tree, a tree of "
                "its occurrences' continuations)", lambda pair, p: _rest(pair, p),
                params=("gamma", "rest_datastore", "rest_tree", "tree_policy", "node_budget", "max_depth",
                        "max_width", "tree_shape"),
                sweep=Sweep((), "{label} γ={gamma}", rank=7, at_drafts=True), tree_switch="rest_tree"))
register(Method("osd", "OSD", True, "online speculative decoding: the pair's feature head, fixed γ, distilled on the "
                "target's verified tokens after each request (off the clock), so later requests draft with what "
                "earlier ones taught", lambda pair, p: (_osd_drafter(pair, p), FixedGamma(p.gamma)),
                needs_feature_head=True,
                params=("gamma", "copy_n", "osd_lr", "osd_steps", "draft_kv"),
                sweep=Sweep((), "{label} γ={gamma}", rank=7),
                adapts=True))

register(Method("beam", "Beam search", False, "the target alone, beam search (num_beams) through transformers' "
                "generate; not greedy decoding, so its text differs from AR's",
                lambda pair, p: (None, FixedGamma(0)), lossless=False, run=run_beam, drafts=False,
                params=("num_beams",),
                baseline=True, reading="every step is one target forward over all the beams at once, and the text is "
                "beam search's most likely sequence, not greedy decoding's"))
register(Method("draft", "Draft alone", True, "the pair's draft model writing by itself, one token per forward, "
                "with its cache and the same sampling settings", lambda pair, p: (None, FixedGamma(0)),
                decoder="draft", lossless=False, drafts=False,
                params=("draft_kv",),
                baseline=True, reading="the draft model writing by itself: the speed speculation starts from and the "
                "text it would give without the target checking it"))
register(Method("ar-nocache", "AR (no cache)", False, "the target alone without a KV cache: every token "
                f"recomputes the whole prefix (at most {NOCACHE_MAX_NEW_TOKENS} new tokens)",
                lambda pair, p: (None, FixedGamma(0)), cached=False, new_tokens_cap=NOCACHE_MAX_NEW_TOKENS,
                drafts=False,
                baseline=True, reading="AR recomputing the whole prefix for every token: what the KV cache buys"))
register(Method("sd-tree", "SD-tree", True,
                "the pair's draft as a tree (dynamic or static shape), verified in one forward",
                lambda pair, p: (TreeDrafter(_plain_drafter(pair)), _tree_policy(p)),
                params=("tree_policy", "node_budget", "max_depth", "max_width", "tree_shape"),
                sweep=Sweep(("node_budget",), "SD-tree {node_budget} nodes", by_default=True, rank=3,
                            choice="SD-tree (node budgets)"), tree=True))
register(Method("egag-tree", "EGAG-tree", True, "the pair's draft as a tree: depth from the smoothed entropy, "
                "width from each node's entropy", lambda pair, p: (TreeDrafter(_plain_drafter(pair)),
                EntropyTree(p.gamma_min, p.gamma_max, p.ema, p.max_width, p.node_budget)),
                params=("gamma_min", "gamma_max", "ema", "node_budget", "max_width"), tree=True))

register(Method("adaedl-tree", "AdaEDL-tree", True, "the pair's draft as a dynamic tree, a node's children dropped "
                "where AdaEDL's bound on their acceptance falls below λ", lambda pair, p: _stop_rule_tree(
                    pair, p, AdaEDLStop(p.max_depth, p.adaedl_lambda, p.adaedl_scale)),
                params=("adaedl_lambda", "adaedl_scale", "node_budget", "max_depth", "max_width"),
                sweep=Sweep(("adaedl_lambda",), "{label} λ {adaedl_lambda} ({node_budget} nodes)",
                            rank=5, needs_values=False),
                adapts=True, tree=True))
register(Method("egag-token-tree", "EGAG-token-tree", True, "the pair's draft as a dynamic tree, a node's children "
                "dropped where its normalised entropy exceeds a threshold", lambda pair, p: _stop_rule_tree(
                    pair, p, TokenEntropyStop(p.max_depth, p.entropy_stop)),
                params=("entropy_stop", "node_budget", "max_depth", "max_width"),
                sweep=Sweep(("entropy_stop",), "{label} H > {entropy_stop} ({node_budget} nodes)",
                            rank=5, needs_values=False),
                adapts=True, tree=True))



def _register_drafter_modules() -> None:
    """Import every module of the drafters' package, so that a drafter whose module registers its own
    method (a new drafter is one new module) is in the registry before anything reads it."""
    from . import drafters

    for module in pkgutil.iter_modules(drafters.__path__):
        importlib.import_module(f"{drafters.__name__}.{module.name}")


_register_drafter_modules()
REFERENCE = "ar"  # the method every other is measured against and, under greedy decoding, must equal
# The methods the product's story names (the sweep's verdict, its charts' lines), each named here once.
FIXED_GAMMA = "sd"  # speculative decoding at a fixed γ: the drafting method the adaptive ones are judged against
ENTROPY_GAMMA = "egag"  # γ of each round from the drafter's entropy
TABLE_DRAFTING = "nasd"  # an n-gram table drafts instead of a model
DEFAULT_METHODS = tuple(name for name, method in METHODS.items() if method.default_on)
BASELINES = tuple(name for name, method in METHODS.items() if method.baseline)
SWEPT = tuple(name for name, method in METHODS.items() if method.sweep is not None)


def get_method(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return METHODS[name]


def is_lossless(name: str) -> bool:
    """Whether greedy runs of this method must equal AR's (names outside the registry, e.g.
    transformers' own greedy generate, are taken to be)."""
    return METHODS[name].lossless if name in METHODS else True


def matches_reference(tokens: list[int], params: dict, reference: list[int]) -> bool:
    """Whether a greedy output is AR's: the whole of it, or its first max_new_tokens when the
    method ran fewer tokens than AR (a capped `ar-nocache`)."""
    limit = params.get("max_new_tokens")
    return tokens == (reference[:limit] if isinstance(limit, int) else reference)


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
