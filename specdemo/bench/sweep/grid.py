"""The sweep's grid: a `Setting` is one point (a method and the values that apply to it),
and `expand_grid` turns lists of values into the settings a sweep runs, AR first, each
validated against the parameter schema before any model runs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import pandas as pd

from ...engine.methods import BASELINES, METHODS, REFERENCE, SWEPT, Method
from ...engine.params import PARAMS, DecodeParams
from ...models.torch_copy import TORCH_COPY, TORCH_COPY_AR

# Every method with a sweep entry, in the order its settings come in a grid.
SWEEP_METHODS = tuple(sorted(SWEPT, key=lambda name: METHODS[name].sweep.rank))
# The methods that set their draft length as they go, against which the best fixed γ is judged.
ADAPTIVE_METHODS = tuple(name for name in SWEEP_METHODS if METHODS[name].adapts)
DEFAULT_STOP_CAP = 8  # the per-token rules draft at most this many tokens a round
DEFAULT_GAMMAS = (1, 2, 3, 4, 6, 8)
DEFAULT_GAMMA_MAXES = (2, 4, 6, 8)
DEFAULT_EMAS = (0.0, 0.5, 0.9)
DEFAULT_NGRAM_NS = (2, 3, 4)
# The draft lengths and the table's n lead a sweep's columns; every other axis follows in the grid's order.
LEADING_COLUMNS = ("gamma", "gamma_max", "ema", "ngram_n", "copy_n", "node_budget")
_AXES = [axis for name in SWEEP_METHODS for axis in METHODS[name].sweep.axes]
SETTING_COLUMNS = [*(c for c in LEADING_COLUMNS if c in _AXES),
                   *dict.fromkeys(a for a in _AXES if a not in LEADING_COLUMNS)]


def fmt(value: Any) -> str:
    """A setting value as people write it: 3 not 3.0, 0.9 not 0.900."""
    if value is None or pd.isna(value):
        return ""
    return f"{float(value):g}"


@dataclass(frozen=True, init=False)
class Setting:
    """One grid point: a method and the values of the parameters the sweep sets for it (others None).

    `Setting("sd", gamma=3)`; any parameter of the schema reads as an attribute (`setting.gamma`, None when
    the point leaves it unset)."""

    method: str
    settings: tuple[tuple[str, Any], ...]

    def __init__(self, method: str, **values: Any):
        unknown = [name for name in values if name not in PARAMS]
        if unknown:
            raise TypeError(f"Setting: {', '.join(unknown)} is not a decoding parameter")
        order = list(PARAMS)
        kept = sorted(((n, v) for n, v in values.items() if v is not None), key=lambda item: order.index(item[0]))
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "settings", tuple(kept))

    def __getattr__(self, name: str) -> Any:
        if name in PARAMS:
            return dict(self.settings).get(name)
        raise AttributeError(name)

    @property
    def key(self) -> str:
        """A stable name for grouping, e.g. 'egag:gamma_max=6,ema=0.9'."""
        values = ",".join(f"{c}={fmt(getattr(self, c))}" for c in SETTING_COLUMNS if getattr(self, c) is not None)
        return f"{self.method}:{values}" if values else self.method

    @property
    def label(self) -> str:
        method = METHODS.get(self.method)
        if method is None or method.sweep is None:
            return self.method_label
        return method.sweep.label.format_map(_LabelFields(self))

    @property
    def method_label(self) -> str:
        if self.method == TORCH_COPY_AR:
            return f"AR ({TORCH_COPY})"
        return METHODS[self.method].label if self.method in METHODS else self.method

    def params(self) -> dict[str, Any]:
        """The decode parameters this setting sets, for `specdemo.generate(pair, ids, method, **params)`."""
        return dict(self.settings)

    def values(self) -> dict[str, Any]:
        """The setting columns of a row: None where the setting does not apply."""
        return {name: getattr(self, name) for name in SETTING_COLUMNS}


class _LabelFields(dict):
    """What a sweep label's fields read: a parameter's value as people write it (its default where the
    point leaves it unset), {label} the method's label and {copy} how it copies from the context."""

    def __init__(self, setting: Setting):
        super().__init__(label=setting.method_label, copy=copy_phrase(setting.copy_n, ", "))
        self.setting = setting

    def __missing__(self, name: str) -> str:
        value = getattr(self.setting, name)
        return fmt(PARAMS[name].default if value is None else value)


