"""Decoding parameters: each declared once, with its type, default, range and help text;
which methods read one is declared by the methods themselves (`Method.params` in the
registry). Validation here, `DecodeParams`' fields and the CLI flags, the page's controls and
the API endpoints' parameters are all generated from `SCHEMA`.

Engine options (`ENGINE_SCHEMA`: the KV cache kind and graph compilation) are declared the
same way but kept apart: they choose how the tokens are computed, never which tokens come
out, so they are not part of a run's `DecodeParams` (nor of its recorded params).

Every check raises `ValueError` naming the field and what it accepts, so each front
end can show the message as it is.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from .targets.kv_policy import DEFAULT_SINKS, KV_POLICIES, check_policy
from .sampling import SamplingConfig

NGRAM_STORAGES = ("basic", "onelevel")
# A hard ceiling for any caller; public deployments set a lower one (see specdemo.app.limits).
MAX_NEW_TOKENS_LIMIT = 4096


@dataclass(frozen=True)
class Param:
    """One decoding parameter as every front end sees it."""

    name: str
    kind: type  # int, float, str or bool
    default: Any
    help: str
    label: str  # the page's label
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the bound itself is refused
    high_open: bool = False
    choices: tuple[str, ...] | None = None
    optional: bool = False  # None (empty) is allowed and means "pick one"
    allowed: str = ""  # how an error states what is accepted
    slider: tuple[float, float, float] | None = None  # the page's (min, max, step) when shown as a slider

    def describe_allowed(self) -> str:
        if self.allowed:
            return self.allowed
        if self.kind is int:
            return f"an integer from {self.low:g} to {self.high:g}" if self.high is not None else f"an integer ≥ {self.low:g}"
        return "a number"

    def check(self, value: Any) -> None:
        name, allowed = self.name, self.describe_allowed()
        if value is None and self.optional:
            return
        if self.choices is not None:
            if value not in self.choices:
                raise ValueError(f"{name} must be one of {', '.join(self.choices)}, got {value!r}")
            return
        if self.kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be true or false, got {value!r}")
            return
        if self.kind is str:
            if not isinstance(value, str):
                raise ValueError(f"{name} must be {allowed}, got {value!r}")
            if self.name == "tree_shape":
                parse_shape(value)
            return
        if self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be {allowed}, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be {allowed}, got {value!r}")
        low_bad = self.low is not None and (value <= self.low if self.low_open else value < self.low)
        high_bad = self.high is not None and (value >= self.high if self.high_open else value > self.high)
        if low_bad or high_bad:
            raise ValueError(f"{name} must be {allowed}, got {value}")


_GAMMA = dict(low=1, high=64, allowed="an integer from 1 to 64")
TREE_POLICIES = ("dynamic", "static")
MAX_TREE_WIDTH = 16


def parse_shape(spec: str) -> tuple[int, ...]:
    """'3,2,1,1' → (3, 2, 1, 1): a static tree's children per node at each depth (ValueError if malformed)."""
    try:
        shape = tuple(int(part) for part in str(spec).replace(" ", "").split(","))
    except ValueError:
        shape = ()
    if not shape or any(not 1 <= w <= MAX_TREE_WIDTH for w in shape) or len(shape) > 64:
        raise ValueError(f"tree_shape must be children per depth, integers from 1 to {MAX_TREE_WIDTH} separated by "
                         f"commas (e.g. 3,2,1,1), at most 64 depths; got {spec!r}")
    return shape

