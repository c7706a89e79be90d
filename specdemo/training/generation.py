"""The training data's one generation loop: many prompts answered together by the target.

    answers = answer_all(model, prefixes, batch=64, max_new_tokens=128, stops=stops, pad_id=pad)

Prefixes are left-padded so that every prompt ends at the same column, and decoded greedily
or sampled at a temperature among the `SAMPLE_CANDIDATES` most likely tokens. Each `Answer`
keeps its tokens (up to and including the first stop token), the target's top-k next-token
log-probabilities at temperature 1 at every answer step (what distillation matches) and,
with `features=True`, the target's final hidden state at every position it was fed (what a
feature-level draft reads), and with `feature_layers` the states of those intermediate layers
too (what a fused-feature head reads). All come out of the generating forward: no second pass.

How it spends as little as it can, each for a measured reason (docs/embedded-pair.md):

- **One preallocated cache per batch.** Keys and values live in a slab sized for the prompt plus
  every new token, written in place (`DynamicCache` concatenates the whole cache every step). The
  attention mask, the states and the top-k log-probabilities go into preallocated buffers too, so a
  step allocates nothing that grows with the answer.
- **Finished rows leave a greedy batch.** Every few steps the rows whose answer has ended are read
  back, their records cut, and they are dropped from the batch and its cache, so the rest stop
  paying for them. A sampled batch keeps them: a row's draw depends on the rows drawn with it, so
  dropping rows would change what a seed writes.
- **One read-back every few steps** (`DONE_CHECK_EVERY`), so a GPU queues steps ahead.
- **Optional `torch.compile`** of the decoder's one-token step (`compile_step=True`, CUDA): finished
  rows then stay in the batch, since dropping them would change the compiled shapes.

The corpus (`corpus.py`), the draft LM's trainer (`train_draft.py`) and the run at scale
(`at_scale_stages.py`) all answer through `answer_batch` / `answer_all`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import DynamicCache

from specdemo.engine.targets.batched import GrowingLayer

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


class SlabLayer(GrowingLayer):
    """A cache layer whose buffer holds `capacity` slots from the first write: no growth, no copy."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def _reserve(self, slots: int, like: torch.Tensor) -> None:
        if self.buffers is not None and self.buffers[0].shape[2] >= slots and self.buffers[0].shape[0] == like.shape[0]:
            return
        shape = (like.shape[0], like.shape[1], max(self.capacity, slots), like.shape[3])
        fresh = tuple(torch.empty(shape, dtype=like.dtype, device=like.device) for _ in range(2))
        if self.buffers is not None and self.held:
            for new, old in zip(fresh, self.buffers):
                new[:, :, : self.held] = old[:, :, : self.held]
        self.buffers = fresh


class _Batch:
    """The device-side state of one batch: live rows only, in buffers sized for the whole answer."""

    def __init__(self, model, prefixes: list[list[int]], max_new_tokens: int, pad_id: int, topk: int,
                 features: bool, feature_layers: tuple[int, ...]):
        self.device = next(model.parameters()).device
        ids, mask = (t.to(self.device) for t in left_padded(prefixes, pad_id))
        rows, self.width = ids.shape
        self.capacity = self.width + max_new_tokens
        self.cache = DynamicCache(config=model.config)
        self.cache.layers = [SlabLayer(self.capacity) for _ in self.cache.layers]
        self.mask = torch.zeros(rows, self.capacity, dtype=torch.long, device=self.device)
        self.mask[:, : self.width] = mask
        self.positions = (mask.cumsum(-1) - 1).clamp_min(0)
        self.prompt_ids = ids
        d = model.config.hidden_size
        self.states = torch.empty(rows, self.capacity, d, dtype=torch.float16, device=self.device) if features else None
        self.layer_states = (torch.empty(rows, self.capacity, len(feature_layers) * d, dtype=torch.float16,
                                         device=self.device) if feature_layers else None)
        self.tokens = torch.zeros(rows, max_new_tokens, dtype=torch.long, device=self.device)
        self.top_ids = torch.zeros(rows, max_new_tokens, topk, dtype=torch.int32, device=self.device)
        self.top_logp = torch.zeros(rows, max_new_tokens, topk, dtype=torch.float16, device=self.device)
        self.done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        self.members = list(range(rows))  # which prefix each row of the buffers holds

    def keep(self, index: torch.Tensor) -> None:
        """Keep only these rows (indices into the live rows), in every buffer and the cache."""
        for layer in self.cache.layers:
            layer.replace(layer.keys.index_select(0, index), layer.values.index_select(0, index))
        for name in ("mask", "positions", "states", "layer_states", "tokens", "top_ids", "top_logp", "done"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index))
        kept = index.tolist()
        self.members = [self.members[i] for i in kept]


def _store_states(batch: _Batch, out, column: slice, feature_layers: tuple[int, ...]) -> None:
    if batch.states is not None:
        batch.states[:, column] = out.last_hidden_state
    if batch.layer_states is not None:
        batch.layer_states[:, column] = torch.cat([out.hidden_states[i] for i in feature_layers], dim=-1)


