"""Train the feature-level draft head on the corpus (`corpus.py`).

    python -m specdemo.training.eagle --corpus DIR --out FOLDER [--fraction 0.3] [--epochs 3]

Each position j of a stored sequence gives one example: the head reads the target's hidden
state f_j and the token x_{j+1}, and learns the next hidden state f_{j+1} (smooth L1) and the
target's distribution over the vocabulary subset that f_{j+1} gives through the LM head (soft
cross-entropy). A second, unrolled step feeds the head its own prediction f̂_j in place of f_j,
as drafting does from the second token of a round on. Input features get a little noise.
Losses count only positions that predict answer tokens; the prompt is context.

Validation holds out whole requests and measures teacher-forced top-1 agreement with the
target's greedy token at the first and second draft step; the best checkpoint is kept.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdemo.engine.drafters.feature_head import FeatureHead, HeadConfig, filled_subset
from specdemo.engine.drafters.head_loss import chained_predictions, collate, head_losses, round_predictions

from .corpus import Corpus, default_dir, parse_layers
from .layers import stored_layers


@dataclass
class Sequence:
    ids: torch.Tensor  # [L] prompt + answer
    features: torch.Tensor  # [L - 1, d] float16
    answer_start: int
    request: str
    read: bool = False  # a passage the target read (passages.py), not an answer it wrote
    # [L - 1] loss weight per input position (None: 1 everywhere); see `weigh_rejections`
    weights: torch.Tensor | None = None


def read_sequences(corpus: Corpus, fraction: float = 1.0, max_len: int = 448, read: bool = False,
                   feature_layers: tuple[int, ...] = ()) -> list[Sequence]:
    """Every stored sequence of the first `fraction` of the shards (shards are in request order);
    `read` marks them as passages of a text corpus. With `feature_layers` each position's
    features are those layers' states followed by the final state, [L - 1, (k + 1) · d]."""
    paths = corpus.shards()
    paths = paths[: max(1, math.ceil(len(paths) * fraction))]
    out = []
    for path in paths:
        shard = corpus.load_shard(path)
        features = shard["features"]
        if feature_layers:
            layers = stored_layers(corpus, path, shard, feature_layers)
            if layers is None:
                raise FileNotFoundError(
                    f"{path} holds no states of layers {list(feature_layers)}: run python -m specdemo.training.layers "
                    f"--corpus {corpus.root} --feature-layers {','.join(map(str, feature_layers))}")
            features = [torch.cat((low, final), dim=-1) for low, final in zip(layers, features)]
        for messages, prefix, answer, feats in zip(shard["messages"], shard["prefixes"], shard["answers"],
                                                   features):
            if len(answer) < 2:
                continue
            ids = torch.tensor(prefix + answer)
            start = len(prefix)
            if len(ids) > max_len:  # keep the answer, drop the start of a long prompt
                cut = len(ids) - max_len
                if cut >= start - 1:
                    continue
                ids, feats, start = ids[cut:], feats[cut:], start - cut
            out.append(Sequence(ids, feats, start, json.dumps(messages), read))
    return out


def frequent_tokens(sequences: list[Sequence], size: int, vocab_size: int, always: list[int]) -> torch.Tensor:
    """The `size` most frequent answer tokens (special tokens first), sorted by id."""
    counts = Counter()
    for s in sequences:
        counts.update(s.ids[s.answer_start :].tolist())
    chosen = list(dict.fromkeys([t for t in always if 0 <= t < vocab_size] + [t for t, _ in counts.most_common()]))
    return filled_subset(chosen[:size], size, vocab_size)  # a small corpus is filled with the lowest ids


def split_by_request(sequences: list[Sequence], validation: float, seed: int):
    requests = sorted({s.request for s in sequences})
    random.Random(seed).shuffle(requests)
    held = set(requests[: max(1, int(len(requests) * validation))])
    return [s for s in sequences if s.request not in held], [s for s in sequences if s.request in held]


