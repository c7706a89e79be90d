"""The sweep's grid: a `Setting` is one point (a method and the values that apply to it),
and `expand_grid` turns lists of values into the settings a sweep runs, AR first, each
validated against the parameter schema before any model runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import pandas as pd

from ...engine.methods import BASELINES, METHODS
from ...engine.params import PARAMS, DecodeParams
from ...models.torch_copy import TORCH_COPY, TORCH_COPY_AR

SWEEP_METHODS = ("sd", "egag", "nasd", "sd-tree", "adaedl", "egag-token", "specdecpp", "sd-confidence", "sd-heuristic",
                 "rest", "osd", "adaedl-tree", "egag-token-tree")
# The methods that set their draft length as they go, against which the best fixed γ is judged.
ADAPTIVE_METHODS = ("egag", "adaedl", "egag-token", "specdecpp", "sd-confidence", "sd-heuristic", "osd",
                    "adaedl-tree", "egag-token-tree")
# Each per-token rule's threshold: the grid's axis and the parameter it sets.
STOP_AXES = {"adaedl": "adaedl_lambda", "egag-token": "entropy_stop", "specdecpp": "specdecpp_threshold"}
# The rules' trees, on their chain rule's axis; swept only when named (a threshold alone picks the chains).
TREE_STOP_AXES = {"adaedl-tree": "adaedl_lambda", "egag-token-tree": "entropy_stop"}
RULE_AXES = {**STOP_AXES, **TREE_STOP_AXES}  # every rule, chain or tree, and its threshold's axis
DEFAULT_STOP_CAP = 8  # the per-token rules draft at most this many tokens a round
DEFAULT_GAMMAS = (1, 2, 3, 4, 6, 8)
DEFAULT_GAMMA_MAXES = (2, 4, 6, 8)
DEFAULT_EMAS = (0.0, 0.5, 0.9)
DEFAULT_NGRAM_NS = (2, 3, 4)
SETTING_COLUMNS = ["gamma", "gamma_max", "ema", "ngram_n", "copy_n", "node_budget", *STOP_AXES.values()]


def fmt(value: Any) -> str:
    """A setting value as people write it: 3 not 3.0, 0.9 not 0.900."""
    if value is None or pd.isna(value):
        return ""
    return f"{float(value):g}"


@dataclass(frozen=True)
class Setting:
    """One grid point: a method and the values of the settings that apply to it (others None)."""

    method: str
    gamma: int | None = None
    gamma_max: int | None = None
    ema: float | None = None
    ngram_n: int | None = None
    copy_n: int | None = None  # SD and EGAG: None leaves the parameter's default
    gamma_min: int | None = None  # EGAG's floor, fixed over the grid
    node_budget: int | None = None  # SD-tree: the most nodes a round drafts
    adaedl_lambda: float | None = None
    entropy_stop: float | None = None
    specdecpp_threshold: float | None = None

    @property
    def key(self) -> str:
        """A stable name for grouping, e.g. 'egag:gamma_max=6,ema=0.9'."""
        values = ",".join(f"{c}={fmt(getattr(self, c))}" for c in SETTING_COLUMNS if getattr(self, c) is not None)
        return f"{self.method}:{values}" if values else self.method

    @property
    def label(self) -> str:
        if self.method == "sd":
            return f"SD γ={self.gamma}{copy_phrase(self.copy_n, ', ')}"
        if self.method == "egag":
            return f"EGAG γmax/EMA {self.gamma_max}/{fmt(self.ema)}{copy_phrase(self.copy_n, ', ')}"
        if self.method == "nasd":
            return f"NASD n={self.ngram_n} (γ={self.gamma})"
        if self.method == "sd-tree":
            return f"SD-tree {self.node_budget} nodes"
        if self.method in RULE_AXES:
            symbol = {"adaedl": "λ", "egag-token": "H >", "specdecpp": "P(reject) >"}[self.method.removesuffix("-tree")]
            value = getattr(self, RULE_AXES[self.method])
            bound = f"γ ≤ {self.gamma_max}" if self.method in STOP_AXES else f"{PARAMS['node_budget'].default} nodes"
            return f"{self.method_label} {symbol} {fmt(value)} ({bound})"
        if self.method in ("rest", "sd-heuristic", "osd"):
            return f"{self.method_label} γ={self.gamma}"
        if self.method == "sd-confidence":
            return f"{self.method_label} (γ ≤ {self.gamma_max})"
        return self.method_label

    @property
    def method_label(self) -> str:
        if self.method == TORCH_COPY_AR:
            return f"AR ({TORCH_COPY})"
        return METHODS[self.method].label if self.method in METHODS else self.method

    def params(self) -> dict[str, Any]:
        """The decode parameters this setting sets, for `specdemo.generate(pair, ids, method, **params)`."""
        names = (*SETTING_COLUMNS, "gamma_min")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def values(self) -> dict[str, Any]:
        """The setting columns of a row: None where the setting does not apply."""
        return {name: getattr(self, name) for name in SETTING_COLUMNS}


AR = Setting("ar")
# AR on the torch copy of a runtime target: run beside AR where a setting runs on that copy (a tree the runtime
# cannot verify), as the reference of those settings (`models.torch_copy`).
TORCH_COPY_AR_SETTING = Setting(TORCH_COPY_AR)


def copy_phrase(copy_n: Any, before: str = "") -> str:
    """How a setting copies from the context, for labels: "" when the sweep leaves copy_n at its default."""
    if copy_n is None or pd.isna(copy_n):
        return ""
    return f"{before}no copy" if int(copy_n) == 0 else f"{before}copy n={int(copy_n)}"


def _values(name: str, values: Iterable | str | None) -> list:
    if values is None:
        return []
    if isinstance(values, str):
        values = [v for v in values.split(",") if v.strip()]
    elif not isinstance(values, Iterable):
        values = [values]
    out = []
    for value in values:
        number = float(value)
        keep_float = name == "ema" or name in STOP_AXES.values()
        out.append(number if keep_float else int(number) if number.is_integer() else number)
    return list(dict.fromkeys(out))


def expand_grid(
    gamma: Iterable[int] | str | None = DEFAULT_GAMMAS,
    gamma_max: Iterable[int] | str | None = DEFAULT_GAMMA_MAXES,
    ema: Iterable[float] | str | None = DEFAULT_EMAS,
    ngram_n: Iterable[int] | str | None = None,
    methods: str | Sequence[str] | None = None,
    copy_n: Iterable[int] | str | None = None,
    node_budget: Iterable[int] | str | None = None,
    adaedl_lambda: Iterable[float] | str | None = None,
    entropy_stop: Iterable[float] | str | None = None,
    specdecpp_threshold: Iterable[float] | str | None = None,
    *,
    gamma_min: int = 1,
    nasd_gamma: int = PARAMS["gamma"].default,
    stop_cap: int = DEFAULT_STOP_CAP,
) -> list[Setting]:
    """AR, then SD at each γ, EGAG at each (γ_max, EMA) with γ_min fixed, NASD at each n
    (with γ = nasd_gamma), SD-tree at each node budget (its other tree parameters as the
    shared decoding parameters say), and each per-token rule (adaedl, egag-token, specdecpp) at
    each of its thresholds with at most `stop_cap` drafts a round. Values may be lists or
    comma-separated strings ("1,2,4"). With copy_n values, SD's and EGAG's settings are repeated
    for each (0 = no copying); without, they copy as the parameter's default says.

    methods picks among SWEEP_METHODS (AR always runs), and may add the baselines (beam, draft,
    ar-nocache), each run once per prompt as a reference; by default every method whose grid is
    given (NASD only when ngram_n is). A per-token rule picked without its thresholds runs at
    its parameter's default; the rules' trees (adaedl-tree, egag-token-tree) run only when named,
    on their rule's thresholds; sd-confidence (γ ≤ stop_cap), sd-heuristic, rest and osd (γ =
    nasd_gamma) have no grid (osd's head learns across the sweep's requests, in their order).
    Every setting is validated here, so a bad value fails before any model runs.
    """
    grids = {name: _values(name, values) for name, values in (
        ("gamma", gamma), ("gamma_max", gamma_max), ("ema", ema), ("ngram_n", ngram_n), ("node_budget", node_budget),
        ("adaedl_lambda", adaedl_lambda), ("entropy_stop", entropy_stop),
        ("specdecpp_threshold", specdecpp_threshold))}
    chosen = _chosen_methods(methods, grids)
    copies = _values("copy_n", copy_n) or [None]
    settings = [AR]
    if "sd" in chosen:
        settings += [Setting("sd", gamma=g, copy_n=c) for c in copies for g in grids["gamma"]]
    if "egag" in chosen:
        settings += [Setting("egag", gamma_max=g, ema=e, gamma_min=gamma_min, copy_n=c)
                     for c in copies for g in grids["gamma_max"] for e in grids["ema"]]
    if "nasd" in chosen:
        settings += [Setting("nasd", gamma=nasd_gamma, ngram_n=n) for n in grids["ngram_n"]]
    if "sd-tree" in chosen:
        settings += [Setting("sd-tree", node_budget=b) for b in grids["node_budget"]]
    settings += _adaptive_settings(chosen, grids, stop_cap, nasd_gamma)
    # Baselines have no grid: each runs once per prompt, a reference beside AR.
    settings += [Setting(name) for name in chosen if name in BASELINES]
    for setting in settings:
        try:
            DecodeParams.from_values(**setting.params())
        except ValueError as error:
            raise ValueError(f"sweep grid, {setting.label}: {error}") from None
    return settings


def _chosen_methods(methods, grids: dict[str, list]) -> list[str]:
    """The methods to sweep: those asked (validated), or by default each whose grid is given."""
    if methods is None:
        given = {"sd": grids["gamma"], "egag": grids["gamma_max"] and grids["ema"], "nasd": grids["ngram_n"],
                 "sd-tree": grids["node_budget"], **{m: grids[axis] for m, axis in STOP_AXES.items()}}
        return [m for m, ok in given.items() if ok]
    names = methods.split(",") if isinstance(methods, str) else list(methods)
    chosen = list(dict.fromkeys(n.strip().lower() for n in names if n and n.strip() and n.strip().lower() != "ar"))
    unknown = [n for n in chosen if n not in SWEEP_METHODS and n not in BASELINES]
    if unknown:
        raise ValueError(f"sweep methods: unknown {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join(SWEEP_METHODS)} (AR always runs), or the baselines "
                         f"{', '.join(BASELINES)} (run once each, beside AR)")
    missing = {"sd": ("gamma", grids["gamma"]), "egag": ("gamma_max and ema", grids["gamma_max"] and grids["ema"]),
               "nasd": ("ngram_n", grids["ngram_n"]), "sd-tree": ("node_budget", grids["node_budget"])}
    empty = [f"{m} needs {missing[m][0]}" for m in chosen if m in missing and not missing[m][1]]
    if empty:
        raise ValueError("sweep grid: " + "; ".join(empty))
    return chosen


def _adaptive_settings(chosen: list[str], grids: dict[str, list], stop_cap: int, gamma: int) -> list[Setting]:
    """The per-token rules at each threshold (their parameter's default when none is given), then
    the rules without a grid."""
    settings = []
    for method, axis in RULE_AXES.items():
        if method in chosen:
            values = grids[axis] or [PARAMS[axis].default] if axis in PARAMS else grids[axis]
            cap = {"gamma_max": stop_cap} if method in STOP_AXES else {}  # a tree is bounded by its node budget
            settings += [Setting(method, **cap, **{axis: v}) for v in values]
    if "sd-confidence" in chosen:
        settings.append(Setting("sd-confidence", gamma_max=stop_cap))
    settings += [Setting(m, gamma=gamma) for m in ("sd-heuristic", "rest", "osd") if m in chosen]
    return settings