AR = Setting(REFERENCE)
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
        keep_float = PARAMS[name].kind is float
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
    **axes: Iterable | str | None,
) -> list[Setting]:
    """AR, then every chosen method at each point of its axes (its registry entry's `Sweep`): SD at each
    γ, EGAG at each (γ_max, EMA) with γ_min fixed, NASD at each n (with γ = nasd_gamma), SD-tree at each
    node budget, each per-token rule at each of its thresholds with at most `stop_cap` drafts a round.
    A method's parameters that are not its axes are fixed over the grid: γ at nasd_gamma, γ_max at
    stop_cap, γ_min at gamma_min. Values may be lists or comma-separated strings ("1,2,4"); `axes` gives
    any other method's axis by its parameter's name. With copy_n values, SD's and EGAG's settings are
    repeated for each (0 = no copying); without, they copy as the parameter's default says.

    methods picks among SWEEP_METHODS (AR always runs), and may add the baselines (beam, draft,
    ar-nocache), each run once per prompt as a reference; by default every method swept by default
    whose axes are given. A method whose axes have defaults (the per-token rules) runs at its
    parameter's default when picked without values; the rules' trees run only when named; methods
    without axes (sd-confidence, sd-heuristic, rest, osd) run once. Every setting is validated here,
    so a bad value fails before any model runs.
    """
    given = {"gamma": gamma, "gamma_max": gamma_max, "ema": ema, "ngram_n": ngram_n, "copy_n": copy_n,
             "node_budget": node_budget, "adaedl_lambda": adaedl_lambda, "entropy_stop": entropy_stop,
             "specdecpp_threshold": specdecpp_threshold, **axes}
    unknown = [name for name in given if name not in SETTING_COLUMNS and given[name] is not None]
    if unknown:
        raise ValueError(f"sweep grid: no method is swept over {', '.join(unknown)}; the axes are "
                         f"{', '.join(SETTING_COLUMNS)}")
    grids = {name: _values(name, given.get(name)) for name in SETTING_COLUMNS}
    fixed = {"gamma": nasd_gamma, "gamma_max": stop_cap, "gamma_min": gamma_min}
    chosen = _chosen_methods(methods, grids)
    settings = [AR]
    for name in chosen:
        if name in SWEEP_METHODS:
            settings += _method_settings(METHODS[name], grids, fixed)
    # Baselines have no grid: each runs once per prompt, a reference beside AR.
    settings += [Setting(name) for name in chosen if name in BASELINES]
    for setting in settings:
        try:
            DecodeParams.from_values(**setting.params())
        except ValueError as error:
            raise ValueError(f"sweep grid, {setting.label}: {error}") from None
    return settings


def _method_settings(method: Method, grids: dict[str, list], fixed: dict[str, Any]) -> list[Setting]:
    """One method's points: its axes crossed in their order, its other fixed parameters set."""
    sweep = method.sweep
    constant = {name: value for name, value in fixed.items() if name in method.params and name not in sweep.axes}
    values = [grids[axis] or ([None] if axis in sweep.optional else [PARAMS[axis].default]) for axis in sweep.axes]
    return [Setting(method.name, **constant, **dict(zip(sweep.axes, point))) for point in itertools.product(*values)]


def _required(method: str) -> tuple[str, ...]:
    sweep = METHODS[method].sweep
    return tuple(axis for axis in sweep.axes if axis not in sweep.optional) if sweep.needs_values else ()


def _chosen_methods(methods, grids: dict[str, list]) -> list[str]:
    """The methods to sweep, in the grid's order, then the baselines asked: those asked (validated), or by
    default each swept by default whose axes' values are given."""
    if methods is None:
        return [m for m in SWEEP_METHODS if METHODS[m].sweep.by_default
                and all(grids[axis] for axis in METHODS[m].sweep.axes if axis not in METHODS[m].sweep.optional)]
    names = methods.split(",") if isinstance(methods, str) else list(methods)
    asked = [n for n in dict.fromkeys(n.strip().lower() for n in names if n and n.strip()) if n != REFERENCE]
    unknown = [n for n in asked if n not in SWEEP_METHODS and n not in BASELINES]
    if unknown:
        raise ValueError(f"sweep methods: unknown {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join(SWEEP_METHODS)} (AR always runs), or the baselines "
                         f"{', '.join(BASELINES)} (run once each, beside AR)")
    empty = [f"{m} needs {' and '.join(_required(m))}" for m in asked
             if m in SWEEP_METHODS and not all(grids[axis] for axis in _required(m))]
    if empty:
        raise ValueError("sweep grid: " + "; ".join(empty))
    return [m for m in SWEEP_METHODS if m in asked] + [m for m in asked if m in BASELINES]