def _finish_rows(batch: _Batch, rows: list[int], steps: int, prefixes, stops: set[int], answers: list) -> None:
    """Cut the answers of these live rows after their first stop token and keep their records."""
    if not rows:
        return
    index = torch.tensor(rows, device=batch.device)
    tokens = batch.tokens.index_select(0, index)[:, :steps].cpu()
    top_ids = batch.top_ids.index_select(0, index)[:, :steps].cpu()
    top_logp = batch.top_logp.index_select(0, index)[:, :steps].cpu()
    states = None if batch.states is None else batch.states.index_select(0, index).cpu()
    layers = None if batch.layer_states is None else batch.layer_states.index_select(0, index).cpu()
    for k, row in enumerate(rows):
        prefix = prefixes[batch.members[row]]
        answer = tokens[k].tolist()
        for i, token in enumerate(answer):
            if token in stops:
                answer = answer[: i + 1]
                break
        # the buffers' columns [width + steps]: the prefix's and the answer's fed positions
        fed = slice(batch.width - len(prefix), batch.width + len(answer) - 1)
        answers[batch.members[row]] = Answer(
            answer, None if states is None else states[k, fed].clone(), top_ids[k, : len(answer)].clone(),
            top_logp[k, : len(answer)].clone(), None if layers is None else layers[k, fed].clone())


def _decoder_step(body, compile_step: bool):
    if not compile_step:
        return body
    return torch.compile(body, dynamic=True)


@torch.inference_mode()
def answer_batch(model, prefixes: list[list[int]], *, max_new_tokens: int, stops: set[int], pad_id: int,
                 temperature: float = 0.0, topk: int = TOPK, generator: torch.Generator | None = None,
                 features: bool = True, feature_layers: tuple[int, ...] = (), compile_step: bool = False,
                 drop_finished: bool | None = None) -> list[Answer]:
    """Answer left-padded prefixes together, keeping top-k log-probs (and hidden states).

    Runs the decoder body and the LM head separately so that the hidden state the head reads is
    kept for free. generator: on the model's device (a CUDA multinomial takes only a CUDA one).
    drop_finished: by default in a greedy batch that is not compiled (see the module's notes).
    """
    body, head = model.get_decoder(), model.get_output_embeddings()
    layers = tuple(feature_layers) if features else ()
    drop_finished = (not compile_step and temperature <= 0) if drop_finished is None else drop_finished
    batch = _Batch(model, prefixes, max_new_tokens, pad_id, topk, features, layers)
    out = body(input_ids=batch.prompt_ids, attention_mask=batch.mask[:, : batch.width], position_ids=batch.positions,
               cache=batch.cache, use_cache=True, output_hidden_states=bool(layers))
    _store_states(batch, out, slice(0, batch.width), layers)
    step_body = _decoder_step(body, compile_step)
    stop_tensor = torch.tensor(sorted(stops), device=batch.device)
    answers: list[Answer | None] = [None] * len(prefixes)
    last_hidden = out.last_hidden_state[:, -1]
    for step in range(max_new_tokens):
        logp = F.log_softmax(head(last_hidden).float(), dim=-1)
        values, indices = logp.topk(min(max(topk, SAMPLE_CANDIDATES), logp.shape[-1]), dim=-1)
        batch.top_logp[:, step] = values[:, :topk].half()
        batch.top_ids[:, step] = indices[:, :topk].int()
        if temperature > 0:
            pick = torch.multinomial(F.softmax(values / temperature, dim=-1), 1, generator=generator)
            nxt = indices.gather(1, pick).squeeze(1)
        else:
            nxt = indices[:, 0]
        nxt = torch.where(batch.done, torch.full_like(nxt, pad_id), nxt)
        batch.tokens[:, step] = nxt
        batch.done |= torch.isin(nxt, stop_tensor)
        if step + 1 == max_new_tokens:
            break
        if step % DONE_CHECK_EVERY == DONE_CHECK_EVERY - 1:
            done = batch.done.tolist()
            if all(done):
                break
            if drop_finished and any(done):
                _finish_rows(batch, [i for i, d in enumerate(done) if d], step + 1, prefixes, stops, answers)
                batch.keep(torch.tensor([i for i, d in enumerate(done) if not d], device=batch.device))
                nxt = batch.tokens[:, step]
        column = batch.width + step
        batch.mask[:, column] = 1
        batch.positions = batch.positions[:, -1:] + 1
        out = step_body(input_ids=nxt[:, None], attention_mask=batch.mask[:, : column + 1],
                        position_ids=batch.positions, cache=batch.cache, use_cache=True,
                        output_hidden_states=bool(layers))
        _store_states(batch, out, slice(column, column + 1), layers)
        last_hidden = out.last_hidden_state[:, -1]
    _finish_rows(batch, list(range(len(batch.members))), step + 1, prefixes, stops, answers)
    return answers  # type: ignore[return-value]


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
