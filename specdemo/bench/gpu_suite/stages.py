"""The suite's stages, cut into units: the whole run has one time budget (`--budget`), planned
before the first unit from estimated minutes (`plan`), and each unit is skipped, with its reason,
when its estimate is more than what is left. Each stage catches its units' failures; the
markdown summary is rewritten after every unit, so a run cut short keeps every row it measured.

May import torch, pandas and the other bench modules.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .plan import Cost, Estimator, plan_lines, skip_reason

NO_CUDA = "skipped: no CUDA"


@dataclass(frozen=True)
class Mode:
    """How our decoders compute: the KV cache kind and whether steps go through torch.compile."""

    name: str
    cache: str
    compile: bool


MODES = (Mode("compiled+static", "static", True), Mode("eager+dynamic", "dynamic", False))


@dataclass
class Settings:
    out: Path
    device: str
    dtype: str
    tiny: bool = False
    budget_minutes: float = math.inf  # the whole run's (no limit unless --budget sets one)
    minutes: float | None = None  # a cap on every stage, within the run's budget (None: none)
    head_minutes: float = 0.0
    stage_minutes: dict[str, float] = field(default_factory=dict)  # caps given by stage name
    gamma: int = 4
    max_new_tokens: int = 128
    repeats: int = 3
    prompts: int = 2
    rate: float = 0.8
    seed: int = 0
    bandwidth: str | None = None
    install_head: bool = True
    compile_cache: Path | None = None
    command: str = ""

    @property
    def cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def rehearsal(self) -> bool:
        """Tiny shapes on a CPU: estimates come from the rehearsal's table, not the H100's."""
        return self.tiny and not self.cuda


def parse_minutes(text: str) -> tuple[float | None, dict[str, float]]:
    """'5' → every stage at most 5 minutes; '4,synthetic=6,embedded=3' → 4 by default, those two by
    name; '' → no cap."""
    default, named = None, {}
    for item in (part.strip() for part in str(text).split(",") if part.strip()):
        name, _, value = item.rpartition("=")
        try:
            minutes = float(value)
        except ValueError:
            raise ValueError(f"--minutes: {item!r} is not a number of minutes or STAGE=MINUTES") from None
        if minutes < 0:
            raise ValueError(f"--minutes: {item!r} is negative")
        if name:
            named[name.strip()] = minutes
        else:
            default = minutes
    return default, named


class OutOfTime(Exception):
    """A stage's budget ran out between two pieces of work."""


@dataclass
class StageContext:
    """What a stage's units share: its deadline, its notes, files and headline rows, and (in
    `shared`, closed by `stack` after its last unit) what one unit builds for the next."""

    settings: Settings
    deadline: float
    lines: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    headline: list[dict] = field(default_factory=list)
    compile_rows: list[dict] = field(default_factory=list)  # per method: unit, method, warm-up and compile seconds
    status: str = "ok"
    log: Callable[[str], None] = print
    clock: Callable[[], float] = time.monotonic
    shared: dict = field(default_factory=dict)
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def seconds_left(self) -> float:
        return self.deadline - self.clock()

    def check_time(self, next_unit: str) -> None:
        """Stop the stage cleanly before `next_unit` when its budget is spent."""
        if self.seconds_left() <= 0:
            raise OutOfTime(f"stopped at its budget before {next_unit}")

    def note(self, line: str) -> None:
        self.lines.append(line)

    def wrote(self, *paths: Path) -> None:
        self.files.extend(Path(p) for p in paths)


@dataclass(frozen=True)
class Unit:
    """A piece of a stage that is planned, skipped or run whole, and leaves its rows when it ends."""

    name: str
    run: Callable[[StageContext], None]
    cost: Cost = Cost()


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    run: Callable[[StageContext], None] | None = None  # a stage of one unit
    needs_cuda: bool = False
    budget: Callable[[Settings], float | None] | None = None  # a cap in minutes; default settings.minutes
    skip: Callable[[Settings], str | None] | None = None  # a reason to skip, said in the summary
    cost: Callable[[Settings], Cost] | None = None  # the estimate of a stage of one unit
    units: Callable[[Settings], list[Unit]] | None = None  # finer units, in the order they run

    def plan(self, settings: Settings) -> list[Unit]:
        if self.units is not None:
            return self.units(settings)
        return [Unit(self.name, self.run, self.cost(settings) if self.cost else Cost())]

    def cap(self, settings: Settings) -> float | None:
        minutes = settings.stage_minutes.get(self.name)
        if minutes is None:
            minutes = self.budget(settings) if self.budget else settings.minutes
        return minutes


@dataclass
class UnitOutcome:
    name: str
    estimate_minutes: float
    status: str = "planned"
    seconds: float = 0.0
    compile_seconds: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status.startswith("ok")


@dataclass
class Outcome:
    stage: Stage
    status: str
    seconds: float
    budget_minutes: float | None
    context: StageContext | None = None
    error: str = ""
    units: list[UnitOutcome] = field(default_factory=list)


def stage_status(units: list[UnitOutcome]) -> str:
    """One unit: its status. Several: "ok", or how many were ok (the units' table says why not)."""
    if len(units) == 1:
        return units[0].status
    if all(u.ok for u in units):
        return "ok"
    failed = [u.name for u in units if u.error]
    return f"{sum(u.ok for u in units)} of {len(units)} units ok" + (f"; failed: {', '.join(failed)}" if failed else "")


@dataclass
class Planned:
    stage: Stage
    units: list[Unit]
    estimates: list[float]
    reason: str | None  # why the whole stage does not run (no CUDA, not asked for), or None