def length_groups(sequences: list[Sequence], tokens_per_batch: int) -> list[list[int]]:
    """Indices of sequences of similar lengths, about `tokens_per_batch` padded tokens a group."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i].ids))
    groups, group, width = [], [], 0
    for i in order:
        width_if = max(width, len(sequences[i].ids))
        if group and width_if * (len(group) + 1) > tokens_per_batch:
            groups.append(group)
            group, width_if = [], len(sequences[i].ids)
        group.append(i)
        width = width_if
    if group:
        groups.append(group)
    return groups


def batches(sequences: list[Sequence], tokens_per_batch: int, rng: random.Random | None, device=None):
    """Right-padded batches of similar lengths, about `tokens_per_batch` tokens each (shuffled with
    rng), on `device` (the CPU by default)."""
    groups = length_groups(sequences, tokens_per_batch)
    if rng is not None:
        rng.shuffle(groups)
    for group in groups:
        batch = collate([sequences[i] for i in group])
        yield batch if device is None else {k: v.to(device, non_blocking=True) for k, v in batch.items()}



@torch.no_grad()
def weigh_rejections(head: FeatureHead, sequences: list[Sequence], lm_head: torch.Tensor, weight: float,
                     tokens_per_batch: int = 4096) -> float:
    """On-policy data: give `weight` to the positions where `head` (the head being continued)
    drafts a first token the target rejects under greedy decoding, 1 elsewhere, so training
    dwells on the rounds this head loses. Returns the share of answer positions so marked."""
    head.eval()
    d = head.config.hidden_size
    marked = total = 0
    for seq in sequences:
        seq.weights = None
    groups = length_groups(sequences, tokens_per_batch)
    for group in groups:
        batch = collate([sequences[i] for i in group])
        batch = {k: v.to(lm_head.device) for k, v in batch.items()}
        features, next_ids = batch["features"], batch["next_ids"]
        predicted = next(round_predictions(head, features, next_ids, 1))
        guess = head.subset[head.subset_logits(predicted[:, :-1]).argmax(-1)]
        truth = (features[:, 1:, -d:] @ lm_head.t()).argmax(-1)
        rejected = (guess != truth).cpu()
        answer = batch["loss_mask"][:, :-1].cpu()
        marked += int((rejected & answer).sum())
        total += int(answer.sum())
        for row, i in enumerate(group):
            n = len(sequences[i].ids) - 1
            w = torch.ones(n)
            w[: n - 1][rejected[row, : n - 1]] = weight
            sequences[i].weights = w
    head.train()
    return marked / max(1, total)







@torch.no_grad()
def agreement(head: FeatureHead, sequences: list[Sequence], lm_head: torch.Tensor, steps: int = 2,
              tokens_per_batch: int = 4096) -> list[float]:
    """Teacher-forced top-1 agreement with the target's greedy token, per draft step, with the
    steps run as drafting runs them (`round_predictions`)."""
    head.eval()
    hits, count = [0] * steps, [0] * steps
    d = head.config.hidden_size
    for batch in batches(sequences, tokens_per_batch, None, device=lm_head.device):
        features, next_ids, mask = batch["features"], batch["next_ids"], batch["loss_mask"]
        t = features.shape[1]
        truth = (features[:, 1:, -d:] @ lm_head.t()).argmax(-1)
        for step, predicted in enumerate(round_predictions(head, features, next_ids, steps)):
            m = mask[:, : t - 1].clone()
            m[:, :step] = False
            guess = head.subset[head.subset_logits(predicted[:, :-1][m]).argmax(-1)]
            hits[step] += int((guess == truth[m]).sum())
            count[step] += int(m.sum())
    head.train()
    return [h / max(1, c) for h, c in zip(hits, count)]


def training_progress(step: int, total_steps: int, elapsed_share: float | None = None) -> float:
    """How far training is, 0 to 1: by steps, or by the time budget where that runs out first."""
    return max(step / total_steps, elapsed_share or 0.0)


def learning_rate(base: float, step: int, total_steps: int, warmup_steps: int,
                  elapsed_share: float | None = None) -> float:
    """Linear warm-up, then a cosine that reaches zero when training ends. Under a time budget
    the cosine follows the clock, so a run cut short by `--max-minutes` still anneals instead of
    stopping at a high learning rate."""
    warm = min(1.0, (step + 1) / warmup_steps)
    progress = min(1.0, training_progress(step, total_steps, elapsed_share))
    return base * warm * 0.5 * (1 + math.cos(math.pi * progress))


def starting_head(target, train: list[Sequence], *, subset_size: int, init: str, start_from: FeatureHead | None,
                  feature_layers: tuple[int, ...]) -> FeatureHead:
    """A copy of `start_from` (its subset kept), or a new head over the `subset_size` tokens the
    training answers use most; made to read `feature_layers`, on the target's device and bound
    to it."""
    if start_from is not None:
        head = FeatureHead(start_from.config)
        head.load_state_dict(start_from.state_dict())
    else:
        specials = [t for t in [target.config.bos_token_id, target.config.eos_token_id,
                                getattr(target.config, "pad_token_id", None)] if t is not None]
        subset = frequent_tokens(train, subset_size, target.config.vocab_size, specials)
        head = FeatureHead(HeadConfig.for_target(target.config, subset_size))
        head.subset.copy_(subset)
        if init == "target":
            head.init_from_target(target)
    if feature_layers and not head.config.feature_layers:
        head = FeatureHead.widened(head, feature_layers)
    if head.config.feature_layers != feature_layers:
        raise ValueError(f"the head reads layers {list(head.config.feature_layers)}, the data holds {list(feature_layers)}")
    # The head trains where the target is (the stored features come to it a batch at a time).
    head.to(target.get_output_embeddings().weight.device)
    head.bind(target)
    return head


def fit(head: FeatureHead, train: list[Sequence], val: list[Sequence], lm_head: torch.Tensor, *, lr: float,
        total_steps: int, tokens_per_batch: int, rng: random.Random, started: float, budget_seconds: float | None,
        log=print, checkpoint=None, evaluate_every: int | None = None, **loss_options) -> tuple[dict, int]:
    """Train `head` for `total_steps`, or until the time budget since `started` is spent, checking
    validation agreement every eighth of the run; the head is left at its best check. Returns
    that check ({"agreement": per step, "step"}) and the steps run. `checkpoint(head, check)`, if
    given, is called at every check with the head as it then is and what was measured ("agreement",
    "step", "best": whether it is the best so far), so a run cut short keeps its best head.
    `loss_options` go to `head_losses`."""
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    best = {"agreement": [-1.0], "step": 0}
    best_state = None
    step = 0
    evaluate_every = evaluate_every or max(25, total_steps // 8)
    warmup_steps = max(1, min(50, total_steps // 10))
    while True:
        for batch in batches(train, tokens_per_batch, rng, device=lm_head.device):
            elapsed_share = None if budget_seconds is None else (time.monotonic() - started) / budget_seconds
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(lr, step, total_steps, warmup_steps, elapsed_share)
            loss, logs = head_losses(head, batch, **loss_options)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            step += 1
            last = training_progress(step, total_steps, elapsed_share) >= 1.0
            if step % evaluate_every == 0 or last:
                agree = agreement(head, val, lm_head)
                log(f"step {step}/{total_steps} loss {float(loss.detach()):.3f} {logs} validation agreement "
                    f"{[round(a, 3) for a in agree]} ({time.monotonic() - started:.0f} s)")
                improved = agree[0] + agree[1] > best["agreement"][0] + best["agreement"][-1]
                if improved:
                    best = {"agreement": agree, "step": step}
                    best_state = {k: v.clone() for k, v in head.state_dict().items()}
                if checkpoint is not None:
                    checkpoint(head, {"agreement": agree, "step": step, "best": improved})
            if last:
                if best_state is not None:
                    head.load_state_dict(best_state)
                return best, step


def train_head(target, sequences: list[Sequence], *, subset_size: int = 8192, epochs: float = 3.0,
               tokens_per_batch: int = 4096, lr: float = 1e-3, noise: float = 0.05, unroll: int = 2,
               cls_weight: float = 0.1, validation: float = 0.04, seed: int = 0, max_minutes: float | None = None,
               init: str = "random", prompt_loss: bool = False, passages: list[Sequence] = (),
               start_from: FeatureHead | None = None, max_steps: int | None = None,
               feature_layers: tuple[int, ...] = (), reg_weight: float = 1.0, test_time: bool = False,
               rejected_weight: float = 1.0, checkpoint=None, evaluate_every: int | None = None,
               log=print) -> tuple[FeatureHead, dict]:
    """Train a head on `sequences` (answers; a share of their requests validates) plus `passages`
    (read text: training only, and left out of the vocabulary subset, which answers choose).
    `start_from` continues an existing head (its subset kept) instead of starting anew; with
    `feature_layers` (the sequences' features then hold those layers before the final state) the
    head reads them through a fusion that starts by passing the final state through.
    `rejected_weight` ≠ 1 weighs the positions where the starting head's first draft is rejected
    (`weigh_rejections`). `checkpoint` is `fit`'s; `evaluate_every` checks every that many steps
    (default: every eighth of the run)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    train, val = split_by_request(sequences, validation, seed)
    feature_layers = tuple(feature_layers)
    head = starting_head(target, train, subset_size=subset_size, init=init, start_from=start_from,
                         feature_layers=feature_layers)
    if start_from is not None:
        subset_size = int(head.subset.numel())
    lm_head = target.get_output_embeddings().weight.detach()
    rejected_share = None
    if rejected_weight != 1.0:
        rejected_share = weigh_rejections(head, train, lm_head, rejected_weight)
        log(f"on-policy: {rejected_share:.3f} of answer positions rejected by the starting head, "
            f"weighted {rejected_weight:g}")
    passage_tokens = sum(int(s.ids.numel() - s.answer_start) for s in passages)
    train = train + list(passages)
    steps_per_epoch = len(length_groups(train, tokens_per_batch))
    total_steps = max(1, int(steps_per_epoch * epochs))
    if max_steps is not None:
        total_steps = min(total_steps, max_steps)
    train_tokens = sum(int(s.ids.numel() - s.answer_start) for s in train) - passage_tokens
    log(f"train: {len(train)} sequences, {train_tokens} answer tokens, {passage_tokens} passage tokens; "
        f"validation: {len(val)} sequences; "
        f"{total_steps} steps")
    started = time.monotonic()
    best, step = fit(head, train, val, lm_head, lr=lr, total_steps=total_steps, tokens_per_batch=tokens_per_batch,
                     rng=rng, started=started, budget_seconds=None if max_minutes is None else 60 * max_minutes,
                     log=log, checkpoint=checkpoint, evaluate_every=evaluate_every, noise=noise, unroll=unroll,
                     cls_weight=cls_weight, prompt_loss=prompt_loss, reg_weight=reg_weight, test_time=test_time)
    head.bind(target)
    info = {"train_sequences": len(train), "train_answer_tokens": train_tokens,
            "train_requests": len({s.request for s in train if not s.read}), "validation_sequences": len(val),
            "passage_tokens": passage_tokens, "passages": len(passages),
            "continued": start_from is not None,
            "validation_agreement_step1": best["agreement"][0], "validation_agreement_step2": best["agreement"][-1],
            "best_step": best["step"], "steps": step, "subset_size": subset_size, "epochs": epochs,
            "epochs_run": round(step / steps_per_epoch, 2),
            "noise": noise, "unroll": unroll, "cls_weight": cls_weight, "lr": lr, "init": init,
            "prompt_loss": prompt_loss, "feature_layers": list(feature_layers), "reg_weight": reg_weight,
            "test_time": test_time, "rejected_weight": rejected_weight, "rejected_share": rejected_share,
            "tokens_per_batch": tokens_per_batch,
            "train_seconds": round(time.monotonic() - started, 1)}
    return head.eval(), info


def add_recipe_arguments(parser: argparse.ArgumentParser) -> None:
    """The recipe's flags, shared by this command and the learning curve (`curve.py`)."""
    parser.add_argument("--unroll", type=int, default=2, help="draft steps trained per position (γ as drafted)")
    parser.add_argument("--feature-layers", type=parse_layers, default=(),
                        help="fuse these intermediate layers with the final state, e.g. 2,15 (EAGLE-3; the corpus "
                             "must hold them: training.corpus --feature-layers or training.layers)")
    parser.add_argument("--reg-weight", type=float, default=1.0,
                        help="weight of the feature-regression loss (0: learn the tokens only, as EAGLE-3)")
    parser.add_argument("--test-time", action="store_true",
                        help="unrolled steps attend as drafting does (EAGLE-3's training-time test)")
    parser.add_argument("--rejected-weight", type=float, default=1.0,
                        help="weigh the positions where the starting head's first draft is rejected (on-policy data)")


def recipe(args: argparse.Namespace) -> dict:
    """`train_head`'s keyword arguments from the flags `add_recipe_arguments` declares."""
    return {"unroll": args.unroll, "feature_layers": args.feature_layers, "reg_weight": args.reg_weight,
            "test_time": args.test_time, "rejected_weight": args.rejected_weight}


def main(argv=None) -> int:
    from .corpus import load_teacher

    parser = argparse.ArgumentParser(prog="python -m specdemo.training.eagle", description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", type=Path, nargs="+", default=[default_dir()],
                        help="one or more corpus directories (e.g. one per process that grew them)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", help="a save_pretrained folder; default: the embedded SmolLM2 target")
    parser.add_argument("--fraction", type=float, default=1.0, help="train on this share of the shards")
    parser.add_argument("--subset", type=int, default=8192, help="vocabulary subset size")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--cls-weight", type=float, default=0.1, help="weight of the distribution loss")
    parser.add_argument("--init", choices=["target", "random"], default="random",
                        help="start the decoder layer from the target's last layer, or at random")
    parser.add_argument("--prompt-loss", action="store_true",
                        help="also learn from the request's positions, not only from the answer's")
    parser.add_argument("--max-minutes", type=float)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where the head trains (e.g. cuda)")
    parser.add_argument("--start-from", type=Path, help="continue this head (its folder) instead of starting anew")
    parser.add_argument("--max-steps", type=int, help="stop training after this many steps")
    add_recipe_arguments(parser)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    target, _ = load_teacher(args.target, args.device, torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    sequences = [s for folder in args.corpus
                 for s in read_sequences(Corpus(folder), args.fraction, feature_layers=args.feature_layers)]
    head, info = train_head(target, sequences, subset_size=args.subset, epochs=args.epochs,
                            tokens_per_batch=args.tokens_per_batch, lr=args.lr, noise=args.noise,
                            cls_weight=args.cls_weight, init=args.init, seed=args.seed,
                            prompt_loss=args.prompt_loss, max_minutes=args.max_minutes,
                            start_from=FeatureHead.load(args.start_from) if args.start_from else None,
                            max_steps=args.max_steps, **recipe(args), log=lambda m: print(m, flush=True))
    info["fraction"] = args.fraction
    head.save(args.out, extra={"training": info})
    print(json.dumps(info))
    return 0


if __name__ == "__main__": raise SystemExit(main())
