"""The learning curve that picks the draft: held-out acceptance against training tokens.

    python -m specdemo.training.curve --fractions 0.1,0.3,1 --out FOLDER [--install]

Trains a feature head on growing slices of the corpus (the first 10 %, 30 %, 100 % of its
shards), measures each on the held-out prompts (greedy rounds replayed at γ = 4, the chat
template, answers by the decode loop's AR) and the cost of a draft step on one thread, and
measures the previous draft LM the same way for comparison. Writes `curve.csv`, `curve.html`
(Plotly) and, with `--install`, puts the head trained on everything into the package with
its model card.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

import torch

from specdemo.engine.drafters.feature_head import FeatureHead
from specdemo.models.tokens import cpu_name

from .corpus import Corpus, default_dir
from .eagle import add_recipe_arguments, read_sequences, recipe, train_head
from .evaluate import (greedy_answers, heldout_acceptance, heldout_agreement, round_speedup, step_cost,
                       verification_cost)
from .prompts import heldout_prompts
from ..engine.methods import FIXED_GAMMA


def lm_draft_point(pair_lm, answers, gamma: int) -> dict:
    """The previous draft LM, through the real decode loop (greedy SD on the same prompts)."""
    from specdemo import generate

    drafted = accepted = rounds = new = 0
    for prompt, answer in answers:
        result = generate(pair_lm, prompt, method=FIXED_GAMMA, gamma=gamma, max_new_tokens=len(answer), temperature=0.0)
        assert result.token_ids == answer, "greedy SD must equal AR"
        drafted += result.stats["drafted"]
        accepted += result.stats["accepted"]
        rounds += len(result.rounds)
        new += len(result.token_ids)
    return {"acceptance": round(accepted / max(1, drafted), 4), "tokens_per_round": round(new / max(1, rounds), 3)}


def lm_draft_cost(pair_lm, calls: int = 60, context: int = 96) -> float:
    from specdemo.engine.clock import interleaved_medians
    from specdemo.engine.targets.lm import CachedLM

    ids = torch.randint(0, pair_lm.target.config.vocab_size, (context,)).tolist()
    target, draft = CachedLM(pair_lm.target), CachedLM(pair_lm.draft)

    def step(lm):
        def call():
            lm.logits(ids + [5], 1).argmax().item()
            lm.rollback(context)
        return call

    with torch.inference_mode():
        target.prefill(ids)
        draft.prefill(ids)
        medians = interleaved_medians({"target_step": step(target), "draft_step": step(draft)}, calls)
    return medians["draft_step"] / medians["target_step"]


def extrapolate(rows: list[dict], key: str, goal: float, by: str = "train_answer_tokens") -> dict | None:
    """A straight line through (log2 rows[by], rows[key]), `by` the training answer tokens or the
    distinct training requests: its gain per doubling and the size at which it reaches `goal`.
    None with fewer than two sizes or a line that does not rise. A straight line in log-size is
    the optimistic reading of a curve that usually bends down, so the size it names is a lower
    bound."""
    import numpy as np

    rows = [r for r in rows if r.get(by)]
    sizes = sorted({r[by] for r in rows})
    if len(sizes) < 2:
        return None
    x = np.log2([r[by] for r in rows])
    slope, intercept = np.polyfit(x, [r[key] for r in rows], 1)
    if slope <= 0:
        return None
    needed = int(2 ** ((goal - intercept) / slope))
    reading = {"measure": key, "goal": goal, "gain_per_doubling": round(float(slope), 4)}
    return {**reading, "tokens_needed": needed} if by == "train_answer_tokens" else {
        **reading, "by": by, "needed": needed}


def candidate_name(point: dict) -> str:
    if point.get("keep") is not None:
        return f"carved draft (target layers {', '.join(str(k) for k in point['keep'])})"
    return point.get("name", "candidate")


def figure(rows: list[dict], lm_point: dict | None, candidates: list[dict] = ()):
    """Acceptance against the training answer tokens (left) and against the distinct training
    requests (right): a head that learns templates rises with tokens, one that generalises
    with requests."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=("against training answer tokens", "against distinct training requests"))
    for col, by in ((1, "train_answer_tokens"), (2, "train_requests")):
        first = col == 1
        heads = [r for r in rows if r.get(by)]
        xs = [r[by] for r in heads]
        fig.add_trace(go.Scatter(x=xs, y=[r["acceptance"] for r in heads], mode="lines+markers",
                                 name="feature head: acceptance", legendgroup="head", showlegend=first,
                                 line=dict(color="#636efa")), row=1, col=col)
        fig.add_trace(go.Scatter(x=xs, y=[r["tokens_per_round"] / 5 for r in heads], mode="lines+markers",
                                 name="feature head: tokens per round ÷ 5", legendgroup="tpr", showlegend=first,
                                 line=dict(dash="dot", color="#00cc96")), row=1, col=col)
        if lm_point and lm_point.get(by):
            fig.add_trace(go.Scatter(x=[lm_point[by]], y=[lm_point["acceptance"]], mode="markers",
                                     marker=dict(symbol="x", size=12, color="#ef553b"), legendgroup="lm",
                                     showlegend=first, name="previous draft LM: acceptance"), row=1, col=col)
        for i, c in enumerate(candidates):
            if c.get(by):
                fig.add_trace(go.Scatter(x=[c[by]], y=[c["acceptance"]], mode="markers",
                                         marker=dict(symbol="diamond", size=11), legendgroup=f"candidate-{i}",
                                         showlegend=first, name=f"{candidate_name(c)}: acceptance"), row=1, col=col)
        fig.update_xaxes(type="log", title_text="training answer tokens" if first else "distinct training requests",
                         row=1, col=col)
    fig.add_hline(y=0.40, line_dash="dash", annotation_text="target acceptance 0.40")
    fig.update_yaxes(title_text="acceptance (accepted ÷ drafted)", row=1, col=1)
    fig.update_layout(title="Held-out greedy acceptance at γ = 4", template="plotly_white")
    return fig


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specdemo.training.curve", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=default_dir())
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fractions", default="0.1,0.3,1")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--tokens-per-batch", type=int, default=1024)
    parser.add_argument("--cls-weight", type=float, default=1.0)
    parser.add_argument("--subset", type=int, default=8192)
    parser.add_argument("--init", choices=["target", "random"], default="random",
                        help="the decoder layer's start: random (the default: it learned faster on this "
                             "corpus) or the target's last layer")
    parser.add_argument("--prompt-loss", action="store_true",
                        help="the head also learns from the requests' positions (see training.eagle)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--max-minutes", type=float, help="training time cap per slice")
    parser.add_argument("--threads", type=int, default=1, help="threads for the cost measurements (the budget is one)")
    parser.add_argument("--train-threads", type=int, help="threads while training (default: --threads)")
    parser.add_argument("--notes", default="", help="a paragraph for the model card (e.g. an ablation's outcome)")
    parser.add_argument("--data-note", default="", help="a sentence for the card's data section (how long it took)")
    parser.add_argument("--append", action="store_true", help="keep the slices already in OUT/curve.csv")
    parser.add_argument("--candidate", type=Path, action="append", default=[],
                        help="a point of another draft measured on the same held-out answers (e.g. carve.py's "
                             "carved.json), drawn and tabled beside the head; repeatable")
    parser.add_argument("--passages", type=Path,
                        help="a text corpus (python -m specdemo.training.passages) added whole to every slice's training")
    parser.add_argument("--start-from", type=Path, help="continue this head (its folder) instead of starting anew")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-steps", type=int, help="stop each slice's training after this many steps")
    parser.add_argument("--label", help="name the points of this run (as a --candidate of another curve)")
    parser.add_argument("--install", action="store_true", help="put the last head into the package, with its card")
    add_recipe_arguments(parser)
    args = parser.parse_args(argv)
    return args