def stage_reason(stage: Stage, settings: Settings) -> str | None:
    """Why a whole stage does not run (no CUDA, not asked for, no embedded target), or None."""
    if stage.needs_cuda and not settings.cuda:
        return NO_CUDA
    skipped = stage.skip(settings) if stage.skip else None
    return f"skipped: {skipped}" if skipped else None


def make_plan(stages: list[Stage], settings: Settings, estimator: Estimator) -> list[Planned]:
    planned = []
    for stage in stages:
        units = stage.plan(settings)
        planned.append(Planned(stage, units, [estimator.minutes(u.cost) for u in units], stage_reason(stage, settings)))
    return planned


def print_plan(plan: list[Planned], settings: Settings, log: Callable[[str], None]) -> None:
    """Each unit with its estimate, and whether it can fit if every unit before it runs as estimated."""
    rows, left = [], settings.budget_minutes
    for item in plan:
        for unit, minutes in zip(item.units, item.estimates):
            tight = skip_reason(minutes, left)
            reason = item.reason or (f"does not fit: {tight}" if tight else None)
            if reason is None:
                left -= minutes
            rows.append((item.stage.name, unit.name, minutes, reason))
    for line in plan_lines(rows, settings.budget_minutes):
        log(line)


def run_stages(stages: list[Stage], settings: Settings, write: Callable[[list[Outcome]], None],
               log: Callable[[str], None] = print, after_unit: Callable[[], None] | None = None,
               clock: Callable[[], float] = time.monotonic) -> list[Outcome]:
    """Plan every stage's units, print the plan, then run them in order under the run's budget,
    writing the summary (and calling `after_unit`) after every unit."""
    estimator = Estimator()
    run_deadline = clock() + 60 * settings.budget_minutes
    plan = make_plan(stages, settings, estimator)
    print_plan(plan, settings, log)
    outcomes: list[Outcome] = []
    try:
        for item in plan:
            outcome = Outcome(item.stage, "planned", 0.0, item.stage.cap(settings), units=[
                UnitOutcome(u.name, e, item.reason or "planned") for u, e in zip(item.units, item.estimates)])
            outcomes.append(outcome)
            if item.reason:
                log(f"{item.stage.name}: {item.reason}")
                outcome.status = item.reason
                write(outcomes)
            else:
                _run_stage(item, outcome, settings, run_deadline, estimator, lambda: write(outcomes), after_unit,
                           log, clock)
    finally:
        gc.unfreeze()
    return outcomes


def _run_stage(item: Planned, outcome: Outcome, settings: Settings, run_deadline: float, estimator: Estimator,
               write: Callable[[], None], after_unit: Callable[[], None] | None, log: Callable[[str], None],
               clock: Callable[[], float]) -> None:
    stage, start = item.stage, clock()
    deadline = run_deadline if outcome.budget_minutes is None else min(run_deadline,
                                                                         start + 60 * outcome.budget_minutes)
    ctx = StageContext(settings, deadline, log=lambda m: log(f"{stage.name}: {m}"), clock=clock)
    outcome.context = ctx
    cap = f", at most {outcome.budget_minutes:g} min" if outcome.budget_minutes is not None else ""
    units = f"{len(item.units)} units" if len(item.units) > 1 else ""
    log(f"{stage.name}: {stage.title}" + (f" ({units}{cap})".replace("(, ", "(") if units or cap else ""))
    with ctx.stack:
        for unit, result in zip(item.units, outcome.units):
            estimate = estimator.minutes(unit.cost)  # refined by the units that ran before
            result.estimate_minutes = estimate
            reason, rows = skip_reason(estimate, ctx.seconds_left() / 60), len(ctx.headline)
            if reason:
                result.status = f"skipped: {reason}"
                if len(item.units) > 1:
                    log(f"{stage.name}: {unit.name}: {result.status}")
            else:
                result.status = "running"
                write()  # a run cut from outside now says where it was cut
                _run_unit(unit, result, ctx, estimator, announce=len(item.units) > 1)
            outcome.seconds = clock() - start
            outcome.status = "running"
            outcome.error = "\n".join(u.error for u in outcome.units if u.error)
            write()
            if not reason and len(ctx.headline) > rows:
                log(f"{stage.name}: {unit.name}: {len(ctx.headline) - rows} headline row(s) written to the summary")
            if after_unit is not None and not reason:
                after_unit()
    outcome.status = stage_status(outcome.units)
    write()
    log(f"{stage.name}: {outcome.status} after {outcome.seconds:.1f} s")


def _run_unit(unit: Unit, result: UnitOutcome, ctx: StageContext, estimator: Estimator, announce: bool) -> None:
    if announce:
        ctx.log(f"{unit.name}: started (~{result.estimate_minutes:.2f} min)")
    # Every timed call collects garbage first; frozen survivors of earlier units (their garbage
    # collected just before) make that collection scan only what this unit makes: ~1 s a call less.
    gc.collect()
    gc.freeze()
    ctx.status, start, compiled_before = "ok", ctx.clock(), len(ctx.compile_rows)
    try:
        unit.run(ctx)
        result.status = ctx.status
    except OutOfTime as stop:
        result.status = str(stop)
    except Exception:  # one broken unit must not sink the rest
        result.status, result.error = "failed", traceback.format_exc()
    result.seconds = ctx.clock() - start
    result.compile_seconds = sum(row["compile_s"] for row in ctx.compile_rows[compiled_before:]
                                 if row["compile_s"] == row["compile_s"])  # NaN: not known
    if result.status == "ok":
        estimator.observe(unit.cost, result.seconds, result.compile_seconds)
    if announce:
        ctx.log(f"{unit.name}: {result.status} after {result.seconds:.1f} s")
