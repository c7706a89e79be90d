"""Sweeps: speedup against γ (SD), γ_max and EMA (EGAG) and n (NASD), AR interleaved.

The question a sweep answers: where does fixed-γ SD peak, and does entropy-guided γ
(EGAG) reach that peak without tuning? Every grid point runs on the same prompts; on
each (prompt, repeat) AR and every setting run one after the other, the order rotated
one place per prompt and per repeat, so drift of a shared machine hits all alike and
every speedup is a ratio to AR on the same prompt in the same repeat.

    settings = expand_grid(gamma=[1, 2, 4], gamma_max=[4, 6], ema=[0, 0.9])
    for event in iter_sweep(pair, prompts, settings, repeats=2):   # streams
        chart = sweep_figures(summarize_sweep(event.rows))["speedup_vs_gamma"]
    result = run_sweep(pair, prompts, settings, repeats=2)         # blocks

Definitions of the row columns (one row per method, setting, prompt and repeat):
  tokens_per_s        new tokens / wall seconds of the call (prompt ids in → ids out).
  speedup_vs_ar       AR's seconds per new token / this run's, same prompt and repeat.
  acceptance_rate     accepted / drafted tokens.
  mean_accepted_tokens  new tokens per round (tokens per target forward).
  mean_gamma          mean γ over the rounds that drafted (0 for AR).
  wasted_drafts_per_token  rejected draft tokens per new token.
  *_forwards_per_token  forwards of that model per new token, decoding only (the
                      prompt's prefill is not counted).
  *_flops_per_token   an ESTIMATE: 2 × parameters × tokens fed to that model ÷ new
                      tokens, decoding only. Parameters are the matmul weights (the input
                      embedding is left out unless tied to the output head), and the head
                      is charged only for the positions whose logits were asked for;
                      attention over the context is not counted. NASD's drafter is a table
                      lookup: 0 draft FLOPs.
  alpha               accepted / (accepted + rounds that ended in a rejection), Leviathan's α.
  cost_ratio          c: seconds per draft forward (NASD: per draft slot) / seconds per AR
                      target step, both from the traces of this prompt and repeat.
  predicted_speedup   Leviathan: (1 − α^(γ+1)) / ((1 − α)(γc + 1)); EGAG uses its mean γ,
                      an approximation since its γ varies by round.
  matches_ar          greedy runs only: the same tokens as AR on the same prompt.

The summary (one row per method and setting) takes each metric per repeat over the
prompts — the speedup as a geometric mean, rates as pooled ratios, per-token counts
weighted by new tokens — then mean ± std over repeats.
"""

from __future__ import annotations

import html
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import pandas as pd
import torch

from ..engine.feature_head import FeatureHead
from ..engine.methods import METHODS
from ..engine.params import PARAMS, DecodeParams
from .runners import run_ours
from .statistics import _geomean, leviathan_speedup
from .suite import DEFAULT_SUITE, SuitePrompt, encode_prompt, load_suite, select_prompts

SWEEP_METHODS = ("sd", "egag", "nasd")
DEFAULT_GAMMAS = (1, 2, 3, 4, 6, 8)
DEFAULT_GAMMA_MAXES = (2, 4, 6, 8)
DEFAULT_EMAS = (0.0, 0.5, 0.9)
DEFAULT_NGRAM_NS = (2, 3, 4)
SETTING_COLUMNS = ["gamma", "gamma_max", "ema", "ngram_n", "copy_n"]

ROW_COLUMNS = [
    "method", "gamma", "gamma_max", "ema", "ngram_n", "prompt_id", "repeat", "tokens_per_s", "speedup_vs_ar",
    "acceptance_rate", "mean_accepted_tokens", "mean_gamma", "wasted_drafts_per_token", "target_forwards_per_token",
    "draft_forwards_per_token", "draft_flops_per_token", "target_flops_per_token", "predicted_speedup", "matches_ar",
    # beyond the required columns
    "copy_n", "setting", "label", "category", "prompt_index", "order", "seed", "prompt_tokens", "new_tokens", "seconds",
    "rounds", "copied_rounds", "drafted", "accepted", "rejected_rounds", "alpha", "cost_ratio", "draft_seconds",
    "verify_seconds", "stop_reason",
]
# Metrics of the summary, each with a *_std beside it; how one repeat's value is taken over its prompts.
_SUMMARY_METRICS = {
    "speedup_vs_ar": "geomean", "tokens_per_s": "tokens/seconds", "acceptance_rate": "accepted/drafted",
    "alpha": "alpha", "mean_accepted_tokens": "tokens/rounds", "mean_gamma": "mean",
    "wasted_drafts_per_token": "per_token", "target_forwards_per_token": "per_token",
    "draft_forwards_per_token": "per_token", "draft_flops_per_token": "per_token",
    "target_flops_per_token": "per_token", "cost_ratio": "mean", "predicted_speedup": "mean",
}
SUMMARY_COLUMNS = (["method", "label", "setting", *SETTING_COLUMNS, "prompts", "repeats", "runs"]
                   + [c for m in _SUMMARY_METRICS for c in (m, f"{m}_std")] + ["exact_match_pct"])

