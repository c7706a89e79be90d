"""The suite's stages: each runs under its own time budget, catches its own failure, and
adds lines, files and headline rows to one markdown summary, rewritten after every stage
so that a run cut short still leaves what it measured.

May import torch, pandas and the other bench modules.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

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
    minutes: float = 5.0
    head_minutes: float = 0.0
    stage_minutes: dict[str, float] = field(default_factory=dict)  # budgets given by stage name
    gamma: int = 4
    max_new_tokens: int = 128
    repeats: int = 3
    prompts: int = 2
    rate: float = 0.8
    seed: int = 0
    carry: Path | None = None
    bandwidth: str | None = None
    install_head: bool = True
    command: str = ""
    waiting_for: list[str] = field(default_factory=list)  # carried parts not here yet

    @property
    def cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"


def parse_minutes(text: str) -> tuple[float, dict[str, float]]:
    """'5' → every stage 5 minutes; '4,synthetic=6,embedded=3' → 4 by default, those two by name."""
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
    return (5.0 if default is None else default), named


class OutOfTime(Exception):
    """A stage's budget ran out between two units of work."""


@dataclass
class StageContext:
    settings: Settings
    deadline: float
    lines: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    headline: list[dict] = field(default_factory=list)
    status: str = "ok"
    log: Callable[[str], None] = print

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def check_time(self, next_unit: str) -> None:
        """Stop the stage cleanly before `next_unit` when its budget is spent."""
        if self.seconds_left() <= 0:
            raise OutOfTime(f"stopped at its budget before {next_unit}")

    def note(self, line: str) -> None:
        self.lines.append(line)

    def wrote(self, *paths: Path) -> None:
        self.files.extend(Path(p) for p in paths)


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    run: Callable[[StageContext], None]
    needs_cuda: bool = False
    budget: Callable[[Settings], float] | None = None  # minutes; default settings.minutes
    skip: Callable[[Settings], str | None] | None = None  # a reason to skip, said in the summary


@dataclass
class Outcome:
    stage: Stage
    status: str
    seconds: float
    budget_minutes: float
    context: StageContext | None = None
    error: str = ""


def run_stage(stage: Stage, settings: Settings, log: Callable[[str], None]) -> Outcome:
    minutes = settings.stage_minutes.get(stage.name)
    if minutes is None:
        minutes = stage.budget(settings) if stage.budget else settings.minutes
    if stage.needs_cuda and not settings.cuda:
        log(f"{stage.name}: {NO_CUDA}")
        return Outcome(stage, NO_CUDA, 0.0, minutes)
    reason = stage.skip(settings) if stage.skip else None
    if reason:
        log(f"{stage.name}: skipped: {reason}")
        return Outcome(stage, f"skipped: {reason}", 0.0, minutes)
    start = time.monotonic()
    context = StageContext(settings, start + 60 * minutes, log=lambda m: log(f"{stage.name}: {m}"))
    log(f"{stage.name}: {stage.title} (budget {minutes:g} min)")
    error = ""
    try:
        stage.run(context)
        status = context.status
    except OutOfTime as stop:
        status = str(stop)
    except Exception:  # one broken stage must not sink the rest
        status, error = "failed", traceback.format_exc()
    seconds = time.monotonic() - start
    log(f"{stage.name}: {status} after {seconds:.1f} s")
    return Outcome(stage, status, seconds, minutes, context, error)


def run_stages(stages: list[Stage], settings: Settings, write: Callable[[list[Outcome]], None],
               log: Callable[[str], None] = print) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for stage in stages:
        outcomes.append(run_stage(stage, settings, log))
        write(outcomes)
    return outcomes
