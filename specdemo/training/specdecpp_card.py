"""The model card of SpecDec++'s acceptance head, written from its recipe and evaluation."""

from __future__ import annotations

from pathlib import Path

from ..engine.drafters.acceptance_head import FEATURES


def _row(name: str, values: dict) -> str:
    return (f"| {name} | {values['examples']:,} | {values['rejected_share']:.3f} | {values['log_loss']:.3f} | "
            f"{values['constant_log_loss']:.3f} | {values['auc']:.3f} | {values['entropy_auc']:.3f} |")


def card_text(recipe: dict, report: dict) -> str:
    return f"""# SpecDec++ acceptance head for the embedded pair

## What
A {recipe['parameters']:,}-parameter MLP (two hidden layers) that predicts, at each draft position of a
round, the probability that the target refuses that draft given that it kept the drafts before it.
The `specdecpp` method stops a round before the draft that would lift the predicted probability of
any rejection so far, 1 − Π(1 − r_i), above `specdecpp_threshold`.

## Intended use
Stopping rounds early with the pair it was trained on ({recipe['pair']}: SmolLM2-135M-Instruct and its
feature head). With another pair, train another head; outputs stay lossless whatever it predicts,
since the target verifies every draft.

## Inputs
What the per-token hook reads while drafting, no more: {', '.join(f'`{f}`' for f in FEATURES)}.

## Data
Greedy SD with γ = {recipe['gamma']} and no copying from the context on the first {recipe['requests']} of
{recipe['pool']} requests from `specdemo.training.prompts` (seed {recipe['request_seed']}; the held-out prompts and the benchmark's suite are
never among them), {recipe['max_new_tokens']} new tokens each. Every draft up to its round's first rejection is
one example; requests are split 80/20 into training and held-out examples.

## Procedure
Features standardised by the training set's mean and deviation; full-batch Adam (lr 3e-3, weight decay
1e-4) on the logistic loss for {recipe['steps']} steps, {recipe['train_seconds']} s on one CPU thread.

## Evaluation
| split | drafts | refused share | log-loss | constant log-loss | AUC | entropy alone AUC |
|---|---|---|---|---|---|---|
{_row('train', report['train'])}
{_row('held-out', report['heldout'])}

The constant log-loss is that of always predicting the refused share; AUC is the probability that a
refused draft gets the higher predicted rejection than a kept one.

## Limitations
Trained on greedy traces, where q of a draft is the drafter's top probability; under sampling the
statistics shift and its predictions are rougher. Rounds copied from the context never ask it.

## Reproduce
```
python -m specdemo.training.specdecpp --prompts {recipe['pool']} --trace {recipe['requests']} --seed {recipe['request_seed']} --gamma {recipe['gamma']} --max-new-tokens {recipe['max_new_tokens']} --steps {recipe['steps']}
```
"""


def write_card(folder: Path, recipe: dict, report: dict) -> Path:
    path = Path(folder) / "README.md"
    path.write_text(card_text(recipe, report), encoding="utf-8")
    return path
