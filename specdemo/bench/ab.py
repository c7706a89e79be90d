"""A/B: this working tree against a base revision, interleaved in one run on the same prompts.

    python -m specdemo.bench.ab --base REV [--methods ar,sd,egag] [--threads 1,2] [--per-category 1]

A change to the decode path is measured against where it started: the base revision is
exported (`git archive`) to a temporary folder, and each side runs in a worker process of its
own that loads the pair. The two workers take turns, prompt by prompt, with the order rotated
(`schedule.interleaved`), so drift on a shared machine falls on both alike. Only one worker
decodes at a time; the other waits on its pipe. Each repeat starts new workers: a process's
speed can differ from another's on the same code (where its memory lands, which core it starts
on), and that luck should not fall on one side for the whole run.

Per side, thread count and method it prints the median tokens/s, and per side and thread
count the geometric mean over prompts of each method's tokens/s ÷ AR's on the same prompt.
Then, paired on the same prompt and repeat, this tree ÷ the base for tokens/s and for the
speedup over AR, with a bootstrap interval over repeats and prompts: a difference is shown only
where the interval excludes 1.
It also says whether both sides wrote the same tokens: a refactor must not change them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from .page import markdown
from .measure.schedule import interleaved
from .suite import DEFAULT_SUITE, conversation, load_suite, select_prompts
from ..engine.methods import REFERENCE

ROOT = Path(__file__).resolve().parents[2]
# What a worker runs, with its side's tree first on sys.path; only the public API, which both sides share.
WORKER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from specdemo.engine.decoding import generate
from specdemo.models.loading import PRESETS, load_pair
preset = PRESETS[sys.argv[2]]
import inspect
# The target on the runtime asked for on both sides (a side from before runtimes has no runtime argument).
pair = load_pair(preset.target, preset.draft,
                 **({"runtime": sys.argv[3]} if "runtime" in inspect.signature(load_pair).parameters else {}))
import specdemo
print(json.dumps({"ready": specdemo.__file__}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    torch.set_num_threads(job["threads"])
    result = generate(pair, job["prompt"], job["method"], max_new_tokens=job["max_new_tokens"], seed=0, chat=True)
    stats = result.stats
    print(json.dumps({"tokens_per_s": stats["tokens_per_s"], "acceptance_rate": stats["acceptance_rate"],
                      "tokens": result.token_ids}), flush=True)
"""