Progress = Callable[[int, int, str], None]


# --------------------------------------------------------------------------- the grid

def _fmt(value: Any) -> str:
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

    @property
    def key(self) -> str:
        """A stable name for grouping, e.g. 'egag:gamma_max=6,ema=0.9'."""
        values = ",".join(f"{c}={_fmt(getattr(self, c))}" for c in SETTING_COLUMNS if getattr(self, c) is not None)
        return f"{self.method}:{values}" if values else self.method

    @property
    def label(self) -> str:
        if self.method == "sd":
            return f"SD γ={self.gamma}{copy_phrase(self.copy_n, ', ')}"
        if self.method == "egag":
            return f"EGAG γmax/EMA {self.gamma_max}/{_fmt(self.ema)}{copy_phrase(self.copy_n, ', ')}"
        if self.method == "nasd":
            return f"NASD n={self.ngram_n} (γ={self.gamma})"
        return METHODS[self.method].label if self.method in METHODS else self.method

    def params(self) -> dict[str, Any]:
        """The decode parameters this setting sets, for `specdemo.generate(pair, ids, method, **params)`."""
        names = (*SETTING_COLUMNS, "gamma_min")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def values(self) -> dict[str, Any]:
        """The setting columns of a row: None where the setting does not apply."""
        return {name: getattr(self, name) for name in SETTING_COLUMNS}


AR = Setting("ar")


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
        out.append(number if name == "ema" else int(number) if number.is_integer() else number)
    return list(dict.fromkeys(out))


def expand_grid(
    gamma: Iterable[int] | str | None = DEFAULT_GAMMAS,
    gamma_max: Iterable[int] | str | None = DEFAULT_GAMMA_MAXES,
    ema: Iterable[float] | str | None = DEFAULT_EMAS,
    ngram_n: Iterable[int] | str | None = None,
    methods: str | Sequence[str] | None = None,
    copy_n: Iterable[int] | str | None = None,
    *,
    gamma_min: int = 1,
    nasd_gamma: int = PARAMS["gamma"].default,
) -> list[Setting]:
    """AR, then SD at each γ, EGAG at each (γ_max, EMA) with γ_min fixed, NASD at each n
    (with γ = nasd_gamma). Values may be lists or comma-separated strings ("1,2,4"). With
    copy_n values, SD's and EGAG's settings are repeated for each (0 = no copying); without,
    they copy as the parameter's default says.

    methods picks among sd, egag and nasd (AR always runs); by default every method
    whose grid is given (NASD only when ngram_n is). Every setting is validated here, so
    a bad value fails before any model runs.
    """
    gammas, maxes, emas, ns = (_values(n, v) for n, v in
                               (("gamma", gamma), ("gamma_max", gamma_max), ("ema", ema), ("ngram_n", ngram_n)))
    if methods is None:
        chosen = [m for m, ok in (("sd", gammas), ("egag", maxes and emas), ("nasd", ns)) if ok]
    else:
        names = methods.split(",") if isinstance(methods, str) else list(methods)
        chosen = list(dict.fromkeys(n.strip().lower() for n in names if n and n.strip() and n.strip().lower() != "ar"))
        unknown = [n for n in chosen if n not in SWEEP_METHODS]
        if unknown:
            raise ValueError(f"sweep methods: unknown {', '.join(map(repr, unknown))}; choose from "
                             f"{', '.join(SWEEP_METHODS)} (AR always runs)")
        missing = {"sd": ("gamma", gammas), "egag": ("gamma_max and ema", maxes and emas), "nasd": ("ngram_n", ns)}
        empty = [f"{m} needs {missing[m][0]}" for m in chosen if not missing[m][1]]
        if empty:
            raise ValueError("sweep grid: " + "; ".join(empty))
    copies = _values("copy_n", copy_n) or [None]
    settings = [AR]
    if "sd" in chosen:
        settings += [Setting("sd", gamma=g, copy_n=c) for c in copies for g in gammas]
    if "egag" in chosen:
        settings += [Setting("egag", gamma_max=g, ema=e, gamma_min=gamma_min, copy_n=c)
                     for c in copies for g in maxes for e in emas]
    if "nasd" in chosen:
        settings += [Setting("nasd", gamma=nasd_gamma, ngram_n=n) for n in ns]
    for setting in settings:
        try:
            DecodeParams.from_values(**setting.params())
        except ValueError as error:
            raise ValueError(f"sweep grid, {setting.label}: {error}") from None
    return settings


# --------------------------------------------------------------------------- counting what each model is fed

