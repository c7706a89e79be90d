"""The draft at scale, one command: write the corpus, train the head, measure it, within a budget.

    python -m specdemo.training.at_scale --device cuda --budget 9 --out DIR
    python -m specdemo.training.at_scale --device cpu --tiny --budget 3 --out DIR   # the rehearsal

Stages, in order, each with a share of the budget (`--plan write=0.45,train=0.3,measure=0.2`; what is left, 0.05, covers the card and the cap):

1. `write`: the target answers requests with the generation loop (`generation.py`) into a corpus in
   `--work` (it is large: the target's states at every position);
2. `train`: the head learns from it with the recipe that measured best (docs/draft-recipes.md:
   tokens only, the training-time test over 4 steps, rejected positions ×2 when continuing a head),
   checkpointed into DIR/head at every validation check;
3. `measure`: the head on the held-out prompts and on the benchmark's suite, on the same device
   (acceptance, tokens per round, agreement: `evaluate.py`), beside the head it started from.

A stage ends at its deadline (the run's start plus its share and the shares before it, so time a
stage leaves goes to the next). `summary.json` is rewritten after every stage, and a run cut short
(SIGTERM, a deadline, an exception) leaves what it finished: the stages done, the head's last
checkpoint, the reason it stopped. DIR ends with the head, its card (README.md), its curve and
summary.json, at most `CAP_BYTES`; the corpus stays in `--work`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

STAGES = ("write", "train", "measure")
DEFAULT_SHARES = {"write": 0.45, "train": 0.3, "measure": 0.2}
CAP_BYTES = 50 * 1024 * 1024
# What DIR keeps whatever the cap: the head, its card and curve, the summary.
ESSENTIAL = ("head", "README.md", "card.json", "curve.csv", "curve.html", "summary.json")


class CutShort(Exception):
    """The run was told to stop (SIGTERM) or a stage ran past its deadline."""


@dataclass
class Plan:
    """Minutes for each stage: `shares` of `budget` minutes, in `STAGES` order."""

    budget: float
    shares: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SHARES))

    def __post_init__(self):
        unknown = set(self.shares) - set(STAGES)
        if unknown:
            raise ValueError(f"unknown stages {sorted(unknown)}; the stages are {', '.join(STAGES)}")
        if any(v < 0 for v in self.shares.values()) or sum(self.shares.values()) > 1 + 1e-9:
            raise ValueError(f"the shares must be ≥ 0 and add up to at most 1, not {self.shares}")
        if self.budget <= 0:
            raise ValueError(f"the budget must be positive, not {self.budget} minutes")

    def minutes(self, stage: str) -> float:
        return self.budget * self.shares.get(stage, 0.0)

    def deadlines(self, start: float) -> dict[str, float]:
        """Each stage's deadline (seconds on the clock `start` is read from): cumulative shares."""
        out, spent = {}, 0.0
        for stage in STAGES:
            spent += self.minutes(stage)
            out[stage] = start + 60 * spent
        return out

    def as_dict(self) -> dict:
        return {"budget_minutes": self.budget, "minutes": {s: round(self.minutes(s), 3) for s in STAGES}}


def parse_plan(text: str) -> dict[str, float]:
    """"write=0.5,train=0.3" -> {"write": 0.5, "train": 0.3}; stages not named keep their default share."""
    shares = dict(DEFAULT_SHARES)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        try:
            shares[name.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"a plan reads like write=0.5,train=0.3, not {text!r}")
    return shares


def directory_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def keep_within_cap(folder: Path, cap: int = CAP_BYTES) -> list[str]:
    """Remove what is not essential from `folder`, largest first, until it holds at most `cap`
    bytes; the names removed. Raises ValueError when the essentials alone are over the cap."""
    folder = Path(folder)
    removed = []
    extras = sorted((p for p in folder.rglob("*") if p.is_file()
                     and p.relative_to(folder).parts[0] not in ESSENTIAL), key=lambda p: -p.stat().st_size)
    for path in extras:
        if directory_bytes(folder) <= cap:
            break
        removed.append(str(path.relative_to(folder)))
        path.unlink()
    if directory_bytes(folder) > cap:
        raise ValueError(f"{folder} holds {directory_bytes(folder) / 2**20:.1f} MiB of essentials, over the "
                         f"{cap / 2**20:.0f} MiB cap")
    return removed