SCHEMA: tuple[Param, ...] = (
    Param("max_new_tokens", int, 128, "stop after this many new tokens", "Max new tokens",
          low=1, high=MAX_NEW_TOKENS_LIMIT, slider=(1, 1024, 1)),
    Param("temperature", float, 0.0, "sampling temperature (0 = greedy)", "Temperature (0 = greedy)",
          low=0.0, allowed="a number ≥ 0 (0 = greedy)", slider=(0.0, 2.0, 0.05)),
    Param("top_k", int, 0, "keep the k most likely tokens (0 = off)", "Top-k (0 = off)",
          low=0, allowed="an integer ≥ 0 (0 = off)"),
    Param("top_p", float, 1.0, "nucleus sampling mass (1 = off)", "Top-p (1 = off)",
          low=0.0, high=1.0, low_open=True, allowed="a number in (0, 1] (1 = off)", slider=(0.05, 1.0, 0.01)),
    Param("seed", int, None, "random seed (sampling); the same seed gives the same run",
          "Seed (empty = random)", low=0, high=2**63 - 1, optional=True, allowed="an integer ≥ 0 or empty"),
    Param("gamma", int, 3, "draft length γ", "SD / NASD: γ (draft length)", **_GAMMA),
    Param("gamma_min", int, 1, "smallest γ (egag-tree: smallest depth)", "EGAG: γ min", **_GAMMA),
    Param("gamma_max", int, 4, "largest γ (egag-tree: largest depth)", "EGAG: γ max", **_GAMMA),
    Param("ema", float, 0.9, "entropy smoothing β (0 = none)", "EGAG: entropy EMA β",
          low=0.0, high=1.0, high_open=True, allowed="a number in [0, 1) (0 = no smoothing)", slider=(0.0, 0.99, 0.01)),
    Param("adaedl_lambda", float, 0.5, "AdaEDL: stop drafting once the bound 1 − √(scale·H) on the next draft's "
          "acceptance falls below λ", "AdaEDL: λ (stop below this bound)", low=0.0, high=1.0,
          allowed="a number in [0, 1]", slider=(0.0, 1.0, 0.05)),
    # 0.1: on the embedded pair's training traces, 1 − √(0.1·H) is near the observed acceptance (docs/adaptive-drafting.md).
    Param("adaedl_scale", float, 0.1, "AdaEDL: the scale of the entropy (in nats) under the square root",
          "AdaEDL: entropy scale", low=0.0, low_open=True, allowed="a number > 0", slider=(0.05, 4.0, 0.05)),
    Param("entropy_stop", float, 0.25, "EGAG per token: stop drafting once a position's normalised entropy "
          "(smoothed by token_ema) exceeds this", "EGAG-token: entropy threshold",
          low=0.0, high=1.0, allowed="a number in [0, 1]", slider=(0.0, 1.0, 0.01)),
    Param("token_ema", float, 0.0, "EGAG per token: smoothing β of the entropy along a round (0 = none)",
          "EGAG-token: entropy EMA β", low=0.0, high=1.0, high_open=True,
          allowed="a number in [0, 1) (0 = no smoothing)", slider=(0.0, 0.99, 0.01)),
    Param("specdecpp_threshold", float, 0.5, "SpecDec++: stop drafting before the draft that lifts the predicted "
          "probability of a rejection so far above this", "SpecDec++: rejection threshold",
          low=0.0, high=1.0, allowed="a number in [0, 1]", slider=(0.0, 1.0, 0.05)),
    Param("specdecpp_head", str, "", "SpecDec++: a folder with an acceptance head (python -m "
          "specdemo.training.specdecpp); empty = the one shipped for the embedded pair", "SpecDec++: head folder",
          allowed="a folder, or empty"),
    Param("ngram_n", int, 3, "n of the n-gram table", "NASD: n of the n-gram table", low=2, high=16),
    Param("ngram_storage", str, "basic", "the table's contexts: basic = lengths n−1 down to 1, onelevel = n−1 only",
          "NASD: table kind", choices=NGRAM_STORAGES),
    Param("top_k_filler", int, 3, "target top-k predictions added to the table per verified position",
          "NASD: top-k filler from the target", low=0, high=64),
    Param("copy_n", int, 4, "copy from the context when its last n−1 tokens occurred before (0 = off)",
          "SD / EGAG: copy from the context (n; 0 = off)", low=0, high=16,
          allowed="0 (off) or an integer from 2 to 16"),
    Param("rest_datastore", str, "", "REST: a datastore file (python -m specdemo.bench.rest build CORPUS OUT); "
          "empty = match the context alone", "REST: datastore file", allowed="a path to a datastore, or empty"),
    # 2e-5: on a 50-prompt stream 1e-4 pulled the head off its offline optimum (docs/adaptive-drafting.md).
    Param("osd_lr", float, 2e-5, "OSD: the online head's learning rate (Adam) between requests",
          "OSD: learning rate", low=0.0, high=1.0, low_open=True, allowed="a number in (0, 1]"),
    Param("osd_steps", int, 2, "OSD: distillation steps on each finished request's verified tokens (0 = frozen)",
          "OSD: steps per request", low=0, high=64),
    Param("rest_tree", bool, False, "draft a tree of the match's continuations instead of a chain",
          "REST: draft a tree"),
    Param("num_beams", int, 4, "beams kept by beam search", "Beam: number of beams", low=1, high=16),
    Param("nasd_tree", bool, False, "draft a tree of the table's continuations instead of a chain",
          "NASD: draft a tree"),
    Param("tree_policy", str, "dynamic", "how the tree grows: dynamic = max_width children per node to max_depth, "
          "the most probable nodes first; static = tree_shape", "Tree: policy", choices=TREE_POLICIES),
    # 3: the most nodes a CPU verifies for about one forward's cost (docs/trees.md); a GPU affords more.
    Param("node_budget", int, 3, "most drafted nodes in a tree (the target verifies them all in one forward)",
          "Tree: node budget", low=1, high=64, allowed="an integer from 1 to 64"),
    Param("max_depth", int, 5, "deepest a dynamic tree grows", "Tree: max depth",
          low=1, high=64, allowed="an integer from 1 to 64"),
    Param("max_width", int, 3, "most children per node (dynamic and entropy-guided trees)", "Tree: max width",
          low=1, high=MAX_TREE_WIDTH, allowed=f"an integer from 1 to {MAX_TREE_WIDTH}"),
    Param("tree_shape", str, "3,2,1,1", "a static tree's children per node at each depth", "Tree: static shape",
          allowed="children per depth separated by commas, e.g. 3,2,1,1"),
    Param("chat", bool, False, "wrap the prompt in the chat template (instruct models)", "Chat template"),
    # KV-cache policies (kv_policy.py): on the draft's cache lossless, on the target's not.
    Param("draft_kv", str, "full", "the draft model's KV cache: full, streaming (sinks + recent window), l2 "
          "(smallest key norms) or head (per head, the positions that drew the most attention); lossless, the target "
          "still verifies", "Draft KV cache", choices=KV_POLICIES),
    Param("target_kv", str, "full", "the target's KV cache: full, streaming, l2 or head; anything but full changes the "
          "output (the run is then not lossless)", "Target KV cache", choices=KV_POLICIES),
    Param("kv_budget", int, 256, "positions a streaming, l2 or head cache keeps (per KV head and layer)", "KV budget (positions)",
          low=1, high=2**20, allowed="an integer ≥ 1"),
    Param("kv_sinks", int, DEFAULT_SINKS, "first positions a streaming, l2 or head cache always keeps (attention sinks)",
          "KV sinks", low=0, high=1024, allowed="an integer from 0 to 1024"),
)
PARAMS: dict[str, Param] = {p.name: p for p in SCHEMA}


