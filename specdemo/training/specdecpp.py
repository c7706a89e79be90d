"""Training SpecDec++'s acceptance-prediction head from traces of the target and its draft.

    python -m specdemo.training.specdecpp [--prompts 120] [--gamma 8] [--max-new-tokens 64]
        [--traces traces.csv] [--answers answers.jsonl] [--out specdemo/models/assets/specdecpp-head]

Greedy SD with a long fixed γ (and no copying from the context) runs on requests from
`training.prompts` (never the held-out ones or the benchmark's suite). Each drafted token up to
a round's first rejection becomes one example: the drafter's statistics at its position
(engine.acceptance_head.FEATURES, exactly what the per-token hook sees while drafting) and
whether the target refused it. Under greedy decoding q of a draft is the drafter's top
probability, so the trace alone gives every feature. The head is trained with a logistic loss
on the examples of 80 % of the requests and evaluated on the rest; the traces are cached as
CSV (resumable), the target's answers as JSONL (a corpus for REST's datastore, too), and the
head, its config and its model card are written to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import pandas as pd
import torch

from ..engine.drafters.acceptance_head import DEFAULT_HEAD, FEATURES, AcceptanceHead, round_features
from ..models.tokens import encode_messages
from .prompts import build_prompts
from ..engine.methods import FIXED_GAMMA

SPLIT_SEED = 0


def round_examples(rnd) -> list[dict]:
    """The decided drafts of one round: their features (FEATURES) and whether each was refused."""
    out, lowest, last_q = [], 1.0, None
    for position, decision in enumerate(rnd.decisions):
        if not decision.decided:
            break
        top = float(decision.q)  # greedy: the draft is the drafter's argmax, so q is its top probability
        lowest = min(lowest, top)
        features = round_features(float(rnd.draft_entropies[position]), top, position, last_q, lowest)
        out.append({**dict(zip(FEATURES, features)), "rejected": int(not decision.accepted)})
        last_q = top
    return out


def collect(pair, requests: list[dict], gamma: int, max_new_tokens: int, done: set[int] = frozenset(),
            on_request=None) -> None:
    """Run greedy SD on each request not in `done`; on_request(index, request, examples, answer) after each."""
    import specdemo

    for index, request in enumerate(requests):
        if index in done:
            continue
        messages = [(m["role"], m["content"]) for m in request["messages"]]
        ids = encode_messages(pair.tokenizer, messages)
        result = specdemo.generate(pair, ids, method=FIXED_GAMMA, gamma=gamma, copy_n=0, max_new_tokens=max_new_tokens)
        examples = [e for rnd in result.rounds if rnd.source != "copy" for e in round_examples(rnd)]
        on_request(index, request, examples, result.text)


def auc(scores: pd.Series, labels: pd.Series) -> float:
    """The probability that a refused draft scores above a kept one (ties count half)."""
    ranks = scores.rank()
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if not positives or not negatives:
        return math.nan
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def split(traces: pd.DataFrame, share: float = 0.8) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train and held-out examples, split by request so no request is on both sides."""
    requests = traces.request.drop_duplicates().sample(frac=1.0, random_state=SPLIT_SEED)
    train_ids = set(requests.iloc[: int(len(requests) * share)])
    mask = traces.request.isin(train_ids)
    return traces[mask], traces[~mask]


def train_head(train: pd.DataFrame, hidden: int = 48, steps: int = 150, seed: int = 0,
               lr: float = 3e-3) -> AcceptanceHead:
    """Full-batch Adam on the logistic loss; features standardised by the training set's mean and std."""
    torch.manual_seed(seed)
    x = torch.tensor(train[list(FEATURES)].to_numpy(), dtype=torch.float32)
    y = torch.tensor(train.rejected.to_numpy(), dtype=torch.float32)
    head = AcceptanceHead(hidden, x.mean(0).tolist(), x.std(0).clamp_min(1e-6).tolist())
    optimizer = torch.optim.Adam(head.parameters(), lr=lr, weight_decay=1e-4)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(head(x), y)
        loss.backward()
        optimizer.step()
    return head.eval()