def write_summary(out: Path, summary: dict) -> None:
    """summary.json, replaced atomically so a run killed while writing it keeps the previous one."""
    partial = Path(out) / "summary.json.partial"
    partial.write_text(json.dumps(summary, indent=1, ensure_ascii=False, default=str))
    partial.replace(Path(out) / "summary.json")


def run_stages(out: Path, plan: Plan, stages: dict, context, log=print, clock=time.monotonic) -> dict:
    """Run `stages` ({name: function(context, deadline) -> dict}) in `STAGES` order, each until its
    deadline, writing summary.json after each. A stage that raises (or is cut short) ends the run
    there: its error is recorded beside the stages that finished, and the later ones read
    "not run"."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    start = clock()
    deadlines = plan.deadlines(start)
    summary = {"plan": plan.as_dict(), "stages": {}, "finished": False, "command": " ".join(sys.argv)}
    write_summary(out, summary)
    stopped = None
    for name in STAGES:
        if name not in stages:
            continue
        if stopped is not None:
            summary["stages"][name] = {"status": "not run", "reason": f"{stopped} stopped the run"}
            continue
        began = clock()
        log(f"[{began - start:6.1f} s] {name}: until {deadlines[name] - start:.0f} s")
        try:
            result = stages[name](context, deadlines[name])
            summary["stages"][name] = {"status": "done", "seconds": round(clock() - began, 1), **(result or {})}
        except (CutShort, KeyboardInterrupt) as stop:
            summary["stages"][name] = {"status": "cut short", "reason": str(stop) or type(stop).__name__,
                                       "seconds": round(clock() - began, 1), **getattr(context, "partial", {})}
            stopped = name
        except Exception as error:  # recorded, never lost: the summary says what failed and where
            summary["stages"][name] = {"status": "failed", "error": f"{type(error).__name__}: {error}",
                                       "traceback": traceback.format_exc(limit=6),
                                       "seconds": round(clock() - began, 1), **getattr(context, "partial", {})}
            stopped = name
        if hasattr(context, "partial"):
            context.partial = {}
        summary["elapsed_seconds"] = round(clock() - start, 1)
        write_summary(out, summary)
    summary["finished"] = stopped is None
    write_summary(out, summary)
    return summary


def stop_on_sigterm() -> None:
    """SIGTERM raises `CutShort` in the running stage, so the summary still says what was done."""
    def handler(signum, frame):
        raise CutShort("SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specdemo.training.at_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the head, its card, its curve, summary.json")
    parser.add_argument("--budget", type=float, required=True, help="minutes for the whole run")
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny random target built here (the CPU rehearsal): every stage at small scale")
    parser.add_argument("--plan", type=parse_plan, default=dict(DEFAULT_SHARES),
                        help="each stage's share of the budget, e.g. write=0.45,train=0.3,measure=0.2")
    parser.add_argument("--work", type=Path, help="where the corpus is written (default: a new temporary folder)")
    parser.add_argument("--batch", type=int, help="requests answered together (default: 1024 on CUDA, 64 on a CPU)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the target's precision while writing (float32: the states the CPU's target computes)")
    parser.add_argument("--compile", action="store_true", help="compile the writer's one-token step (CUDA)")
    parser.add_argument("--start-from", default=None,
                        help="'shipped' (continue the packaged head; the default on the real target), 'scratch' "
                             "(the default with --tiny) or a head's folder")
    parser.add_argument("--prompts", type=int, help="requests in the plan (default: 60000, 400 with --tiny)")
    parser.add_argument("--threads", type=int, help="CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    import torch

    from .at_scale_stages import Context, stage_functions

    args = parse_args(argv)
    if args.threads or args.tiny:  # a tiny model gains nothing from threads, and on a busy CPU they fight
        torch.set_num_threads(args.threads or 1)
    if args.tiny:  # the rehearsal builds its target here and needs nothing from the Hub
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    plan = Plan(args.budget, args.plan)
    work = args.work or Path(tempfile.mkdtemp(prefix="specdemo-at-scale-"))
    context = Context.for_run(args, work)
    stop_on_sigterm()
    print(json.dumps(plan.as_dict()), flush=True)
    summary = run_stages(args.out, plan, stage_functions(), context, log=lambda m: print(m, flush=True))
    summary["removed_for_cap"] = keep_within_cap(args.out)
    summary["out_bytes"] = directory_bytes(args.out)  # before this last summary, which adds a few bytes
    write_summary(args.out, summary)
    print(json.dumps({name: stage["status"] for name, stage in summary["stages"].items()}), flush=True)
    return 0 if summary["finished"] else 1


if __name__ == "__main__": raise SystemExit(main())
