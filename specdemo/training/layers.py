"""Intermediate layers' states for a corpus written without them: one teacher-forced pass.

    python -m specdemo.training.layers --corpus DIR --feature-layers 2,15 [--minutes M]

A fused-feature head (EAGLE-3) reads a few of the target's intermediate layers beside its final
state. A corpus written with `--feature-layers` keeps them from the generating forward; for one
written without (or with other layers), this pass feeds every stored sequence (prompt and
answer) through the target once and keeps the chosen layers at the positions the shard's final
states cover. The answers are not written again, so this runs at the target's prefill speed.

Each shard's states go to `layers-2-15/shard-NNNNN.pt` beside it (the shard itself is never
rewritten); resumable, like the corpus: run it again and it goes on with the shards still missing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from .corpus import Corpus, save_atomic, load_teacher, parse_layers


def layers_dir(corpus: Corpus, layers: tuple[int, ...]) -> Path:
    return corpus.root / ("layers-" + "-".join(str(i) for i in layers))


def stored_layers(corpus: Corpus, path: Path, shard: dict, layers: tuple[int, ...]) -> list[torch.Tensor] | None:
    """The shard's states of `layers`, [len(sequence) - 1, k · d] each: kept by the shard itself
    or written beside it by this pass; None where neither holds them."""
    if tuple(shard.get("feature_layers", ())) == tuple(layers):
        return shard["layer_features"]
    beside = layers_dir(corpus, layers) / path.name
    return torch.load(beside, weights_only=False)["layer_features"] if beside.exists() else None


@torch.inference_mode()
def teacher_forced_layers(model, sequences: list[list[int]], layers: tuple[int, ...],
                          tokens_per_batch: int = 4096) -> list[torch.Tensor]:
    """[len(s) - 1, k · d] float16 for each token sequence s: the chosen layers at positions 0 .. len(s) - 2."""
    device = next(model.parameters()).device
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    out: list[torch.Tensor | None] = [None] * len(sequences)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and len(sequences[order[end]]) * (end - start + 1) <= tokens_per_batch:
            end += 1
        group = order[start:end]
        width = len(sequences[group[-1]])
        ids = torch.zeros(len(group), width, dtype=torch.long)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for row, i in enumerate(group):  # right-padded: real positions keep their indices
            ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
            mask[row, : len(sequences[i])] = 1
        hidden = model.get_decoder()(input_ids=ids.to(device), attention_mask=mask.to(device),
                                     output_hidden_states=True).hidden_states
        states = torch.cat([hidden[i] for i in layers], dim=-1).half().cpu()
        for row, i in enumerate(group):
            out[i] = states[row, : len(sequences[i]) - 1].clone()
        start = end
    return out  # type: ignore[return-value]


def add_layers(model, corpus: Corpus, layers: tuple[int, ...], *, minutes: float | None = None,
               tokens_per_batch: int = 4096, log=print) -> int:
    """Write the missing shards' states of `layers`; the number of shards written."""
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    folder = layers_dir(corpus, layers)
    folder.mkdir(exist_ok=True)
    written = 0
    for path in corpus.shards():
        if (folder / path.name).exists():
            continue
        if deadline is not None and time.monotonic() > deadline:
            log("time is up; run again to go on")
            break
        shard = corpus.load_shard(path)
        if tuple(shard.get("feature_layers", ())) == tuple(layers):
            continue  # written with these layers already
        started = time.monotonic()
        sequences = [prefix + answer for prefix, answer in zip(shard["prefixes"], shard["answers"])]
        states = teacher_forced_layers(model, sequences, layers, tokens_per_batch)
        save_atomic({"feature_layers": list(layers), "layer_features": states}, folder / path.name)
        positions = sum(len(s) for s in sequences)
        log(f"{path.name}: {len(sequences)} sequences, {positions} positions, "
            f"{positions / (time.monotonic() - started):.0f} positions/s")
        written += 1
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdemo.training.layers", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a corpus directory (training.corpus --out)")
    parser.add_argument("--feature-layers", type=parse_layers, required=True, help="e.g. 2,15")
    parser.add_argument("--target", help="a save_pretrained folder; default: the embedded SmolLM2 target")
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--minutes", type=float, help="stop after this long (run again to go on)")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, _ = load_teacher(args.target, args.device, torch.float32)
    written = add_layers(model, Corpus(args.corpus), args.feature_layers, minutes=args.minutes,
                         tokens_per_batch=args.tokens_per_batch, log=lambda m: print(m, flush=True))
    print(f"{written} shards written")
    return 0


if __name__ == "__main__": raise SystemExit(main())