def evaluate(head: AcceptanceHead, frame: pd.DataFrame) -> dict:
    """Log-loss, AUC and calibration of the head on examples, beside the entropy's own AUC."""
    with torch.inference_mode():
        logits = head(torch.tensor(frame[list(FEATURES)].to_numpy(), dtype=torch.float32))
    predicted = torch.sigmoid(logits)
    labels = torch.tensor(frame.rejected.to_numpy(), dtype=torch.float32)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
    base = float(labels.mean())
    base_loss = -(base * math.log(max(base, 1e-9)) + (1 - base) * math.log(max(1 - base, 1e-9)))
    return {"examples": len(frame), "rejected_share": base, "log_loss": float(loss), "constant_log_loss": base_loss,
            "auc": auc(pd.Series(predicted.numpy()), frame.rejected.reset_index(drop=True)),
            "entropy_auc": auc(frame.entropy.reset_index(drop=True), frame.rejected.reset_index(drop=True)),
            "mean_predicted": float(predicted.mean())}


def _read_done(traces: Path, answers: Path) -> tuple[list[dict], set[int]]:
    """Examples and finished requests of an earlier run (a request is finished once its answer is written)."""
    if not answers.is_file():
        return [], set()
    done = {json.loads(line)["request"] for line in answers.read_text(encoding="utf-8").splitlines() if line}
    rows = pd.read_csv(traces).to_dict("records") if traces.is_file() and traces.stat().st_size else []
    return [r for r in rows if r["request"] in done], done


def gather(pair, count: int, gamma: int, max_new_tokens: int, traces: Path, answers: Path, seed: int,
           traced: int | None = None) -> pd.DataFrame:
    """The traces of the first `traced` (default: all) of `count` requests, resuming from the files an
    earlier run left."""
    rows, done = _read_done(traces, answers)
    requests = build_prompts(count, seed=seed)[:traced]
    started = time.perf_counter()

    def keep(index, request, examples, answer):
        rows.extend({"request": index, **e} for e in examples)
        pd.DataFrame(rows, columns=["request", *FEATURES, "rejected"]).to_csv(traces, index=False)
        with answers.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"request": index, "category": request.get("category", ""), "text": answer}) + "\n")
        print(f"request {index + 1}/{len(requests)}: {len(examples)} drafts ({time.perf_counter() - started:.0f} s)", flush=True)

    traces.parent.mkdir(parents=True, exist_ok=True)
    collect(pair, requests, gamma, max_new_tokens, done, keep)
    return pd.DataFrame(rows, columns=["request", *FEATURES, "rejected"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m specdemo.training.specdecpp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="embedded", help="the model pair (a preset; default: embedded)")
    parser.add_argument("--prompts", type=int, default=120, help="training requests to trace (default: 120)")
    parser.add_argument("--trace", type=int, default=None, help="trace only the first N of those requests")
    parser.add_argument("--seed", type=int, default=7, help="the requests' seed (default: 7)")
    parser.add_argument("--gamma", type=int, default=8, help="SD's fixed γ while tracing (default: 8)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per answer (default: 64)")
    parser.add_argument("--hidden", type=int, default=48, help="the head's hidden width (default: 48)")
    parser.add_argument("--steps", type=int, default=150, help="training steps (default: 150; more overfit 2,000-odd examples)")
    parser.add_argument("--traces", default="results/specdecpp/traces.csv", help="the traces' CSV (resumable)")
    parser.add_argument("--answers", default="results/specdecpp/answers.jsonl", help="the target's answers (JSONL)")
    parser.add_argument("--out", default=str(DEFAULT_HEAD), help="where the head and its card go")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import specdemo

    pair = specdemo.load_pair(args.pair, device="cpu", runtime="torch")
    traces = gather(pair, args.prompts, args.gamma, args.max_new_tokens, Path(args.traces), Path(args.answers),
                    args.seed, args.trace)
    train, heldout = split(traces)
    started = time.perf_counter()
    head = train_head(train, args.hidden, args.steps)
    seconds = time.perf_counter() - started
    report = {"train": evaluate(head, train), "heldout": evaluate(head, heldout)}
    recipe = {"pair": args.pair, "requests": int(traces.request.nunique()), "pool": args.prompts,
              "request_seed": args.seed, "gamma": args.gamma,
              "max_new_tokens": args.max_new_tokens, "steps": args.steps, "train_seconds": round(seconds, 1),
              "parameters": sum(p.numel() for p in head.parameters())}
    head.save(args.out, recipe=recipe, evaluation=report)
    from .specdecpp_card import write_card

    write_card(Path(args.out), recipe, report)
    print(json.dumps({"recipe": recipe, **report}, indent=1))


if __name__ == "__main__": main()
