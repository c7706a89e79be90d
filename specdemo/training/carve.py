"""A draft carved out of the target: a few of its layers, recovered by distillation on the corpus.

    python -m specdemo.training.carve --out FOLDER [--keep 0,29] [--max-shards 8] [--epochs 3]

The carved draft keeps the target's embedding, the decoder layers named by `--keep` and its final
norm, and reads out through the target's LM-head rows of a frequency-ranked vocabulary subset,
as the feature head does, so that a draft step stays within the cost budget. Unlike the head it
never sees the target's features: it drafts from tokens alone, but starts out knowing the
language. It learns the target's distribution over the subset at every answer position (and the
request's, with `--prompt-loss`), read from the corpus's stored final hidden states.

It is a candidate on the learning curve, measured as the head is: held-out greedy acceptance
replayed over the target's own answers, and the cost of one cached draft step against one
one-token target forward.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specdemo.engine.clock import interleaved_medians

from .corpus import Corpus, default_dir
from .eagle import Sequence, frequent_tokens, learning_rate, length_groups, read_sequences, split_by_request
from .evaluate import Replay, replay_greedy


class CarvedDraft(nn.Module):
    """The target's embedding, a few of its decoder layers and its final norm, read out over a subset."""

    def __init__(self, target: nn.Module, keep: list[int], subset: torch.Tensor):
        super().__init__()
        config = copy.deepcopy(target.config)
        config.num_hidden_layers = len(keep)
        if getattr(config, "layer_types", None):
            config.layer_types = [config.layer_types[i] for i in keep]
        self.model = type(target.get_decoder())(config)
        source = target.get_decoder()
        for mine, index in zip(self.model.layers, keep):
            mine.load_state_dict(source.layers[index].state_dict())
        self.model.norm.load_state_dict(source.norm.state_dict())
        # The embedding stays the target's own, frozen and not stored twice.
        self.model.embed_tokens = source.embed_tokens
        self.register_buffer("subset", subset.clone())
        self.head_rows = target.get_output_embeddings().weight.detach().index_select(0, subset)

    def trainable(self) -> list[nn.Parameter]:
        return [p for name, p in self.named_parameters() if not name.startswith("model.embed_tokens")]

    def hidden(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        return self.model(input_ids=ids, attention_mask=attention_mask, **kwargs)

    def subset_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.head_rows.t()

    def step_macs(self) -> int:
        """Multiply-accumulates of one draft step: its layers and the subset's LM-head rows."""
        layers = sum(p.numel() for p in self.model.layers.parameters() if p.dim() == 2)
        return layers + self.head_rows.numel()


def collate(seqs: list[Sequence], prompt_loss: bool) -> dict:
    """Inputs x_0..x_{L-2}, the target's features f_0..f_{L-2} (f_j gives p(x_{j+1})), and the
    positions that predict answer tokens (all stored positions with `prompt_loss`)."""
    width = max(len(s.ids) for s in seqs) - 1
    d = seqs[0].features.shape[-1]
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attention = torch.zeros(len(seqs), width, dtype=torch.long)
    features = torch.zeros(len(seqs), width, d)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    for row, s in enumerate(seqs):
        n = len(s.ids) - 1
        ids[row, :n] = s.ids[:n]
        attention[row, :n] = 1
        features[row, :n] = s.features[:n].float()
        mask[row, 0 if prompt_loss else max(0, s.answer_start - 1) : n] = True
    return {"ids": ids, "attention": attention, "features": features, "mask": mask}


def distill_loss(draft: CarvedDraft, batch: dict) -> torch.Tensor:
    """Soft cross-entropy against the target's distribution over the subset."""
    m = batch["mask"]
    with torch.no_grad():
        target_p = F.softmax(draft.subset_logits(batch["features"][m]), dim=-1)
    hidden = draft.hidden(batch["ids"], batch["attention"]).last_hidden_state
    logq = F.log_softmax(draft.subset_logits(hidden[m]), dim=-1)
    return -(target_p * logq).sum(-1).mean()


@torch.no_grad()
def agreement(draft: CarvedDraft, sequences: list[Sequence], tokens_per_batch: int = 4096) -> float:
    """Teacher-forced top-1 agreement with the target's greedy token over the answers."""
    draft.eval()
    hits = count = 0
    for group in length_groups(sequences, tokens_per_batch):
        batch = collate([sequences[i] for i in group], prompt_loss=False)
        m = batch["mask"]
        truth = draft.subset_logits(batch["features"][m]).argmax(-1)
        hidden = draft.hidden(batch["ids"], batch["attention"]).last_hidden_state
        hits += int((draft.subset_logits(hidden[m]).argmax(-1) == truth).sum())
        count += int(m.sum())
    draft.train()
    return hits / max(1, count)


def train_carved(target, sequences: list[Sequence], keep: list[int], *, subset_size: int = 8192,
                 epochs: float = 3.0, tokens_per_batch: int = 1024, lr: float = 3e-4, validation: float = 0.04,
                 prompt_loss: bool = False, max_minutes: float | None = None, seed: int = 0,
                 log=print) -> tuple[CarvedDraft, dict]:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    train, val = split_by_request(sequences, validation, seed)
    specials = [t for t in [target.config.bos_token_id, target.config.eos_token_id] if t is not None]
    subset = frequent_tokens(train, subset_size, target.config.vocab_size, specials)
    draft = CarvedDraft(target, keep, subset)
    params = draft.trainable()
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    groups = length_groups(train, tokens_per_batch)
    total_steps = max(1, int(len(groups) * epochs))
    warmup = max(1, min(50, total_steps // 10))
    budget = None if max_minutes is None else 60 * max_minutes
    before = agreement(draft, val)
    log(f"carved {keep}: {len(train)} sequences, {total_steps} steps; validation agreement before training {before:.3f}")
    best, best_state, step, started = (before, 0), None, 0, time.monotonic()
    evaluate_every = max(25, total_steps // 8)
    while True:
        rng.shuffle(groups)
        for group in groups:
            share = None if budget is None else (time.monotonic() - started) / budget
            for g in optimizer.param_groups:
                g["lr"] = learning_rate(lr, step, total_steps, warmup, share)
            loss = distill_loss(draft, collate([train[i] for i in group], prompt_loss))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            step += 1
            last = step >= total_steps or (share is not None and share >= 1.0)
            if step % evaluate_every == 0 or last:
                agree = agreement(draft, val)
                log(f"step {step}/{total_steps} loss {float(loss.detach()):.3f} validation agreement {agree:.3f} "
                    f"({time.monotonic() - started:.0f} s)")
                if agree > best[0]:
                    best, best_state = (agree, step), {k: v.clone() for k, v in draft.state_dict().items()}
            if last:
                break
        else:
            continue
        break
    if best_state is not None:
        draft.load_state_dict(best_state)
    info = {"keep": keep, "train_answer_tokens": sum(int(s.ids.numel() - s.answer_start) for s in train),
            "train_requests": len({s.request for s in train}), "validation_agreement": round(best[0], 4),
            "validation_agreement_untrained": round(before, 4), "best_step": best[1], "steps": step,
            "epochs": epochs, "lr": lr, "subset_size": subset_size, "prompt_loss": prompt_loss,
            "train_seconds": round(time.monotonic() - started, 1)}
    return draft.eval(), info


@torch.no_grad()
def heldout_acceptance(draft: CarvedDraft, answers, gamma: int = 4) -> dict:
    """Greedy SD rounds over the target's held-out answers. Each draft step reruns the carved
    layers over the whole sequence: exact, and cheap enough for a measurement."""

    def propose(sequence, limit):
        drafted = []
        for _ in range(min(gamma, limit)):
            hidden = draft.hidden(torch.tensor([sequence + drafted])).last_hidden_state[0, -1]
            drafted.append(int(draft.subset[draft.subset_logits(hidden).argmax()]))
        return drafted

    replays = (replay_greedy(prompt, answer, propose, lambda *_: None) for prompt, answer in answers)
    return sum(replays, Replay(0, 0, 0, 0)).report(len(answers), gamma)


@torch.no_grad()
def step_cost(draft: CarvedDraft, target, context: int = 96, calls: int = 60) -> dict:
    """Median seconds of one cached draft step (layers and subset read-out) against one
    one-token target forward, interleaved on the same thread."""
    from transformers import DynamicCache

    ids = torch.randint(0, target.config.vocab_size, (1, context), device=target.device)
    target_cache, draft_cache = DynamicCache(config=target.config), DynamicCache(config=draft.model.config)
    target(input_ids=ids, cache=target_cache, use_cache=True)
    draft.hidden(ids, cache=draft_cache, use_cache=True)

    def draft_step():
        hidden = draft.hidden(ids[:, -1:], cache=draft_cache, use_cache=True).last_hidden_state
        draft.subset_logits(hidden[0, -1]).argmax().item()
        draft_cache.crop(-1)

    def target_step():
        target(input_ids=ids[:, -1:], cache=target_cache, use_cache=True).logits.argmax().item()
        target_cache.crop(-1)

    medians = interleaved_medians({"draft_step": draft_step, "target_forward": target_step}, calls)
    return {**{f"{name}_ms": round(1000 * seconds, 3) for name, seconds in medians.items()},
            "cost_ratio": round(medians["draft_step"] / medians["target_forward"], 4), "draft_macs": draft.step_macs()}


def main(argv=None) -> int:
    from .corpus import load_teacher

    parser = argparse.ArgumentParser(prog="python -m specdemo.training.carve", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, default=default_dir())
    parser.add_argument("--out", type=Path, required=True, help="folder for the measurements (carved.json)")
    parser.add_argument("--keep", default="0,-1", help="the target's layers to keep, comma-separated (negative from the end)")
    parser.add_argument("--max-shards", type=int, help="train on the first N shards (default: all)")
    parser.add_argument("--subset", type=int, default=8192)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--tokens-per-batch", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--prompt-loss", action="store_true")
    parser.add_argument("--max-minutes", type=float)
    parser.add_argument("--answers", type=Path, required=True,
                        help="held-out (prompt ids, greedy answer) pairs, as the curve caches them")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--train-threads", type=int)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.train_threads or args.threads)
    target, _ = load_teacher(None, "cpu", torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    layers = target.config.num_hidden_layers
    keep = [int(k) % layers for k in args.keep.split(",")]
    corpus = Corpus(args.corpus)
    shards = len(corpus.shards())
    fraction = 1.0 if args.max_shards is None else min(1.0, args.max_shards / shards)
    draft, info = train_carved(target, read_sequences(corpus, fraction), keep, subset_size=args.subset,
                               epochs=args.epochs, tokens_per_batch=args.tokens_per_batch, lr=args.lr,
                               prompt_loss=args.prompt_loss, max_minutes=args.max_minutes,
                               log=lambda m: print(m, flush=True))
    torch.set_num_threads(args.threads)
    answers = [tuple(a) for a in json.loads(args.answers.read_text())]
    info.update(heldout_acceptance(draft, answers, args.gamma), **step_cost(draft, target))
    info["threads"] = args.threads
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "carved.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__": raise SystemExit(main())
