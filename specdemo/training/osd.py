"""Online speculative decoding (OSD) over a stream of prompts, against the same stream frozen.

Each request is decoded with the `osd` method (the timed part, as any run): SD with an online
copy of the pair's feature head, which after the request takes a few distillation steps on what
the target just verified, off the clock (`engine.online`). The same stream is run once with the
head frozen (SD, the same γ, no copying), so that the adapted head's acceptance is read against
the same prompts in the same order. The target still verifies every draft, so outputs stay the
target's (greedy: AR's tokens).

    python -m specdemo.training.osd [--prompts 50] [--max-new-tokens 64] [--out results/osd]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pandas as pd
import torch

from ..engine.drafters.feature_head import FeatureHead
from ..engine.drafters.online import forget_online, online_head
from ..engine.methods import FIXED_GAMMA, methods_reading
from ..engine.params import PARAMS
from ..bench.suite import DEFAULT_SUITE, SuitePrompt, encode_prompt, load_suite

# The method whose online head this module adapts and measures: the one that reads the head's learning rate.
ONLINE = methods_reading("osd_lr")[0]
STREAM_COLUMNS = ["run", "index", "prompt_id", "category", "drafted", "accepted", "acceptance", "new_tokens",
                  "seconds", "update_seconds", "loss"]


def run_stream(pair, prompts: list[SuitePrompt], *, adapt: bool, lr: float = PARAMS["osd_lr"].default,
               steps: int = 2, gamma: int = 4, max_new_tokens: int = 64, chat: bool = True, cls_weight: float = 1.0):
    """Decode the prompts in order (γ fixed, no copying): with `adapt`, the `osd` method from a
    fresh online copy of the head (its loss's distribution term weighted `cls_weight`), else SD
    with the loaded head; yield one row (STREAM_COLUMNS) per request."""
    import specdemo

    if not isinstance(pair.draft, FeatureHead):
        raise ValueError("osd: the pair must draft with a feature head (e.g. the embedded pair)")
    if adapt:
        forget_online(pair.draft)
        online_head(pair.draft, pair.target, lr).cls_weight = cls_weight
    method, learning = (ONLINE, {"osd_lr": lr, "osd_steps": steps}) if adapt else (FIXED_GAMMA, {})
    for index, item in enumerate(prompts):
        ids = encode_prompt(pair, item, chat)
        result = specdemo.generate(pair, ids, method=method, gamma=gamma, copy_n=0, max_new_tokens=max_new_tokens,
                                   **learning)
        stats, lesson = result.stats, result.lesson
        yield {"run": "adapted" if adapt else "frozen", "index": index, "prompt_id": item.id,
               "category": item.category, "drafted": stats["drafted"], "accepted": stats["accepted"],
               "acceptance": stats["accepted"] / stats["drafted"] if stats["drafted"] else float("nan"),
               "new_tokens": len(result.token_ids), "seconds": result.seconds,
               "update_seconds": lesson.seconds if lesson else 0.0, "loss": lesson.loss if lesson else float("nan")}


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
    parser.add_argument("--lr", type=float, default=PARAMS["osd_lr"].default)
    parser.add_argument("--steps", type=int, default=2, help="distillation steps after each request")
    parser.add_argument("--cls-weight", type=float, default=1.0,
                        help="the distribution term's weight in the loss (default 1, as the installed head was trained)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default="results/osd", help="folder for stream.csv and stream.html")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import specdemo

    pair = specdemo.load_pair(args.pair, device="cpu", runtime="torch")
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


if __name__ == "__main__": main()