def matmul_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(body, head) parameter counts that multiply activations: every weight once, less
    the input embedding (a lookup) unless it is tied to the output head."""
    if isinstance(model, FeatureHead):  # its own layer, then the target's LM-head rows of its subset
        return sum(p.numel() for p in model.parameters()), model.config.subset_size * model.config.hidden_size
    params = {p.data_ptr(): p.numel() for p in model.parameters()}
    total = sum(params.values())
    inputs, head = model.get_input_embeddings(), model.get_output_embeddings()
    head_params = head.weight.numel() if head is not None else 0
    tied = head is not None and inputs is not None and inputs.weight.data_ptr() == head.weight.data_ptr()
    if inputs is not None and not tied:
        total -= inputs.weight.numel()
    return total - head_params, head_params


class _FedCounter:
    """Counts the forwards, tokens and logit rows that one model is fed, by hooks on its decoder
    body and its output head (so a forward that calls them directly counts too)."""

    def __init__(self, model: torch.nn.Module | None):
        self.calls: list[list[int]] = []  # [tokens fed, logit rows computed] per forward
        self.body, self.head = matmul_parameters(model) if model is not None else (0, 0)
        self._handles = []
        if model is None:
            return
        if isinstance(model, FeatureHead):
            self._handles.append(model.register_forward_pre_hook(self._head_hook, with_kwargs=True))
            return
        self._handles.append(model.get_decoder().register_forward_pre_hook(self._body_hook, with_kwargs=True))
        output = model.get_output_embeddings()
        if output is not None:
            self._handles.append(output.register_forward_pre_hook(self._logits_hook))

    def _body_hook(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.calls.append([int(ids.shape[-1]), 0])

    def _logits_hook(self, module, args):
        if self.calls and args:
            hidden = args[0]
            self.calls[-1][1] += int(hidden.shape[-2]) if hidden.dim() >= 2 else 1

    def _head_hook(self, module, args, kwargs):
        features = kwargs.get("features", args[0] if args else None)
        if features is not None:
            self.calls.append([int(features.shape[-2]), 1])  # one position's subset logits a step

    def decoding(self, prefill_calls: int) -> tuple[int, int, float]:
        """(forwards, tokens fed, FLOPs) after the first prefill_calls calls."""
        calls = self.calls[prefill_calls:]
        tokens = sum(t for t, _ in calls)
        flops = 2.0 * (self.body * tokens + self.head * sum(k for _, k in calls))
        return len(calls), tokens, flops

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


# --------------------------------------------------------------------------- the run

@dataclass
class SweepEvent:
    """Progress of a sweep: yielded after every run, and once more at the end (finished)."""

    done: int
    total: int
    message: str
    rows: list[dict]  # every finished row so far (grows in place)
    new_rows: list[dict] = field(default_factory=list)  # the rows this event added
    finished: bool = False
    stopped: bool = False  # should_stop() ended the sweep early


@dataclass
class SweepResult:
    rows: pd.DataFrame  # ROW_COLUMNS
    settings: list[Setting]
    meta: dict[str, Any] = field(default_factory=dict)
    stopped: bool = False
    _summary: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def summary(self) -> pd.DataFrame:
        if self._summary is None:
            self._summary = summarize_sweep(self.rows)
        return self._summary

    @property
    def verdict(self) -> str:
        return verdict(self.summary)

    @property
    def figures(self) -> dict[str, Any]:
        return sweep_figures(self.summary)


def _prompts(prompts, categories, limit) -> list[SuitePrompt]:
    if prompts is None:
        prompts = DEFAULT_SUITE
    if isinstance(prompts, (str, Path)):
        prompts = load_suite(prompts)
    else:
        prompts = list(prompts)
        if prompts and all(isinstance(p, str) for p in prompts):
            prompts = [SuitePrompt(f"prompt-{i + 1}", "prompt", p) for i, p in enumerate(prompts)]
        elif not all(isinstance(p, SuitePrompt) for p in prompts):
            prompts = load_suite(prompts)
    chosen = select_prompts(prompts, categories, limit)
    if not chosen:
        raise ValueError("sweep: no prompts to run")
    return chosen


def iter_sweep(
    pair,
    prompts: Sequence[SuitePrompt] | Sequence[str] | str | Path | None,
    settings: Sequence[Setting],
    *,
    repeats: int = 2,
    categories: str | Sequence[str] | None = None,
    limit: int | None = None,
    warmup: bool = True,
    should_stop: Callable[[], bool] | None = None,
    **params: Any,
) -> Iterator[SweepEvent]:
    """Run AR and every setting on every prompt, `repeats` times; yield a SweepEvent after
    each run. Rows of a (prompt, repeat) are added once all of its runs finished (they
    need AR's). should_stop() is asked after each run: true ends the sweep there, and the
    finished runs of the current prompt are kept. params are the shared decode
    parameters (max_new_tokens, temperature, top_k, top_p, seed, chat, ...); each setting
    overrides its own. Closing the iterator stops after the run in progress.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer ≥ 1, got {repeats!r}")
    base = DecodeParams.from_values(**params)
    runs = [AR] + [s for s in dict.fromkeys(settings) if s.method != "ar"]
    for setting in runs:
        if setting.method not in METHODS:
            raise ValueError(f"sweep: unknown method {setting.method!r}")
        if METHODS[setting.method].needs_draft and pair.draft is None:
            raise ValueError(f"sweep: {setting.label} needs a draft model; load the pair with a draft or drop it")
        DecodeParams.from_values(**{**base.as_dict(), **setting.params()})
    items = _prompts(prompts, categories, limit)
    encoded = []
    for item in items:
        try:
            ids = encode_prompt(pair, item, base.chat)
            pair.check_fits(ids, base.max_new_tokens)
        except ValueError as error:
            raise ValueError(f"prompt {item.id!r} ({item.category}): {error}") from None
        encoded.append(ids)
    return _sweep(pair, items, encoded, runs, repeats, warmup, should_stop, base)


def _sweep(pair, items, encoded, runs, repeats, warmup, should_stop, base: DecodeParams) -> Iterator[SweepEvent]:
    shared = {k: v for k, v in base.as_dict().items() if k != "seed"}
    base_seed = base.seed if base.seed is not None else 1234
    greedy = base.sampling.greedy
    warm = list({s.method: s for s in reversed(runs)}.values())[::-1] if warmup else []  # one per method
    total = len(warm) + len(items) * len(runs) * repeats
    rows: list[dict] = []
    done = 0
    target = _FedCounter(pair.target)
    draft = _FedCounter(pair.draft if pair.draft is not pair.target else None)
    try:
        for setting in warm:
            run_ours(pair, setting.method, encoded[0], {**shared, **setting.params(),
                                                         "max_new_tokens": min(8, base.max_new_tokens)}, base_seed)
            done += 1
            yield SweepEvent(done, total, f"warm-up {setting.label}", rows)
            if should_stop and should_stop():
                yield SweepEvent(done, total, "stopped", rows, finished=True, stopped=True)
                return
        for repeat in range(repeats):
            for index, (item, ids) in enumerate(zip(items, encoded)):
                shift = (repeat + index) % len(runs)
                order = runs[shift:] + runs[:shift]
                seed = base_seed + 1000 * repeat + index
                group = []
                stop = False
                for position, setting in enumerate(order):
                    target.calls.clear()
                    draft.calls.clear()
                    run = run_ours(pair, setting.method, ids, {**shared, **setting.params()}, seed)
                    group.append((setting, position, run, target.decoding(1 if len(ids) > 1 else 0),
                                  draft.decoding(1 if len(ids) > 1 and METHODS[setting.method].needs_draft else 0)))
                    done += 1
                    stop = bool(should_stop and should_stop())
                    last = position == len(order) - 1 or stop
                    ranked = sorted(group, key=lambda g: runs.index(g[0]))  # rows in grid order
                    new = _group_rows(item, index, repeat, seed, ids, ranked, greedy) if last else []
                    rows.extend(new)
                    message = f"{item.id} {setting.label} (repeat {repeat + 1}/{repeats})"
                    yield SweepEvent(done, total, message, rows, new)
                    if stop:
                        break
                if stop:
                    yield SweepEvent(done, total, "stopped", rows, finished=True, stopped=True)
                    return
        yield SweepEvent(done, total, "done", rows, finished=True)
    finally:
        target.close()
        draft.close()


def _group_rows(item, index, repeat, seed, ids, group, greedy) -> list[dict]:
    """The rows of one (prompt, repeat), each compared with AR's run in the group."""
    ar = next((run for setting, _, run, _, _ in group if setting.method == "ar"), None)
    ar_step = math.nan
    ar_per_token = math.nan
    if ar is not None:
        ar_step = _ratio(ar.stats["verify_seconds"], ar.stats["target_forwards"])
        ar_per_token = _ratio(ar.seconds, len(ar.token_ids))
    rows = []
    for setting, position, run, (t_forwards, _, t_flops), (d_forwards, _, d_flops) in group:
        stats, result = run.stats, run.result
        new = len(run.token_ids)
        drafted, accepted = stats["drafted"], stats["accepted"]
        rejected_rounds = sum(1 for r in result.rounds if r.accepted < len(r.drafted))
        alpha = _ratio(accepted, accepted + rejected_rounds)
        mean_gamma = stats["mean_gamma"]
        if setting.method == "nasd":
            slots = sum(r.gamma for r in result.rounds)
            cost = _ratio(_ratio(stats["draft_seconds"], slots), ar_step)
        elif setting.method == "ar":
            cost = math.nan
        else:
            cost = _ratio(_ratio(stats["draft_seconds"], d_forwards), ar_step)
        gamma = mean_gamma if setting.method == "egag" else setting.gamma
        predicted = leviathan_speedup(alpha, float(gamma), cost) if setting.method != "ar" and gamma else math.nan
        row = {
            "method": setting.method, **setting.values(), "prompt_id": item.id, "repeat": repeat,
            "tokens_per_s": _ratio(new, run.seconds),
            "speedup_vs_ar": _ratio(ar_per_token, _ratio(run.seconds, new)),
            "acceptance_rate": _ratio(accepted, drafted), "mean_accepted_tokens": _ratio(new, stats["rounds"]),
            "mean_gamma": mean_gamma, "wasted_drafts_per_token": _ratio(drafted - accepted, new),
            "target_forwards_per_token": _ratio(t_forwards, new), "draft_forwards_per_token": _ratio(d_forwards, new),
            "draft_flops_per_token": _ratio(d_flops, new), "target_flops_per_token": _ratio(t_flops, new),
            "predicted_speedup": predicted,
            "matches_ar": (run.token_ids == ar.token_ids) if greedy and ar is not None else None,
            "setting": setting.key, "label": setting.label, "category": item.category, "prompt_index": index,
            "order": position, "seed": seed, "prompt_tokens": len(ids), "new_tokens": new, "seconds": run.seconds,
            "rounds": stats["rounds"], "copied_rounds": stats["copied_rounds"], "drafted": drafted, "accepted": accepted, "rejected_rounds": rejected_rounds,
            "alpha": alpha, "cost_ratio": cost, "draft_seconds": stats["draft_seconds"],
            "verify_seconds": stats["verify_seconds"], "stop_reason": stats["stop_reason"],
        }
        rows.append(row)
    return rows


def _ratio(numerator: float, denominator: float) -> float:
    try:
        return numerator / denominator if denominator and math.isfinite(denominator) and denominator > 0 else math.nan
    except TypeError:
        return math.nan


def run_sweep(
    pair,
    prompts: Sequence[SuitePrompt] | Sequence[str] | str | Path | None,
    settings: Sequence[Setting],
    *,
    repeats: int = 2,
    categories: str | Sequence[str] | None = None,
    limit: int | None = None,
    warmup: bool = True,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    **params: Any,
) -> SweepResult:
    """iter_sweep to the end; progress(done, total, message) after each run."""
    runs = [AR] + [s for s in dict.fromkeys(settings) if s.method != "ar"]
    events = iter_sweep(pair, prompts, runs, repeats=repeats, categories=categories, limit=limit, warmup=warmup,
                        should_stop=should_stop, **params)
    event = None
    for event in events:
        if progress is not None:
            progress(event.done, event.total, event.message)
    assert event is not None
    return sweep_result(pair, event.rows, runs, repeats=repeats, warmup=warmup, stopped=event.stopped, **params)


def sweep_result(pair, rows: Sequence[dict], settings: Sequence[Setting], *, repeats: int, warmup: bool = True,
                 stopped: bool = False, **params: Any) -> SweepResult:
    """The SweepResult of rows from `iter_sweep` (for callers that stream the events
    themselves), with the run's metadata: the pair, the device, the versions, the params."""
    runs = [AR] + [s for s in dict.fromkeys(settings) if s.method != "ar"]
    frame = rows_frame(rows)
    meta = _meta(pair, DecodeParams.from_values(**params), runs, frame, repeats, warmup)
    return SweepResult(frame, runs, meta, stopped)


def rows_frame(rows: Sequence[dict]) -> pd.DataFrame:
    """Rows (dicts) as a DataFrame with ROW_COLUMNS; whole-number settings stay whole (3, not 3.0)."""
    frame = pd.DataFrame(list(rows), columns=ROW_COLUMNS)
    return _typed_settings(frame)


def _typed_settings(frame: pd.DataFrame) -> pd.DataFrame:
    for name in ("gamma", "gamma_max", "ngram_n", "copy_n"):
        frame[name] = pd.to_numeric(frame[name]).astype("Int64")
    frame["ema"] = pd.to_numeric(frame["ema"]).astype(float)
    return frame


def _meta(pair, decode: DecodeParams, runs, frame, repeats, warmup) -> dict[str, Any]:
    import transformers

    models = {"target": pair.target, "draft": pair.draft}
    return {
        "pair": getattr(pair, "name", ""), "target": getattr(pair, "target_ref", ""),
        "draft": getattr(pair, "draft_ref", None), "device": str(pair.device),
        "dtype": str(next(pair.target.parameters()).dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "parameters": {k: sum(matmul_parameters(m)) for k, m in models.items() if m is not None},
        "settings": [s.key for s in runs],
        "egag_gamma_min": next((s.gamma_min for s in runs if s.method == "egag"), None), "prompts": int(frame.prompt_id.nunique()), "repeats": repeats,
        "warmup": warmup, "params": decode.as_dict(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


# --------------------------------------------------------------------------- the summary

def _per_repeat(part: pd.DataFrame, metric: str, how: str) -> float:
    if how == "geomean":
        return _geomean(part[metric].dropna().tolist())
    if how == "tokens/seconds":
        return _ratio(part.new_tokens.sum(), part.seconds.sum())
    if how == "accepted/drafted":
        return _ratio(part.accepted.sum(), part.drafted.sum())
    if how == "alpha":
        return _ratio(part.accepted.sum(), part.accepted.sum() + part.rejected_rounds.sum())
    if how == "tokens/rounds":
        return _ratio(part.new_tokens.sum(), part.rounds.sum())
    if how == "per_token":
        ok = part[part[metric].notna()]
        return _ratio((ok[metric] * ok.new_tokens).sum(), ok.new_tokens.sum())
    values = part[metric].dropna()
    return float(values.mean()) if len(values) else math.nan


def summarize_sweep(rows: pd.DataFrame | Sequence[dict]) -> pd.DataFrame:
    """One row per (method, setting), in the order they first appear: mean ± std over repeats."""
    rows = rows if isinstance(rows, pd.DataFrame) else rows_frame(rows)
    out = []
    for key in dict.fromkeys(rows.setting):
        mine = rows[rows.setting == key]
        first = mine.iloc[0]
        row = {"method": first.method, "label": first.label, "setting": key,
               **{c: first[c] for c in SETTING_COLUMNS},
               "prompts": mine.prompt_id.nunique(), "repeats": mine.repeat.nunique(), "runs": len(mine)}
        for metric, how in _SUMMARY_METRICS.items():
            values = pd.Series([_per_repeat(part, metric, how) for _, part in mine.groupby("repeat")]).dropna()
            row[metric] = float(values.mean()) if len(values) else math.nan
            row[f"{metric}_std"] = float(values.std()) if len(values) > 1 else math.nan
        matches = mine.matches_ar.dropna()
        row["exact_match_pct"] = 100.0 * matches.astype(bool).mean() if len(matches) else math.nan
        out.append(row)
    frame = pd.DataFrame(out, columns=SUMMARY_COLUMNS)
    return _typed_settings(frame)


def _best(summary: pd.DataFrame, method: str) -> pd.Series | None:
    part = summary[(summary.method == method) & summary.speedup_vs_ar.notna()]
    return None if part.empty else part.loc[part.speedup_vs_ar.idxmax()]


def verdict(summary: pd.DataFrame) -> str:
    """One sentence (two at most) from the numbers: the best EGAG against the best fixed γ."""
    egag, sd, nasd = _best(summary, "egag"), _best(summary, "sd"), _best(summary, "nasd")
    sentences = []
    if egag is not None:
        text = (f"EGAG (γ_max {_fmt(egag.gamma_max)}, EMA {_fmt(egag.ema)}{copy_phrase(egag.copy_n, ', ')}) reached "
                f"{egag.speedup_vs_ar:.2f}× AR")
        if sd is not None:
            text += (f" against {sd.speedup_vs_ar:.2f}× for the best fixed γ "
                     f"(γ = {_fmt(sd.gamma)}{copy_phrase(sd.copy_n, ', ')})")
        text += f"; its mean γ was {egag.mean_gamma:.1f}"
        if sd is None:
            text += " (no fixed-γ SD in this sweep)"
        sentences.append(text + ".")
    elif sd is not None:
        sentences.append(f"The best fixed γ (γ = {_fmt(sd.gamma)}{copy_phrase(sd.copy_n, ', ')}) reached "
                         f"{sd.speedup_vs_ar:.2f}× AR "
                         "(no EGAG in this sweep).")
    if nasd is not None:
        sentences.append(f"The best NASD (n = {_fmt(nasd.ngram_n)}) reached {nasd.speedup_vs_ar:.2f}× AR.")
    if not sentences:
        return "No SD, EGAG or NASD run has finished beside AR: nothing to compare yet."
    return " ".join(sentences)


# --------------------------------------------------------------------------- figures

def _layout(fig, title: str, xtitle: str, ytitle: str):
    fig.update_layout(title=title, xaxis_title=xtitle, yaxis_title=ytitle, legend_title="method",
                      template="plotly_white")
    return fig


def _errors(part: pd.DataFrame, column: str) -> dict:
    return dict(type="data", array=part[f"{column}_std"].fillna(0).tolist())


def _egag_text(part: pd.DataFrame) -> list[str]:
    return [f"{_fmt(g)}/{_fmt(e)}{copy_phrase(c, ' ')}" for g, e, c in zip(part.gamma_max, part.ema, part.copy_n)]


def _sd_lines(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """SD's settings as lines over γ: one, or one per copy_n value when the sweep varies it."""
    sd = summary[summary.method == "sd"].sort_values("gamma")
    if sd.empty:
        return []
    if sd.copy_n.isna().all():
        return [("SD (fixed γ)", sd)]
    return [(f"SD (fixed γ, {copy_phrase(value)})", part) for value, part in sd.groupby("copy_n", sort=False)]


def speedup_figure(summary: pd.DataFrame):
    """Speedup against γ: SD a line, EGAG points at their mean γ labelled γmax/EMA, NASD at its γ."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, sd in _sd_lines(summary):
        fig.add_scatter(name=name, x=sd.gamma, y=sd.speedup_vs_ar, mode="lines+markers",
                        error_y=_errors(sd, "speedup_vs_ar"),
                        hovertemplate="γ=%{x}: %{y:.2f}× AR<extra>" + name + "</extra>")
    egag = summary[summary.method == "egag"]
    if not egag.empty:
        fig.add_scatter(name="EGAG (γmax/EMA)", x=egag.mean_gamma, y=egag.speedup_vs_ar, mode="markers+text",
                        text=_egag_text(egag), textposition="top center", marker=dict(size=10, symbol="diamond"),
                        error_y=_errors(egag, "speedup_vs_ar"),
                        hovertemplate="γmax/EMA %{text}: mean γ %{x:.2f}, %{y:.2f}× AR<extra>EGAG</extra>")
    nasd = summary[summary.method == "nasd"]
    if not nasd.empty:
        fig.add_scatter(name="NASD (n)", x=nasd.gamma, y=nasd.speedup_vs_ar, mode="markers+text",
                        text=[f"n={_fmt(n)}" for n in nasd.ngram_n], textposition="bottom center",
                        marker=dict(size=9, symbol="square"), error_y=_errors(nasd, "speedup_vs_ar"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", annotation_text="AR")
    return _layout(fig, "Speedup over AR against γ (EGAG at its mean γ)", "γ (EGAG: mean γ)", "speedup (× AR)")


def acceptance_figure(summary: pd.DataFrame):
    """Acceptance rate and tokens per round against γ, SD as lines, EGAG at its mean γ."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance rate", "tokens per round"))
    lines = _sd_lines(summary)
    egag = summary[summary.method == "egag"]
    for col, metric in ((1, "acceptance_rate"), (2, "mean_accepted_tokens")):
        for index, (name, sd) in enumerate(lines):
            fig.add_trace(go.Scatter(name=name, x=sd.gamma, y=sd[metric], mode="lines+markers",
                                     error_y=_errors(sd, metric), legendgroup=name, showlegend=col == 1,
                                     line_color="#1f77b4" if index == 0 else None), row=1, col=col)
        if not egag.empty:
            fig.add_trace(go.Scatter(name="EGAG (γmax/EMA)", x=egag.mean_gamma, y=egag[metric], mode="markers+text",
                                     text=_egag_text(egag), textposition="top center", legendgroup="egag",
                                     showlegend=col == 1, marker=dict(size=10, symbol="diamond", color="#ff7f0e")),
                          row=1, col=col)
        fig.update_xaxes(title_text="γ (EGAG: mean γ)", row=1, col=col)
    fig.update_yaxes(title_text="accepted / drafted", row=1, col=1)
    fig.update_yaxes(title_text="new tokens / round", row=1, col=2)
    fig.update_layout(title="Acceptance and tokens per round against γ", legend_title="method",
                      template="plotly_white")
    return fig


def predicted_figure(summary: pd.DataFrame):
    """Measured speedup against Leviathan's prediction, one point per setting."""
    import plotly.graph_objects as go

    fig = go.Figure()
    shown = summary[summary.predicted_speedup.notna() & summary.speedup_vs_ar.notna() & (summary.method != "ar")]
    for method in dict.fromkeys(shown.method):
        part = shown[shown.method == method]
        fig.add_scatter(name=method.upper(), x=part.predicted_speedup, y=part.speedup_vs_ar, mode="markers+text",
                        text=part.label, textposition="top center", marker_size=9,
                        hovertemplate="%{text}<br>predicted %{x:.2f}×, measured %{y:.2f}×<extra></extra>")
    values = pd.concat([shown.predicted_speedup, shown.speedup_vs_ar]).dropna()
    low, high = (min(0.5, values.min()), max(1.5, values.max())) if len(values) else (0.5, 1.5)
    fig.add_scatter(name="measured = predicted", x=[low, high], y=[low, high], mode="lines",
                    line=dict(dash="dot", color="grey"))
    return _layout(fig, "Measured against predicted speedup (Leviathan, measured α and c)",
                   "predicted (× AR)", "measured (× AR)")


def flops_figure(summary: pd.DataFrame):
    """Estimated FLOPs per new token (draft + target) against speedup, one point per setting."""
    import plotly.graph_objects as go

    fig = go.Figure()
    shown = summary[summary.speedup_vs_ar.notna()]
    for method in dict.fromkeys(shown.method):
        part = shown[shown.method == method]
        total = part.draft_flops_per_token.fillna(0) + part.target_flops_per_token
        fig.add_scatter(name=method.upper(), x=part.speedup_vs_ar, y=total, mode="markers+text", text=part.label,
                        textposition="top center", marker_size=9,
                        customdata=part[["draft_flops_per_token", "target_flops_per_token"]].to_numpy(),
                        hovertemplate="%{text}<br>%{x:.2f}× AR<br>draft %{customdata[0]:.3s}, target "
                                      "%{customdata[1]:.3s} FLOPs/token<extra></extra>")
    return _layout(fig, "Estimated FLOPs per new token (draft + target) against speedup",
                   "speedup (× AR)", "FLOPs per new token (estimate)")


FIGURES = {
    "speedup_vs_gamma": ("Speedup against γ", speedup_figure),
    "acceptance_vs_gamma": ("Acceptance and tokens per round", acceptance_figure),
    "predicted_vs_measured": ("Measured against predicted speedup", predicted_figure),
    "flops_vs_speedup": ("FLOPs per token against speedup", flops_figure),
}


def sweep_figures(summary: pd.DataFrame) -> dict[str, Any]:
    """Every chart of the report by name (see FIGURES); pure functions of the summary."""
    return {name: make(summary) for name, (_, make) in FIGURES.items()}


# --------------------------------------------------------------------------- outputs

_SHOWN = ["label", "runs", "speedup_vs_ar", "speedup_vs_ar_std", "tokens_per_s", "tokens_per_s_std",
          "acceptance_rate", "mean_accepted_tokens", "mean_gamma", "wasted_drafts_per_token",
          "target_forwards_per_token", "draft_forwards_per_token", "draft_flops_per_token",
          "target_flops_per_token", "cost_ratio", "predicted_speedup", "exact_match_pct"]


def report_html(result: SweepResult, path: str | Path | None = None, plotlyjs: str = "inline") -> str:
    """One HTML page: the verdict, the summary table, the figures and the definitions."""
    if plotlyjs not in ("inline", "cdn"):
        raise ValueError(f"plotlyjs must be 'inline' or 'cdn', got {plotlyjs!r}")
    summary, meta = result.summary, result.meta
    figures = sweep_figures(summary)
    parts = []
    for i, (name, (title, _)) in enumerate(FIGURES.items()):
        include = (True if plotlyjs == "inline" else "cdn") if i == 0 else False
        parts.append(f"<h2>{html.escape(title)}</h2>\n"
                     + figures[name].to_html(full_html=False, include_plotlyjs=include, div_id=f"fig-{name}"))
    table = summary[_SHOWN].to_html(index=False, float_format=lambda v: f"{v:.3g}", na_rep="", border=0,
                                    classes="summary")
    params = ", ".join(f"{k}={v}" for k, v in meta.get("params", {}).items())
    info = html.escape(
        f"pair {meta.get('pair')} (target {meta.get('target')}, draft {meta.get('draft')}) on {meta.get('device')}, "
        f"dtype {meta.get('dtype')}, {meta.get('threads')} threads; torch {meta.get('torch')}, transformers "
        f"{meta.get('transformers')}; {meta.get('prompts')} prompts × {meta.get('repeats')} repeats; {params}; "
        f"{meta.get('time')}" + ("; STOPPED EARLY" if result.stopped else ""))
    definitions = html.escape(__doc__.split("Definitions of the row columns")[1])
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>specdemo sweep</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
table.summary {{ border-collapse: collapse; font-size: 13px; }}
table.summary td, table.summary th {{ padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: right; }}
p.verdict {{ font-size: 1.2em; }}
pre {{ background: #f6f6f6; padding: 1em; white-space: pre-wrap; font-size: 13px; }}
</style></head><body>
<h1>Speculative decoding sweep</h1>
<p>{info}</p>
<p class="verdict">{html.escape(result.verdict)}</p>
<h2>Summary (mean over repeats; *_std: std over repeats)</h2>
{table}
{''.join(parts)}
<h2>Definitions</h2>
<pre>Definitions of the row columns{definitions}</pre>
</body></html>
"""
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(page, encoding="utf-8")
    return page


def write_outputs(result: SweepResult, csv: str | Path | None = None, summary_csv: str | Path | None = None,
                  report: str | Path | None = None, plotlyjs: str = "inline") -> list[Path]:
    """The rows CSV, the summary CSV and the HTML report, each only if its path is given.
    Settings that do not apply to a method are empty cells."""
    written = []
    for target, frame in ((csv, result.rows), (summary_csv, result.summary)):
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(target, index=False)
            written.append(Path(target))
    if report:
        report_html(result, report, plotlyjs)
        written.append(Path(report))
    return written
