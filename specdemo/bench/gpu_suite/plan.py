"""The run's plan: units of work with estimated minutes, refined by what the run measures, and
the rule that skips a unit whose estimate is more than the time left.

An estimate is a unit's default cost (a table of minutes measured on an H100, or on a CPU for the
rehearsal) split into compiling and the rest. The rest scales with the unit's work (methods ×
new tokens × calls × prompts) against the work the table was measured at. Once calibrated units
have run, each part is multiplied by what those units measured over what they were estimated at,
so a slower card, a warm compile cache or a cut-down run moves every later estimate.

Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Cost:
    """Minutes a unit is expected to take: compiling, and everything else (loading, decoding)."""

    compile: float = 0.0
    run: float = 0.0
    calibrated: bool = False  # a benchmark unit: refined by, and refining, the measured scales

    @property
    def total(self) -> float:
        return self.compile + self.run

    def for_work(self, work: float, reference: float) -> "Cost":
        """The same unit with `work` where the table measured `reference` (compiling stays as is)."""
        return replace(self, run=self.run * work / reference) if reference > 0 else self


@dataclass(frozen=True)
class Workload:
    """What a benchmark unit decodes: its size is methods × new tokens × calls (warm-up included) × prompts."""

    methods: int
    max_new_tokens: int
    repeats: int
    prompts: int = 1

    @property
    def size(self) -> float:
        return self.methods * self.max_new_tokens * (self.repeats + 1) * self.prompts


# Minutes on an NVIDIA H100 (bfloat16) at the suite's defaults: 128 new tokens (64 eager), 3 repeats,
# 2 prompts for the embedded pair. The synthetic Pythia figures and Qwen's eager one were measured
# (Pythia compiled + static took 3 min, mostly compiling; Qwen eager with four methods 2.7 min);
# the others are guesses, refined as the run measures.
GPU_COSTS = {
    "cuda-paths": Cost(run=0.1),
    "cuda-probe": Cost(run=0.4),
    "synthetic pythia-1.4b/70m compiled+static": Cost(compile=2.3, run=0.7, calibrated=True),
    "synthetic qwen2.5-1.5b/0.5b compiled+static": Cost(compile=2.8, run=1.2, calibrated=True),
    "synthetic pythia-1.4b/70m eager+dynamic": Cost(run=0.4, calibrated=True),
    "synthetic qwen2.5-1.5b/0.5b eager+dynamic": Cost(run=0.8, calibrated=True),
    "embedded embedded compiled+static": Cost(compile=1.5, run=1.0, calibrated=True),
    "embedded embedded-lm compiled+static": Cost(compile=0.7, run=0.5, calibrated=True),
    "embedded embedded eager+dynamic": Cost(run=0.8, calibrated=True),
    "embedded embedded-lm eager+dynamic": Cost(run=0.8, calibrated=True),
    "lossless": Cost(run=2.0),
    # A guess: at batch 32 the 70 M draft runs row by row, γ forwards a row a round.
    "batch pythia-1.4b/70m": Cost(run=1.5, calibrated=True),
}
# Minutes of the rehearsal (--tiny, torch.compile off) on a 2-core CPU shared with other work.
REHEARSAL_COSTS = {
    "cuda-paths": Cost(run=0.05),
    "cuda-probe": Cost(),
    "synthetic pythia-tiny compiled+static": Cost(run=0.15, calibrated=True),
    "synthetic qwen2.5-tiny compiled+static": Cost(run=0.1, calibrated=True),
    "synthetic pythia-tiny eager+dynamic": Cost(run=0.03, calibrated=True),
    "synthetic qwen2.5-tiny eager+dynamic": Cost(run=0.03, calibrated=True),
    "embedded embedded compiled+static": Cost(run=0.6, calibrated=True),
    "embedded embedded-lm compiled+static": Cost(run=0.2, calibrated=True),
    "lossless": Cost(run=0.5),
    "batch pythia-tiny": Cost(run=0.3, calibrated=True),
    "head": Cost(run=1.0),
}
UNKNOWN = Cost(run=1.0)


def default_cost(key: str, rehearsal: bool) -> Cost:
    return (REHEARSAL_COSTS if rehearsal else GPU_COSTS).get(key, UNKNOWN)


@dataclass
class Estimator:
    """Estimates, refined by the calibrated units that ran: each part (compiling, the rest) is
    scaled by measured ÷ estimated over those units."""

    estimated: list[float] = field(default_factory=lambda: [0.0, 0.0])  # minutes: compile, rest
    measured: list[float] = field(default_factory=lambda: [0.0, 0.0])

    def scales(self) -> tuple[float, float]:
        return tuple(m / e if e > 0 else 1.0 for m, e in zip(self.measured, self.estimated))

    def minutes(self, cost: Cost) -> float:
        if not cost.calibrated:
            return cost.total
        compile_scale, run_scale = self.scales()
        return cost.compile * compile_scale + cost.run * run_scale

    def observe(self, cost: Cost, seconds: float, compile_seconds: float) -> None:
        """A calibrated unit ran whole in `seconds`, `compile_seconds` of them compiling."""
        if not cost.calibrated:
            return
        compiling = min(compile_seconds, seconds) / 60 if cost.compile > 0 else 0.0
        self.estimated[0] += cost.compile
        self.measured[0] += compiling
        self.estimated[1] += cost.run
        self.measured[1] += seconds / 60 - compiling


def skip_reason(estimate_minutes: float, minutes_left: float) -> str | None:
    """Why a unit does not start: its estimate is more than what is left."""
    if estimate_minutes > minutes_left:
        return f"needs ~{estimate_minutes:.2f} min, {max(minutes_left, 0.0):.2f} min left"
    return None


def plan_lines(planned: list[tuple[str, str, float, str | None]], budget_minutes: float) -> list[str]:
    """The printed plan: (stage, unit, estimated minutes, a reason it will not run or None) in order."""
    runnable = sum(minutes for _, _, minutes, reason in planned if reason is None)
    lines = [f"plan: {len(planned)} unit(s), ~{runnable:.1f} min estimated, budget {budget_minutes:g} min"]
    for index, (stage, unit, minutes, reason) in enumerate(planned, 1):
        label = unit if unit == stage else f"{stage}: {unit}"
        lines.append(f"  {index:2d}. {label:<52} ~{minutes:5.2f} min" + (f"  ({reason})" if reason else ""))
    return lines