def schema_dataclass(name: str, schema: tuple[Param, ...], base: type, doc: str) -> type:
    """A frozen dataclass with one field per parameter of `schema`, in its order, each defaulting to
    the schema's default, and `base`'s methods. Named as if defined here, so that pickle finds it
    (a cluster's worker receives a run's parameters)."""
    return dataclasses.make_dataclass(
        name, [(spec.name, spec.kind | None if spec.optional else spec.kind, dataclasses.field(default=spec.default))
               for spec in schema],
        bases=(base,), frozen=True, namespace={"__module__": __name__, "__qualname__": name, "__doc__": doc})


class _DecodeParamsMethods:
    @classmethod
    def from_values(cls, **values: Any) -> "DecodeParams":
        """Coerce loosely typed values (strings from a form or a command line) and validate."""
        unknown = sorted(set(values) - set(PARAMS))
        if unknown:
            raise ValueError(f"unknown parameter(s): {', '.join(unknown)}; allowed: {', '.join(PARAMS)}")
        coerced = {}
        for name, value in values.items():
            if value is None:
                continue  # keep the default
            coerced[name] = _coerce(PARAMS[name], value)
        return cls(**coerced)

    @classmethod
    def resolve(cls, params: "DecodeParams | None" = None, **values: Any) -> "DecodeParams":
        """`params` as given (validated already), with any loose `values` laid over it."""
        if params is None:
            return cls.from_values(**values)
        if not isinstance(params, DecodeParams):
            raise ValueError(f"params must be a DecodeParams, got {type(params).__name__}")
        return cls.from_values(**{**params.as_dict(), **values}) if values else params

    def __post_init__(self) -> None:
        for spec in SCHEMA:
            spec.check(getattr(self, spec.name))
        if self.gamma_min > self.gamma_max:
            raise ValueError(f"gamma_min ({self.gamma_min}) must not exceed gamma_max ({self.gamma_max})")
        if self.copy_n == 1:
            raise ValueError(f"copy_n must be {PARAMS['copy_n'].allowed}, got 1 (a context needs a token or more)")
        check_policy(self.draft_kv, self.kv_budget, self.kv_sinks, "draft_kv")
        check_policy(self.target_kv, self.kv_budget, self.kv_sinks, "target_kv")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def as_dict(self) -> dict[str, Any]:
        # Every field is a scalar or a string: a shallow copy is asdict's result without its recursion.
        return {name: getattr(self, name) for name in PARAMS}

    def replace(self, **changes: Any) -> "DecodeParams":
        return dataclasses.replace(self, **changes)


