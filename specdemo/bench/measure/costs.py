"""A machine's cost table, and the tokens/s it predicts for a run from its rounds alone.

A greedy run replayed from a recording (`engine.replay`) has exact rounds but no time of its own: the
replay never runs the target. Its time is predicted from what each round did,

    seconds = setup + Σ_rounds [ target(rows) + draft steps × step + copy + overhead ]

where target(rows) is a verification forward of `rows` positions (1: AR's step; γ drafts: γ + 1),
a draft step is one drafted token of the run's drafter, a copy is a round copied from the context,
and the overhead is what a round costs beyond its model calls. Every term is measured on this
machine from the decode loop's own clock, in real runs of AR and SD at a few γ (a few seconds), and
kept on disk under ``$SPECDEMO_CACHE/costs/`` or ``~/.cache/specdemo/costs/``, one file per pair,
runtime, thread count and machine. A drafter the table has not seen is timed the first time a
prediction needs it, and added.

`prediction_errors` sets predicted beside measured tokens/s for the settings a real run measured.

May import ``engine`` and ``models`` and pandas.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
import torch

from ...engine.decoding import generate
from ...engine.methods import METHODS, REFERENCE
from ...engine.trace import COPIED, DRAFTED, GenerationResult, Round
from ...models.tokens import device_name

# The drafting method the table is calibrated with: fixed γ, the pair's own draft.
CALIBRATION_METHOD = next(name for name, m in METHODS.items() if m.default_on and m.needs_draft and not m.adapts)
CALIBRATION_GAMMAS = (1, 4, 8)  # verification rows 2, 5 and 9, AR's step being 1; between them, interpolated
CALIBRATION_TOKENS = 40
CALIBRATION_PROMPT = "Explain, in a few sentences, how a bicycle stays upright when it moves."
ERROR_COLUMNS = ["setting", "predicted_tokens_per_s", "measured_tokens_per_s", "error_pct"]


def cost_root() -> Path:
    root = os.environ.get("SPECDEMO_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "specdemo") / "costs"


def machine_key(pair) -> str:
    """What a cost table holds for: the pair, its runtime, torch's threads and the machine."""
    parts = (pair.name or pair.target_ref or "pair", pair.runtime, f"{torch.get_num_threads()}t", platform.node(),
             device_name(pair.device))
    return "|".join(str(p) for p in parts)


@dataclass
class CostTable:
    """Seconds each part of a round takes on one machine, for one pair, runtime and thread count."""

    key: str
    target_rows: dict[int, float] = field(default_factory=dict)  # a verification forward of k positions
    draft_step: dict[str, float] = field(default_factory=dict)  # a drafted token, by drafter (its description)
    copy_round: dict[str, float] = field(default_factory=dict)  # a round copied from the context, by drafter
    setup: dict[str, float] = field(default_factory=dict)  # a call beyond its rounds (prefill …), by drafter
    round_overhead: float = 0.0  # a drafting round beyond its draft steps and its verification
    step_overhead: float = 0.0  # AR's round beyond its one-position forward
    reference_prefill: float = 0.0  # AR's prefill on the calibration prompt, against which a prompt's is set

    def target_seconds(self, rows: int) -> float:
        """A verification forward of `rows` positions: measured, else on the line through its neighbours."""
        if rows in self.target_rows:
            return self.target_rows[rows]
        known = sorted(self.target_rows)
        below = [k for k in known if k < rows][-1:] or known[:1]
        above = [k for k in known if k > rows][:1] or known[-1:]
        if below == above:  # beyond the measured rows: the last two's slope
            below, above = (known[-2:-1] or known[-1:]), known[-1:]
        (a,), (b,) = below, above
        if a == b:
            return self.target_rows[a]
        slope = (self.target_rows[b] - self.target_rows[a]) / (b - a)
        return self.target_rows[a] + slope * (rows - a)

    def knows(self, drafter: str) -> bool:
        return drafter in self.setup

    def save(self, folder: Path | None = None) -> Path:
        path = _path(self.key, folder)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1, ensure_ascii=False), encoding="utf-8")
        return path

    @classmethod
    def load(cls, key: str, folder: Path | None = None) -> "CostTable | None":
        path = _path(key, folder)
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        data["target_rows"] = {int(k): v for k, v in data["target_rows"].items()}
        return cls(**data)


def _path(key: str, folder: Path | None) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return (folder or cost_root()) / f"{safe}.json"


# --------------------------------------------------------------------------- prediction


def round_seconds(costs: CostTable, drafter: str, round_: Round) -> float:
    """What a round costs by the table: its verification forward, its drafting and its overhead."""
    drafted = len(round_.drafted)
    if round_.tree is not None:
        raise ValueError("the cost table predicts chains: a tree's verification is not a row count")
    seconds = costs.target_seconds(drafted + 1)
    if round_.source == COPIED:
        return seconds + costs.copy_round.get(drafter, 0.0) + costs.round_overhead
    if drafted or round_.source == DRAFTED:
        return seconds + drafted * costs.draft_step[drafter] + costs.round_overhead
    return seconds + costs.step_overhead


def predict_seconds(result: GenerationResult, costs: CostTable, prefill_seconds: float | None = None) -> float:
    """A run's seconds from its rounds. prefill_seconds: AR's measured prefill on the same prompt, which
    replaces the calibration prompt's (a longer prompt's prefill costs more)."""
    drafter = result.drafter
    if not costs.knows(drafter):
        raise KeyError(f"the cost table has no timings for the drafter {drafter!r}; calibrate it first "
                       "(ensure_drafter)")
    seconds = costs.setup[drafter] + sum(round_seconds(costs, drafter, r) for r in result.rounds)
    if prefill_seconds is not None:
        seconds += prefill_seconds - costs.reference_prefill
    return seconds


