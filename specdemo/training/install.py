"""The install rule: a head trained elsewhere replaces the shipped one only when it is better on the CPU.

    python -m specdemo.training.install DIR [--threads 1] [--answers FOLDER] [--dry-run]

DIR is what `at_scale` leaves (DIR/head, DIR/card.json, the curve). Both heads are measured here,
on the CPU, as `training.evaluate` measures a head: greedy rounds replayed at γ = 4 over the
target's own answers to the 37 held-out prompts and to the benchmark suite's 50 requests. The new
head is installed only when its acceptance is higher on both; then its card is regenerated from
DIR's card.json with the CPU's figures, and the README's head table with it. Either way the
decision and both heads' figures go to DIR/install.json, with the reason.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import torch

from specdemo.engine.drafters.feature_head import FeatureHead

from .card import install_card
from .evaluate import heldout_acceptance, heldout_agreement, outside_subset_share, step_cost

SETS = ("heldout", "suite")
README = Path(__file__).resolve().parents[2] / "README.md"
TABLE_START, TABLE_END = "<!-- head -->", "<!-- /head -->"


def measure(head: FeatureHead, target, answer_sets: dict[str, list]) -> dict:
    """The head on each set of (prompt ids, greedy answer): acceptance, tokens per round, agreement."""
    return {name: {**heldout_acceptance(head, target, answers, 4), **heldout_agreement(head, target, answers),
                   "outside_subset": outside_subset_share(head, answers)}
            for name, answers in answer_sets.items()}


def decide(new: dict, shipped: dict) -> tuple[bool, str]:
    """Install only when the new head's acceptance is higher on every set; the reason either way."""
    worse = [f"{name} acceptance {new[name]['acceptance']:.4f} is not above the shipped head's "
             f"{shipped[name]['acceptance']:.4f}" for name in SETS if new[name]["acceptance"] <= shipped[name]["acceptance"]]
    if worse:
        return False, "refused: " + "; ".join(worse)
    return True, "installed: " + " and ".join(
        f"{name} acceptance {new[name]['acceptance']:.4f} > {shipped[name]['acceptance']:.4f}" for name in SETS)


def cpu_card(summary: dict, figures: dict, cost: dict) -> dict:
    """DIR's card summary with the head's figures as measured on this CPU (its point and the suite's)."""
    point = {**summary["installed"], **figures["heldout"], **cost}
    suite = figures["suite"]
    hand_written = {"prompts": suite["prompts"], "acceptance": suite["acceptance"],
                    "tokens_per_round": suite["tokens_per_round"], "agreement_step1": suite["heldout_agreement_step1"],
                    "agreement_step2": suite["heldout_agreement_step2"]}
    return {**summary, "curve": [point], "installed": point, "hand_written": hand_written,
            "held_out_prompts": figures["heldout"]["prompts"], "changelog": []}


def head_table(summary: dict) -> str:
    """The README's table of the shipped head: held-out prompts and suite, from its card."""
    head, suite = summary["installed"], summary["hand_written"]
    return "\n".join(["| draft head (acceptance, γ = 4) | held-out | suite |", "|---|---|---|",
                      f"| shipped | {head['acceptance']:.3f} | {suite['acceptance']:.3f} |"])


def update_readme(readme: Path, summary: dict) -> None:
    text = readme.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(TABLE_START) + ".*?" + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"{readme} has no {TABLE_START} … {TABLE_END} block for the head's table")
    readme.write_text(pattern.sub(lambda _: f"{TABLE_START}\n{head_table(summary)}\n{TABLE_END}", text), encoding="utf-8")


def install(run_dir: Path, target, answer_sets: dict[str, list], head_dir: Path, readme: Path | None,
            dry_run: bool = False, log=print) -> dict:
    """Measure DIR's head and the one in `head_dir` on `answer_sets` ({"heldout", "suite"}), and put
    DIR's head, its curve and a card with these figures into `head_dir` when it is better on both."""
    run_dir, head_dir = Path(run_dir), Path(head_dir)
    heads = {"new": FeatureHead.load(run_dir / "head").bind(target), "shipped": FeatureHead.load(head_dir).bind(target)}
    figures = {label: measure(head, target, answer_sets) for label, head in heads.items()}
    better, reason = decide(figures["new"], figures["shipped"])
    log(reason)
    decision = {"installed": better and not dry_run, "better": better, "reason": reason, **figures}
    if better and not dry_run:
        shipped_card = json.loads((head_dir / "card.json").read_text(encoding="utf-8"))
        summary = cpu_card(json.loads((run_dir / "card.json").read_text(encoding="utf-8")), figures["new"],
                           step_cost(heads["new"], target))
        for old in head_dir.iterdir():
            if old.is_file():
                old.unlink()
        for path in [*(run_dir / "head").iterdir(), run_dir / "curve.csv", run_dir / "curve.html"]:
            if path.is_file():
                shutil.copy(path, head_dir / path.name)
        install_card(head_dir, summary, replaces=shipped_card)
        if readme is not None:
            update_readme(readme, summary)
    (run_dir / "install.json").write_text(json.dumps(decision, indent=1))
    return decision


def cpu_answers(pair, folder: Path, max_new_tokens: int = 96) -> dict[str, list]:
    """The target's greedy answers (the decode loop's AR, as `evaluate` writes them) to the held-out
    prompts and the suite, cached in `folder`: they depend only on the prompts and the length."""
    from specdemo.bench.suite import DEFAULT_SUITE

    from .evaluate import greedy_answers, suite_requests
    from .prompts import heldout_prompts

    folder.mkdir(parents=True, exist_ok=True)
    sources = {"heldout": lambda: heldout_prompts(), "suite": lambda: suite_requests(pair, DEFAULT_SUITE)[0]}
    sets = {}
    for name, prompts in sources.items():
        cached = folder / f"{name}-answers-{max_new_tokens}.json"
        if not cached.is_file():
            cached.write_text(json.dumps(greedy_answers(pair, prompts(), max_new_tokens)))
        sets[name] = [tuple(a) for a in json.loads(cached.read_text())]
    return sets


def main(argv=None) -> int:
    from specdemo.models import load_pair
    from specdemo.models.embedded import HEAD_DIR

    from .corpus import default_dir

    parser = argparse.ArgumentParser(prog="python -m specdemo.training.install", description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a folder `python -m specdemo.training.at_scale` left")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--answers", type=Path, default=default_dir().parent / "answers",
                        help="where the target's greedy answers are cached")
    parser.add_argument("--dry-run", action="store_true", help="measure and decide, install nothing")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = load_pair("embedded", draft=None, runtime="torch")
    for p in pair.target.parameters():
        p.requires_grad_(False)
    readme = README if README.is_file() else None  # an installed wheel has no README to update
    decision = install(args.run, pair.target, cpu_answers(pair, args.answers), HEAD_DIR, readme, args.dry_run)
    print(json.dumps({k: decision[k] for k in ("installed", "reason")}))
    return 0 if decision["better"] else 1


if __name__ == "__main__": raise SystemExit(main())
