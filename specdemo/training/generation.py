"""The training data's one generation loop: many prompts answered together by the target.

    answers = answer_all(model, prefixes, batch=64, max_new_tokens=128, stops=stops, pad_id=pad)

Prefixes are left-padded so that every prompt ends at the same column, and decoded greedily
or sampled at a temperature among the `SAMPLE_CANDIDATES` most likely tokens. Each `Answer`
keeps its tokens (up to and including the first stop token), the target's top-k next-token
log-probabilities at temperature 1 at every answer step (what distillation matches) and,
with `features=True`, the target's final hidden state at every position it was fed (what a
feature-level draft reads), and with `feature_layers` the states of those intermediate layers
too (what a fused-feature head reads). All come out of the generating forward: no second pass.

The corpus (`corpus.py`) and the draft LM's trainer (`train_draft.py`) both answer through
`answer_batch` / `answer_all`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

TOPK = 16
DONE_CHECK_EVERY = 8
# Sampling looks only at this many most likely tokens: the tail left out holds a negligible
# share of the mass, and a multinomial over the full vocabulary costs more than a forward on a CPU.
SAMPLE_CANDIDATES = 64


@dataclass
class Answer:
    tokens: list[int]
    features: torch.Tensor | None  # [len(prefix) + len(tokens) - 1, d] final hidden state at each fed position
    top_ids: torch.Tensor  # [len(tokens), k] the target's most likely next tokens at each answer step
    top_logp: torch.Tensor  # [len(tokens), k] their log-probabilities (temperature 1)
    layer_features: torch.Tensor | None = None  # [as features, len(feature_layers) · d] those layers' states


def padding_id(tokenizer) -> int:
    """The id prompts are padded with: the tokenizer's pad token, or EOS where it has none."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def left_padded(prefixes: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids and attention mask [rows, longest prefix], each prefix ending in the last column."""
    width = max(len(p) for p in prefixes)
    ids = torch.full((len(prefixes), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prefixes), width), dtype=torch.long)
    for row, prefix in enumerate(prefixes):
        ids[row, width - len(prefix):] = torch.tensor(prefix)
        mask[row, width - len(prefix):] = 1
    return ids, mask


@torch.inference_mode()
def answer_batch(model, prefixes: list[list[int]], *, max_new_tokens: int, stops: set[int], pad_id: int,
                 temperature: float = 0.0, topk: int = TOPK, generator: torch.Generator | None = None,
                 features: bool = True, feature_layers: tuple[int, ...] = ()) -> list[Answer]:
    """Answer left-padded prefixes together, keeping top-k log-probs (and hidden states).

    Runs the decoder body and the LM head separately so that the hidden state the head reads
    is kept for free. generator: on the model's device (a CUDA multinomial takes only a CUDA one).
    """
    device = next(model.parameters()).device
    body, head = model.get_decoder(), model.get_output_embeddings()
    ids, mask = (t.to(device) for t in left_padded(prefixes, pad_id))
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    layers = tuple(feature_layers) if features else ()
    out = body(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
               output_hidden_states=bool(layers))
    # Everything a step makes stays on the model's device until the batch ends, and whether every
    # row has stopped is read back only every few steps: on a GPU a read-back per step would keep
    # the host from queueing the next step while the device works.
    step_features = [out.last_hidden_state.float()] if features else []
    step_layers = [_layer_states(out, layers)] if layers else []
    stop_tensor = torch.tensor(sorted(stops), device=device)
    done = torch.zeros(len(prefixes), dtype=torch.bool, device=device)
    tokens, top_i, top_v = [], [], []
    for step in range(max_new_tokens):
        logp = F.log_softmax(head(out.last_hidden_state[:, -1]).float(), dim=-1)
        values, indices = logp.topk(min(max(topk, SAMPLE_CANDIDATES), logp.shape[-1]), dim=-1)
        top_v.append(values[:, :topk].half())
        top_i.append(indices[:, :topk].int())
        if temperature > 0:
            pick = torch.multinomial(F.softmax(values / temperature, dim=-1), 1, generator=generator)
            nxt = indices.gather(1, pick).squeeze(1)
        else:
            nxt = indices[:, 0]
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        tokens.append(nxt)
        done |= torch.isin(nxt, stop_tensor)
        if step + 1 == max_new_tokens or (step % DONE_CHECK_EVERY == DONE_CHECK_EVERY - 1 and bool(done.all())):
            break
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        positions = positions[:, -1:] + 1
        out = body(input_ids=nxt[:, None], attention_mask=mask, position_ids=positions, cache=out.cache,
                   use_cache=True, output_hidden_states=bool(layers))
        if features:
            step_features.append(out.last_hidden_state.float())
        if layers:
            step_layers.append(_layer_states(out, layers))
    return _answers(prefixes, torch.stack(tokens, 1).cpu(), torch.stack(top_i, 1).cpu(), torch.stack(top_v, 1).cpu(),
                    torch.cat(step_features, 1).cpu() if features else None, stops,
                    torch.cat(step_layers, 1).cpu() if layers else None)


def _layer_states(out, layers: tuple[int, ...]) -> torch.Tensor:
    """[rows, n, len(layers) · d] float16: the chosen intermediate layers side by side."""
    return torch.cat([out.hidden_states[i] for i in layers], dim=-1).half()


def _answers(prefixes, generated, top_i, top_v, features, stops, layer_features=None) -> list[Answer]:
    """Each row's answer cut after its first stop token, with what was kept for it."""
    width = max(len(p) for p in prefixes)
    answers = []
    for row, prefix in enumerate(prefixes):
        answer = generated[row].tolist()
        for i, token in enumerate(answer):
            if token in stops:
                answer = answer[: i + 1]
                break
        # [rows, width + steps - 1, ...]: the prefix's and the answer's fed positions
        fed = slice(width - len(prefix), width + len(answer) - 1)
        kept = None if features is None else features[row, fed].half().clone()
        layers = None if layer_features is None else layer_features[row, fed].clone()
        answers.append(Answer(answer, kept, top_i[row, : len(answer)].clone(), top_v[row, : len(answer)].clone(),
                              layers))
    return answers


def answer_all(model, prefixes: list[list[int]], *, batch: int, progress: str | None = None,
               **options) -> list[Answer]:
    """`answer_batch` over any number of prefixes, `batch` at a time, returned in their order.
    Prefixes of similar lengths go together (less padding); progress: a progress bar's label."""
    order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]))
    answers: list[Answer | None] = [None] * len(prefixes)
    bar = tqdm(total=len(prefixes), desc=progress, mininterval=2.0, unit="seq", disable=progress is None)
    for start in range(0, len(order), batch):
        group = order[start : start + batch]
        for i, answer in zip(group, answer_batch(model, [prefixes[i] for i in group], **options)):
            answers[i] = answer
        bar.update(len(group))
    bar.close()
    return answers  # type: ignore[return-value]