def heldout_answers(pair, out: Path, max_new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """The target's greedy answers to the held-out prompts, cached in `out`: they depend only on
    the prompts and the length."""
    cached = out / f"heldout-answers-{max_new_tokens}.json"
    if cached.is_file():
        return [tuple(a) for a in json.loads(cached.read_text())]
    answers = greedy_answers(pair, heldout_prompts(), max_new_tokens)
    cached.write_text(json.dumps(answers))
    return answers


def train_slices(args, target, corpus: Corpus, answers, verify_cost: float) -> tuple[list[dict], FeatureHead | None]:
    """A head trained on each slice of the corpus, saved with its measured point; the points and
    the last head."""
    rows = []
    head = None
    passages = (read_sequences(Corpus(args.passages), read=True, feature_layers=args.feature_layers)
                if args.passages else [])
    start_from = FeatureHead.load(args.start_from) if args.start_from else None
    for fraction in [float(f) for f in args.fractions.split(",")]:
        sequences = read_sequences(corpus, fraction, feature_layers=args.feature_layers)
        torch.set_num_threads(args.train_threads or args.threads)
        head, info = train_head(target, sequences, subset_size=args.subset, epochs=args.epochs,
                                tokens_per_batch=args.tokens_per_batch, cls_weight=args.cls_weight, init=args.init, lr=args.lr,
                                prompt_loss=args.prompt_loss, max_minutes=args.max_minutes, passages=passages,
                                start_from=start_from, max_steps=args.max_steps, **recipe(args),
                                log=lambda m: print(m, flush=True))
        torch.set_num_threads(args.threads)
        head.save(args.out / f"head-{fraction:g}", extra={"training": {**info, "fraction": fraction}})
        point = {"fraction": fraction, **info, **heldout_acceptance(head, target, answers, args.gamma),
                 **heldout_agreement(head, target, answers), **step_cost(head, target)}
        point["predicted_speedup"] = round_speedup(point["tokens_per_round"], point["cost_ratio"], args.gamma,
                                                   verify_cost)
        if args.label:
            point["name"] = args.label
        (args.out / f"head-{fraction:g}" / "point.json").write_text(json.dumps(point, indent=1))
        rows.append(point)
        print(json.dumps(point), flush=True)
    return rows, head


def previous_draft_lm_point(pair, answers, args, verify_cost: float) -> dict:
    """The previous draft LM measured on the same answers (cached in --out), with its speedup."""
    lm_cached = args.out / f"previous-draft-{args.max_new_tokens}-{args.gamma}.json"
    if lm_cached.is_file():
        lm_point = json.loads(lm_cached.read_text())
    else:
        lm_point = {**lm_draft_point(pair, answers, args.gamma), "cost_ratio": round(lm_draft_cost(pair), 4)}
        card_path = Path(str(pair.draft.name_or_path)) / "training_info.json"
        lm_point["train_answer_tokens"] = json.loads(card_path.read_text()).get("data", {}).get(
            "response_tokens", 0) if card_path.is_file() else 0
        lm_cached.write_text(json.dumps(lm_point))
    lm_point["predicted_speedup"] = round_speedup(lm_point["tokens_per_round"], lm_point["cost_ratio"], args.gamma,
                                                  verify_cost)
    print(json.dumps({"previous draft LM": lm_point}), flush=True)
    return lm_point


def write_curve(args, rows: list[dict], lm_point: dict, verify_cost: float) -> tuple[list[dict], list[dict]]:
    """curve.csv (with --append, the slices an earlier run measured too) and curve.html; every
    point, sorted by size, and the --candidate points drawn beside them."""
    import pandas as pd

    previous = args.out / "curve.csv"
    if args.append and previous.is_file():  # slices measured by an earlier (or a parallel) run
        mine = {r["train_answer_tokens"] for r in rows}
        rows = rows + [r for r in pd.read_csv(previous).to_dict("records") if r["train_answer_tokens"] not in mine]
    rows.sort(key=lambda r: r["train_answer_tokens"])
    pd.DataFrame(rows).to_csv(args.out / "curve.csv", index=False)
    candidates = [json.loads(path.read_text()) for path in args.candidate]
    for c in candidates:
        c["name"] = candidate_name(c)
        c["predicted_speedup"] = round_speedup(c["tokens_per_round"], c["cost_ratio"], args.gamma, verify_cost)
    figure(rows, lm_point, candidates).write_html(args.out / "curve.html", include_plotlyjs="cdn")
    return rows, candidates


def summarise(args, argv, corpus: Corpus, answers, verify_cost: float, rows: list[dict], lm_point: dict,
              candidates: list[dict]) -> dict:
    """curve.json: everything the model card is written from (`card.py`)."""
    summary = {"curve": rows, "previous_draft_lm": lm_point, "candidates": candidates, "corpus": corpus.manifest(),
               "held_out_prompts": len(answers), "gamma": args.gamma, "max_new_tokens": args.max_new_tokens,
               "verify_cost": verify_cost,
               "extrapolation": [e for e in (extrapolate(rows, "acceptance", 0.40),
                                             extrapolate(rows, "tokens_per_round", 2.6),
                                             extrapolate(rows, "acceptance", 0.40, by="train_requests")) if e],
               "machine": {"cpu": cpu_name(), "cores": os.cpu_count(),
                           "threads": args.threads, "train_threads": args.train_threads or args.threads,
                           "torch": torch.__version__, "python": sys.version.split()[0]},
               "command": "python -m specdemo.training.curve " + " ".join(
                   a for a in (argv or sys.argv[1:]) if a not in {"--notes", args.notes, "--data-note", args.data_note}),
               "notes": args.notes, "data_note": args.data_note}
    if args.passages:
        text_corpus = Corpus(args.passages)
        sources = text_corpus.root / "sources.json"
        summary["passages"] = {**text_corpus.manifest(),
                               "sources": json.loads(sources.read_text()) if sources.is_file() else {}}
    (args.out / "curve.json").write_text(json.dumps(summary, indent=1))
    return summary


def install(head: FeatureHead, out: Path, rows: list[dict], summary: dict) -> None:
    """Put the head trained last into the package with its curve and card; the card's changelog
    carries that of the head it replaces."""
    from specdemo.models.embedded import HEAD_DIR

    from .card import install_card

    card = HEAD_DIR / "card.json"
    replaced = json.loads(card.read_text(encoding="utf-8")) if card.is_file() else None
    if HEAD_DIR.exists():
        shutil.rmtree(HEAD_DIR)
    head.save(HEAD_DIR, extra={"training": rows[-1]})  # the largest slice: the head trained last
    shutil.copy(out / "curve.html", HEAD_DIR / "curve.html")
    shutil.copy(out / "curve.csv", HEAD_DIR / "curve.csv")
    install_card(HEAD_DIR, summary, replaces=replaced)  # the card and card.json, which regenerates it
    print(f"installed the head in {HEAD_DIR}")


def main(argv=None) -> int:
    from specdemo.models import load_pair

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    pair = load_pair("embedded", draft="embedded-lm", runtime="torch")
    for p in pair.target.parameters():
        p.requires_grad_(False)
    answers = heldout_answers(pair, args.out, args.max_new_tokens)
    verify_cost = verification_cost(pair.target, args.gamma + 1)
    corpus = Corpus(args.corpus)
    rows, head = train_slices(args, pair.target, corpus, answers, verify_cost)
    lm_point = previous_draft_lm_point(pair, answers, args, verify_cost)
    rows, candidates = write_curve(args, rows, lm_point, verify_cost)
    summary = summarise(args, argv, corpus, answers, verify_cost, rows, lm_point, candidates)
    if args.install and head is not None:
        install(head, args.out, rows, summary)
    return 0


if __name__ == "__main__": raise SystemExit(main())
