"""What the feature head is trained to minimise, and its draft steps unrolled as training runs them.

The offline trainer (`training.eagle`) and online adaptation (`engine.online`, OSD) share these, so
a head adapted while serving learns exactly what it was trained on.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F

from .feature_head import FeatureHead


def collate(seqs: Sequence[Any]) -> dict:
    """Sequences (each with `ids` [L], `features` [L − 1, d], `answer_start` and optional
    per-position `weights`) padded into one batch: features, next ids and the loss masks."""
    width = max(len(s.ids) for s in seqs) - 1  # positions j = 0..L-2 carry a feature
    d = seqs[0].features.shape[-1]
    features = torch.zeros(len(seqs), width, d)
    next_ids = torch.zeros(len(seqs), width, dtype=torch.long)
    loss_mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    prompt_mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    weights = torch.ones(len(seqs), width)
    for row, s in enumerate(seqs):
        n = len(s.ids) - 1
        features[row, :n] = s.features[:n].float()
        if s.weights is not None:
            weights[row, :n] = s.weights[:n]
        next_ids[row, :n] = s.ids[1:]
        # input j predicts f_{j+1}; it must exist (j+1 <= L-2) and predict an answer token
        # (x_{j+2} with j+2 >= answer_start).
        loss_mask[row, max(0, s.answer_start - 2) : n - 1] = True
        # The request's own positions: text the target read rather than wrote.
        prompt_mask[row, : max(0, s.answer_start - 2)] = True
    return {"features": features, "next_ids": next_ids, "loss_mask": loss_mask, "prompt_mask": prompt_mask,
            "weights": weights}

def round_predictions(head: FeatureHead, features: torch.Tensor, next_ids: torch.Tensor, steps: int,
                      noise: float = 0.0):
    """The head's predictions [B, T, d] for draft steps 1 .. `steps`, as drafting makes them
    (the training-time test of EAGLE-3): at step s the input at position j is the head's own
    prediction from step s - 1 at j - 1, and its query attends to the target's true context up
    to j - s + 1 and to the keys its own round made since, never to other rounds' predictions.
    Step 1 is the plain teacher-forced pass."""
    b, t, _ = features.shape
    positions = torch.arange(1, t + 1, device=features.device)
    index = torch.arange(t, device=features.device)
    start = head.fuse_features(features[:, :1])  # position 0 has no earlier prediction: keep its truth
    inputs, keys, values = features, [], []
    for step in range(steps):
        noisy = inputs + noise * torch.randn_like(inputs) if noise > 0 else inputs
        residual, q, k, v = head.project(noisy, next_ids, positions)
        keys.append(k)
        values.append(v)
        # Key blocks: 0 the true context (positions ≤ j - step), r ≥ 1 this round's step r at j - step + r.
        blocks = [index[None, :] <= index[:, None] - step]
        blocks += [index[None, :] == index[:, None] - step + r for r in range(1, step + 1)]
        predicted = head.finish(residual, q, torch.cat(keys, dim=2), torch.cat(values, dim=2),
                                torch.cat(blocks, dim=1))
        yield predicted
        inputs = torch.cat((start, predicted[:, :-1]), dim=1)



def chained_predictions(head: FeatureHead, features: torch.Tensor, next_ids: torch.Tensor, steps: int,
                        noise: float = 0.0):
    """EAGLE-1's unrolled steps: step s reads step s - 1's predictions at every position, and
    attends to them too (cheaper than `round_predictions`, but later steps see predicted
    context where drafting sees the target's)."""
    t = features.shape[1]
    positions = torch.arange(1, t + 1, device=features.device)
    inputs = features
    for _ in range(steps):
        noisy = inputs + noise * torch.randn_like(inputs) if noise > 0 else inputs
        predicted = head(noisy, next_ids, positions)
        yield predicted
        inputs = torch.cat((head.fuse_features(features[:, :1]), predicted[:, :-1].detach()), dim=1)



def head_losses(head: FeatureHead, batch: dict, *, noise: float, unroll: int, cls_weight: float,
                step_weights=(1.0, 0.7), prompt_loss: bool = False, reg_weight: float = 1.0,
                test_time: bool = False) -> tuple[torch.Tensor, dict]:
    """The loss over `unroll` draft steps: feature regression (weight `reg_weight`) plus soft
    cross-entropy against the target's distribution (`cls_weight`). With `test_time` the steps
    run as drafting runs them (`round_predictions`) and weigh 0.8^s; otherwise as EAGLE-1."""
    features, next_ids, mask = batch["features"], batch["next_ids"], batch["loss_mask"]
    if prompt_loss:  # fixed text the target only read still shows how its features move
        mask = mask | batch["prompt_mask"]
    t = features.shape[1]
    d = head.config.hidden_size
    targets = features[:, 1:, -d:]  # the final state f_{j+1} for inputs j = 0..t-2
    with torch.no_grad():
        target_logp = F.log_softmax(head.subset_logits(targets), dim=-1)
    unrolled = round_predictions if test_time else chained_predictions
    total, logs = 0.0, {}
    for step, predicted in enumerate(unrolled(head, features, next_ids, unroll, noise)):
        m = mask[:, : t - 1].clone()
        m[:, :step] = False  # no round of this many steps starts before position 0
        pred = predicted[:, :-1][m]
        reg = F.smooth_l1_loss(pred, targets[m]) if reg_weight else pred.new_zeros(())
        w = batch["weights"][:, : t - 1][m] if "weights" in batch else None
        ce = -(target_logp[m].exp() * F.log_softmax(head.subset_logits(pred), dim=-1)).sum(-1)
        cls = ce.mean() if w is None else (w * ce).sum() / w.sum()
        weight = 0.8 ** step if test_time else step_weights[min(step, len(step_weights) - 1)]
        total = total + weight * (reg_weight * reg + cls_weight * cls)
        logs[f"reg{step + 1}"], logs[f"cls{step + 1}"] = float(reg.detach()), float(cls.detach())
    return total, logs