DecodeParams = schema_dataclass("DecodeParams", SCHEMA, _DecodeParamsMethods,
                                "A validated set of decoding parameters: one field per parameter of `SCHEMA`.")


def _coerce(spec: Param, value: Any) -> Any:
    name, kind = spec.name, spec.kind
    try:
        if kind is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return bool(value)
        if kind is int:
            if isinstance(value, str) and value.strip() == "" and spec.optional:
                return None
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if kind is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value)
    except (TypeError, ValueError, OverflowError):
        what = "true or false" if kind is bool else "an integer" if kind is int else "a number"
        raise ValueError(f"{name} must be {what}, got {value!r}") from None


# ---------------------------------------------------------------------------------------
# Engine options: how the target and drafter run, never which tokens come out.

CACHE_CHOICES = ("auto", "static", "dynamic")
COMPILING_NOTE = "compiling…"  # what a front end shows between pressing Run and the first round, with compile on

ENGINE_SCHEMA: tuple[Param, ...] = (
    Param("cache", str, "auto",
          "KV cache: static preallocates every position and rolls back by moving an index, dynamic grows by "
          "concatenation; auto = static on CUDA (and whenever compile is on), dynamic elsewhere",
          "KV cache", choices=CACHE_CHOICES),
    Param("compile", bool, False,
          "compile the decode steps with torch.compile (CUDA graphs on a GPU; needs the static cache); "
          "compile and warm-up time is reported on its own, never in tokens/s",
          "Compile decode steps (torch.compile)"),
)
ENGINE_PARAMS: dict[str, Param] = {p.name: p for p in ENGINE_SCHEMA}


class _EngineOptionsMethods:
    @classmethod
    def from_values(cls, **values: Any) -> "EngineOptions":
        """Coerce loosely typed values (a form, a command line; None keeps the default) and validate."""
        unknown = sorted(set(values) - set(ENGINE_PARAMS))
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(unknown)}; allowed: {', '.join(ENGINE_PARAMS)}")
        return cls(**{name: _coerce(ENGINE_PARAMS[name], value) for name, value in values.items()
                      if value is not None})

    def __post_init__(self) -> None:
        for spec in ENGINE_SCHEMA:
            spec.check(getattr(self, spec.name))
        if self.compile and self.cache == "dynamic":
            raise ValueError("compile: graph capture needs the static cache; use cache='static' or 'auto'")

    def cache_for(self, device) -> str:
        """The concrete cache kind on `device`: "static" or "dynamic"."""
        if self.cache != "auto":
            return self.cache
        if self.compile:
            return "static"
        from .targets.lm import default_cache_kind  # lm loads transformers; validation alone does not need it

        return default_cache_kind(device)

    @property
    def first_round_note(self) -> str | None:
        """What to show before the first round arrives: compiling takes a while the first time."""
        return COMPILING_NOTE if self.compile else None

    def as_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `generate`, `iter_generate`, `run_comparison` and `run_benchmark`."""
        return {name: getattr(self, name) for name in ENGINE_PARAMS}


EngineOptions = schema_dataclass("EngineOptions", ENGINE_SCHEMA, _EngineOptionsMethods,
                                 "Validated engine options: one field per option of `ENGINE_SCHEMA`.")