@dataclass
class Worker:
    side: str
    process: subprocess.Popen

    @classmethod
    def start(cls, side: str, tree: Path, preset: str, runtime: str = "torch") -> "Worker":
        process = subprocess.Popen([sys.executable, "-c", WORKER, str(tree), preset, runtime], cwd=tree, text=True,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        ready = json.loads(process.stdout.readline() or "{}")
        if not str(ready.get("ready", "")).startswith(str(tree)):
            process.kill()
            raise SystemExit(f"the {side} worker did not load its own tree {tree}: {ready}")
        return cls(side, process)

    def run(self, **job) -> dict:
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def export_revision(revision: str, folder: Path) -> Path:
    """The tracked files of `revision`, written under folder (nothing of the working tree changes)."""
    archive = folder / "base.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), revision], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(folder / "base", filter="data")
    return folder / "base"


def measure(start: Callable[[], dict[str, Worker]], prompts: Sequence[str], methods: Sequence[str],
            threads: Sequence[int], repeats: int, max_new_tokens: int, fresh: bool = True) -> pd.DataFrame:
    """One row per (side, threads, method, prompt, repeat), the sides alternating in rotated order.

    With `fresh`, each repeat gets new worker processes: where the weights land in memory differs
    from process to process, and one process per side would carry its luck into every run."""
    rows, workers, current = [], start(), 0
    try:
        for repeat, index, prompt, order in interleaved(prompts, list(workers), repeats):
            if fresh and repeat != current:
                close_all(workers)
                workers, current = start(), repeat
            for count in threads:
                for side in order:
                    for method in methods:
                        out = workers[side].run(prompt=prompt, method=method, threads=count,
                                                max_new_tokens=max_new_tokens)
                        rows.append({"side": side, "threads": count, "method": method, "prompt": index,
                                     "repeat": repeat, **out})
            print(f"prompt {index + 1}/{len(prompts)}, repeat {repeat + 1}/{repeats}", flush=True)
    finally:
        close_all(workers)
    return pd.DataFrame(rows)


def close_all(workers: dict[str, Worker]) -> None:
    for worker in workers.values():
        worker.close()


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per side, threads and method: median tok/s, acceptance, and the geometric mean of ÷ AR per prompt."""
    ar = rows[rows.method == REFERENCE].set_index(["side", "threads", "prompt", "repeat"])["tokens_per_s"]
    out = []
    for (side, threads, method), group in rows.groupby(["side", "threads", "method"], sort=False):
        ratios = [row.tokens_per_s / ar[(side, threads, row.prompt, row.repeat)] for row in group.itertuples()]
        out.append({"side": side, "threads": threads, "method": method,
                    "tokens_per_s": statistics.median(group.tokens_per_s),
                    "over_ar": math.exp(statistics.fmean(math.log(r) for r in ratios)),
                    "acceptance": group.acceptance_rate.mean()})
    return pd.DataFrame(out)


def paired(rows: pd.DataFrame, confidence: float = 0.95, seed: int = 0) -> pd.DataFrame:
    """Per threads and method, the change against the base on the same (prompt, repeat): the
    geometric mean of change ÷ base for tok/s and for the speedup over AR, each with a bootstrap
    interval (`log_interval`), and whether the interval excludes 1."""
    keyed = rows.set_index(["side", "threads", "method", "prompt", "repeat"])["tokens_per_s"]
    over_ar = keyed / keyed.xs(REFERENCE, level="method").reindex(keyed.index.droplevel("method")).to_numpy()
    out = []
    for (threads, method), _ in rows.groupby(["threads", "method"], sort=False):
        entry = {"threads": threads, "method": method}
        for name, values in (("tokens_per_s", keyed), ("over_ar", over_ar)):
            if name == "over_ar" and method == REFERENCE:
                continue
            sides = values.xs((threads, method), level=("threads", "method")).unstack("side")
            cells = np.log(sides["change"] / sides["base"]).unstack("repeat").to_numpy()  # prompts × repeats
            low, high = log_interval(cells, confidence, seed)
            entry[f"{name} change ÷ base"] = math.exp(cells.mean())
            entry[f"{name} interval"] = f"[{math.exp(low):.3f}, {math.exp(high):.3f}]"
            entry[f"{name} verdict"] = verdict(low, high, repeats=cells.shape[1])
        out.append(entry)
    return pd.DataFrame(out)


ONE_REPEAT = "no verdict: one repeat (its pair of processes stands for all; use --repeats 3 or more)"


def verdict(low: float, high: float, repeats: int) -> str:
    """"faster" or "slower" where the interval of the log ratio excludes 0. With one repeat, every
    run of a side shared one worker process, whose speed the interval cannot sample: two processes
    of the same code differed by up to 30 % here, so a single repeat gives no verdict."""
    if repeats < 2:
        return ONE_REPEAT
    return "faster" if low > 0 else "slower" if high < 0 else "no difference shown"


def log_interval(cells: np.ndarray, confidence: float, seed: int, resamples: int = 4000) -> tuple[float, float]:
    """A bootstrap interval for the mean log ratio over a prompts × repeats table, resampling the
    repeats and then the prompts. Each repeat ran in its own pair of worker processes, so the
    repeats carry the processes' luck: resampling the prompts alone would take a run's few
    processes for the whole population and give too narrow an interval."""
    prompts, repeats = cells.shape
    if cells.size < 2 or np.ptp(cells) == 0:
        return float(cells.mean()), float(cells.mean())
    rng = np.random.default_rng(seed)
    means = [cells[np.ix_(rng.integers(0, prompts, prompts), rng.integers(0, repeats, repeats))].mean()
             for _ in range(resamples)]
    tail = (1.0 - confidence) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


def same_tokens(rows: pd.DataFrame) -> bool:
    """Whether both sides wrote the same tokens for every (threads, method, prompt, repeat)."""
    keyed = rows.assign(tokens=rows.tokens.map(tuple)).set_index(["threads", "method", "prompt", "repeat", "side"])
    sides = keyed.tokens.unstack("side")
    return bool((sides.nunique(axis=1) == 1).all())


def suite_prompts(per_category: int) -> list[str]:
    """The first turn of `per_category` prompts of each category of the built-in suite."""
    items = select_prompts(load_suite(DEFAULT_SUITE), limit=per_category)
    return [conversation(item, 1, []).prompt for item in items]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdemo.bench.ab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare against (e.g. a commit or HEAD~3)")
    parser.add_argument("--methods", default="ar,sd,egag", help="comma-separated (default ar,sd,egag; ar is needed)")
    parser.add_argument("--threads", default="1,2", help="torch thread counts, comma-separated (default 1,2)")
    parser.add_argument("--per-category", type=int, default=1, help="suite prompts per category (default 1)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="each in new worker processes (default 3; one repeat gives no verdict)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--preset", default="embedded")
    parser.add_argument("--runtime", default="torch", help="what runs the target on both sides: torch or onnx")
    parser.add_argument("--one-process", action="store_true",
                        help="keep one worker per side for every repeat (default: new workers each repeat)")
    parser.add_argument("--csv", default=None, help="write every run here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    if REFERENCE not in methods:
        raise SystemExit("--methods must include ar: every speedup is a ratio to AR on the same prompt")
    prompts = suite_prompts(args.per_category)
    with tempfile.TemporaryDirectory(prefix="specdemo-ab-") as folder:
        base = export_revision(args.base, Path(folder))

        def start() -> dict[str, Worker]:
            return {side: Worker.start(side, tree, args.preset, args.runtime)
                    for side, tree in (("base", base), ("change", ROOT))}

        rows = measure(start, prompts, methods, [int(t) for t in args.threads.split(",")], args.repeats,
                       args.max_new_tokens, fresh=not args.one_process)
    if args.csv:
        rows.to_csv(args.csv, index=False)
    print(f"\nbase {args.base} against this tree; {len(prompts)} prompts × {args.repeats}, "
          f"{args.max_new_tokens} new tokens, greedy, the target on {args.runtime}")
    print(markdown(summarize(rows), digits=3))
    print(f"\nthis tree ÷ base on the same prompt and repeat, geometric mean, 95 % bootstrap interval over repeats "
          "and prompts:")
    print(markdown(paired(rows), digits=3))
    print(f"\nsame tokens on both sides: {'yes' if same_tokens(rows) else 'NO'}")
    return 0


if __name__ == "__main__": raise SystemExit(main())