def predict_tokens_per_s(result: GenerationResult, costs: CostTable, prefill_seconds: float | None = None) -> float:
    """New tokens per second the run would take on this machine, from its rounds (a replayed run's)."""
    new = sum(len(r.new_tokens) for r in result.rounds)
    seconds = predict_seconds(result, costs, prefill_seconds)
    return new / seconds if seconds > 0 else math.nan


# --------------------------------------------------------------------------- calibration


def calibrate(pair, prompt_ids: Sequence[int] | None = None, *, max_new_tokens: int = CALIBRATION_TOKENS,
              gammas: Iterable[int] = CALIBRATION_GAMMAS) -> CostTable:
    """Time AR and the calibration method at each γ on one prompt, from the decode loop's own clock."""
    ids = list(prompt_ids) if prompt_ids is not None else pair.encode(CALIBRATION_PROMPT, chat=True)
    costs = CostTable(machine_key(pair))
    runs = [generate(pair, ids, REFERENCE, max_new_tokens=max_new_tokens)]
    if pair.draft is not None:
        runs += [generate(pair, ids, CALIBRATION_METHOD, max_new_tokens=max_new_tokens, gamma=g) for g in gammas]
    _fill_target_rows(costs, runs)
    costs.step_overhead = _median([_wall(runs[0], r) - r.verify_seconds for r in runs[0].rounds[1:]])
    costs.round_overhead = _round_overhead(costs, runs[1:])
    costs.reference_prefill = runs[0].prefill_seconds
    for run in runs:
        _fill_drafter(costs, run)
    return costs


def _round_overhead(costs: CostTable, runs: Sequence[GenerationResult]) -> float:
    """The intercept of a drafting round's time beyond its verification against its drafts (the slope is
    the draft step, found per drafter): the loop's own cost a round."""
    points = [(len(r.drafted), _wall(run, r) - costs.target_seconds(len(r.drafted) + 1))
              for run in runs for r in _drafted_rounds(run)]
    if len({x for x, _ in points}) < 2:
        return 0.0
    slope, intercept = statistics.linear_regression(*zip(*points))
    return max(0.0, intercept)


def _drafted_rounds(run: GenerationResult) -> list[Round]:
    return [r for r in run.rounds[1:] if r.source == DRAFTED and r.drafted and r.tree is None]


def ensure_drafter(costs: CostTable, pair, result: GenerationResult, prompt_ids: Sequence[int] | None = None,
                   *, max_new_tokens: int = CALIBRATION_TOKENS) -> bool:
    """Time the drafter of `result` (one short real run of its method and parameters) if the table lacks
    it; returns whether the table changed."""
    if costs.knows(result.drafter):
        return False
    ids = list(prompt_ids) if prompt_ids is not None else pair.encode(CALIBRATION_PROMPT, chat=True)
    params = {k: v for k, v in result.params.items() if k in getattr(METHODS.get(result.method), "params", ())}
    run = generate(pair, ids, result.method, **{**params, "max_new_tokens": max_new_tokens})
    _fill_drafter(costs, run, under=result.drafter)
    return True


def _fill_target_rows(costs: CostTable, runs: Sequence[GenerationResult]) -> None:
    by_rows: dict[int, list[float]] = {}
    for run in runs:
        for r in run.rounds[1:]:  # the first round also pays for warming what the prefill left
            if r.tree is None:
                by_rows.setdefault(len(r.drafted) + 1, []).append(r.verify_seconds)
    costs.target_rows = {rows: statistics.median(times) for rows, times in sorted(by_rows.items())}


def _fill_drafter(costs: CostTable, run: GenerationResult, under: str | None = None) -> None:
    """The drafter's step and copy costs, and its setup: what the call took beyond its rounds by the table."""
    name = under or run.drafter
    drafted = _drafted_rounds(run)
    beyond = sum(_wall(run, r) - costs.target_seconds(len(r.drafted) + 1) - costs.round_overhead for r in drafted)
    costs.draft_step[name] = max(0.0, beyond / sum(len(r.drafted) for r in drafted)) if drafted else 0.0
    copied = [_wall(run, r) - costs.target_seconds(len(r.drafted) + 1) - costs.round_overhead
              for r in run.rounds[1:] if r.source == COPIED]
    if copied:
        costs.copy_round[name] = _median(copied)
    costs.setup[name] = 0.0
    costs.setup[name] = run.seconds - sum(round_seconds(costs, name, r) for r in run.rounds)


def _wall(run: GenerationResult, round_: Round) -> float:
    before = run.rounds[round_.index - 1].end_seconds if round_.index > 0 else run.prefill_seconds
    return round_.end_seconds - before


def _median(values: Sequence[float]) -> float:
    return max(0.0, statistics.median(values)) if values else 0.0


def cost_table(pair, folder: Path | None = None) -> CostTable:
    """This machine's table for the pair at torch's current threads: from disk, else calibrated and saved."""
    key = machine_key(pair)
    costs = CostTable.load(key, folder)
    if costs is None:
        costs = calibrate(pair)
        costs.save(folder)
    return costs


# --------------------------------------------------------------------------- the check


def prediction_errors(pairs: Iterable[tuple[str, float, float]]) -> pd.DataFrame:
    """(setting, predicted, measured tokens/s) → ERROR_COLUMNS, error_pct = 100·(predicted − measured)/measured."""
    rows = [{"setting": s, "predicted_tokens_per_s": p, "measured_tokens_per_s": m,
             "error_pct": 100.0 * (p - m) / m if m else math.nan} for s, p, m in pairs]
    return pd.DataFrame(rows, columns=ERROR_COLUMNS)
