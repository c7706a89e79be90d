"""Online speculative decoding (OSD): the draft head learns from the target between requests.

Over a stream of prompts, each request is decoded with SD (the timed part, as any run), and
then, off the timed path, the pair's feature head takes a few distillation steps on what the
target just verified: its hidden states over the prompt and the answer (one teacher-forced
forward) and its next-token distributions, with the loss that trains the head offline
(`training.eagle.head_losses`). The target still verifies every draft, so outputs stay the
target's (greedy: AR's tokens). The same stream is run once with a frozen head, so that the
acceptance of the adapted head is read against the same prompts in the same order.

    python -m specdemo.training.osd [--prompts 50] [--max-new-tokens 64] [--out results/osd]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import random
import time
from pathlib import Path

import pandas as pd
import torch

from ..engine.feature_head import FeatureHead
from ..bench.suite import DEFAULT_SUITE, SuitePrompt, encode_prompt, load_suite

STREAM_COLUMNS = ["run", "index", "prompt_id", "category", "drafted", "accepted", "acceptance", "new_tokens",
                  "seconds", "update_seconds", "loss"]


def adapted_pair(pair):
    """The pair with a copy of its head, so updates never reach the loaded pair."""
    if not isinstance(pair.draft, FeatureHead):
        raise ValueError("osd: the pair must draft with a feature head (e.g. the embedded pair)")
    head = copy.deepcopy(pair.draft)
    head.bind(pair.target)
    return dataclasses.replace(pair, draft=head)


def target_features(pair, ids: list[int]) -> torch.Tensor:
    """[len(ids) − 1, d]: the target's final states at every position but the last."""
    with torch.inference_mode():
        body = pair.target.get_decoder() if hasattr(pair.target, "get_decoder") else pair.target.model
        states = body(input_ids=torch.tensor([ids], device=pair.device)).last_hidden_state[0, :-1]
    return states.float().clone()


def distil(pair, ids: list[int], answer_start: int, optimizer, steps: int, unroll: int = 2,
           cls_weight: float = 1.0) -> float:
    """A few steps on the head over one verified sequence, with the installed head's loss (the
    distribution term weighted `cls_weight`); the last step's loss."""
    from .eagle import Sequence, collate, head_losses

    head = pair.draft
    sequence = Sequence(torch.tensor(ids), target_features(pair, ids), answer_start, "stream")
    batch = collate([sequence])
    batch["features"] = batch["features"].to(head.fc.weight.dtype)
    head.train()
    loss = torch.zeros(())
    for _ in range(steps):
        optimizer.zero_grad()
        loss, _ = head_losses(head, batch, noise=0.0, unroll=unroll, cls_weight=cls_weight)
        loss.backward()
        optimizer.step()
    head.eval()
    return float(loss.detach())


def run_stream(pair, prompts: list[SuitePrompt], *, adapt: bool, lr: float = 1e-4, steps: int = 2, gamma: int = 4,
               max_new_tokens: int = 64, chat: bool = True, cls_weight: float = 1.0):
    """Decode the prompts in order (SD, γ fixed, no copying), updating a copy of the head after each
    when `adapt`; yield one row (STREAM_COLUMNS) per request."""
    import specdemo

    pair = adapted_pair(pair)
    trainable = [p for p in pair.draft.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=lr) if adapt else None
    for index, item in enumerate(prompts):
        ids = encode_prompt(pair, item, chat)
        result = specdemo.generate(pair, ids, method="sd", gamma=gamma, copy_n=0, max_new_tokens=max_new_tokens)
        stats = result.stats
        row = {"run": "adapted" if adapt else "frozen", "index": index, "prompt_id": item.id,
               "category": item.category, "drafted": stats["drafted"], "accepted": stats["accepted"],
               "acceptance": stats["accepted"] / stats["drafted"] if stats["drafted"] else float("nan"),
               "new_tokens": len(result.token_ids), "seconds": result.seconds, "update_seconds": 0.0,
               "loss": float("nan")}
        if adapt:
            started = time.perf_counter()
            row["loss"] = distil(pair, ids + list(result.token_ids), len(ids), optimizer, steps, cls_weight=cls_weight)
            row["update_seconds"] = time.perf_counter() - started
        yield row


def stream_prompts(count: int, seed: int = 0, suite=DEFAULT_SUITE) -> list[SuitePrompt]:
    """`count` suite prompts in a shuffled order (the suite is sorted by category; a stream is not)."""
    prompts = [p for p in load_suite(suite) if p.turn_count == 1]
    random.Random(seed).shuffle(prompts)
    return prompts[:count]


def first_last(rows: pd.DataFrame, window: int = 10) -> pd.DataFrame:
    """Pooled acceptance (accepted / drafted) over the first and the last `window` requests of each run."""
    out = []
    for run, part in rows.groupby("run", sort=False):
        part = part.sort_values("index")
        first, last = part.head(window), part.tail(window)
        out.append({"run": run, f"first_{window}": first.accepted.sum() / first.drafted.sum(),
                    f"last_{window}": last.accepted.sum() / last.drafted.sum(),
                    "update_seconds_per_request": part.update_seconds.mean(),
                    "decode_seconds_per_request": part.seconds.mean()})
    return pd.DataFrame(out)


def stream_figure(rows: pd.DataFrame, window: int = 10):
    """Acceptance per request and its rolling mean over `window` requests, frozen against adapted."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for run, part in rows.groupby("run", sort=False):
        part = part.sort_values("index")
        rolling = part.accepted.rolling(window, min_periods=1).sum() / part.drafted.rolling(window, min_periods=1).sum()
        fig.add_scatter(x=part["index"] + 1, y=part.acceptance, mode="markers", name=f"{run}: per request",
                        opacity=0.4)
        fig.add_scatter(x=part["index"] + 1, y=rolling, mode="lines", name=f"{run}: last {window} requests")
    fig.update_layout(title="OSD: acceptance over a stream of prompts", xaxis_title="request",
                      yaxis_title="acceptance rate", template="plotly_white")
    return fig


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdemo.training.osd", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="embedded", help="a pair that drafts with a feature head")
    parser.add_argument("--prompts", type=int, default=50, help="requests in the stream (default: 50)")
    parser.add_argument("--seed", type=int, default=0, help="the stream's order (default: 0)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=2, help="distillation steps after each request")
    parser.add_argument("--cls-weight", type=float, default=1.0,
                        help="the distribution term's weight in the loss (default 1, as the installed head was trained)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="results/osd", help="folder for stream.csv and stream.html")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import specdemo

    pair = specdemo.load_pair(args.pair, device="cpu")
    prompts = stream_prompts(args.prompts, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    # Frozen and adapted side by side, request by request: a stream cut short still compares both.
    streams = [run_stream(pair, prompts, adapt=adapt, lr=args.lr, steps=args.steps, gamma=args.gamma,
                          max_new_tokens=args.max_new_tokens, cls_weight=args.cls_weight) for adapt in (False, True)]
    for pair_of_rows in zip(*streams):
        for row in pair_of_rows:
            rows.append(row)
            print(f"{row['run']} {row['index'] + 1}/{len(prompts)}: acceptance {row['acceptance']:.2f}", flush=True)
        pd.DataFrame(rows, columns=STREAM_COLUMNS).to_csv(out / "stream.csv", index=False)
    frame = pd.DataFrame(rows, columns=STREAM_COLUMNS)
    stream_figure(frame).write_html(out / "stream.html", include_plotlyjs="cdn")
    print(first_last(frame).to_string(index=False, float_format="{:.3f}".format))


if __name__ == "__main__":
    main()
