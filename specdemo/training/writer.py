"""The corpus's batched writer: the same answers as `generation.answer_batch`, with less waste.

    answers = write_all(model, prefixes, batch=256, max_new_tokens=128, stops=stops, pad_id=pad)
    python -m specdemo.training.writer --compare --threads 2 --seconds 60   # against today's writer

It returns the same `Answer` records, so `corpus.build(..., writer=write_all)` writes shards the
trainer reads unchanged. What it does differently, each for a measured reason (docs/embedded-pair.md):

- **One preallocated cache per batch.** Keys and values live in a slab sized for the prompt plus
  every new token, written in place; `DynamicCache` concatenates the whole cache every step. The
  attention mask, the states and the top-k log-probabilities go into preallocated buffers too, so a
  step allocates nothing that grows with the answer.
- **Finished rows leave.** Every few steps the rows whose answer has ended are read back, their
  records cut, and they are dropped from the batch and its cache, so the rest of the batch stops
  paying for them (today's writer runs every row until the slowest ends).
- **One read-back every few steps** (`DONE_CHECK_EVERY`), as today's writer, so a GPU queues steps ahead.
- **Optional `torch.compile`** of the decoder's one-token step (`compile_step=True`, CUDA): finished
  rows then stay in the batch, since dropping them would change the compiled shapes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from specdemo.engine.targets.batched import GrowingLayer

from .generation import DONE_CHECK_EVERY, SAMPLE_CANDIDATES, TOPK, Answer, left_padded


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
        fed = slice(batch.width - len(prefix), batch.width + len(answer) - 1)
        answers[batch.members[row]] = Answer(
            answer, None if states is None else states[k, fed].clone(), top_ids[k, : len(answer)].clone(),
            top_logp[k, : len(answer)].clone(), None if layers is None else layers[k, fed].clone())


def _decoder_step(body, compile_step: bool):
    if not compile_step:
        return body
    return torch.compile(body, dynamic=True)


@torch.inference_mode()
def write_batch(model, prefixes: list[list[int]], *, max_new_tokens: int, stops: set[int], pad_id: int,
                temperature: float = 0.0, topk: int = TOPK, generator: torch.Generator | None = None,
                features: bool = True, feature_layers: tuple[int, ...] = (), compile_step: bool = False,
                drop_finished: bool | None = None) -> list[Answer]:
    """`answer_batch`'s answers, from a preallocated cache, finished rows dropped as they end."""
    body, head = model.get_decoder(), model.get_output_embeddings()
    layers = tuple(feature_layers) if features else ()
    drop_finished = (not compile_step) if drop_finished is None else drop_finished
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


def write_all(model, prefixes: list[list[int]], *, batch: int, progress: str | None = None,
              **options) -> list[Answer]:
    """`write_batch` over any number of prefixes, `batch` at a time, in their order; prefixes of
    similar lengths go together (less padding). Takes `answer_all`'s arguments."""
    del progress  # the corpus logs each shard's rate; a bar per batch adds nothing
    order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]))
    answers: list[Answer | None] = [None] * len(prefixes)
    for start in range(0, len(order), batch):
        group = order[start : start + batch]
        for i, answer in zip(group, write_batch(model, [prefixes[i] for i in group], **options)):
            answers[i] = answer
    return answers  # type: ignore[return-value]


def idle_share(prefixes: list[list[int]], answers: list, batch: int) -> tuple[int, int]:
    """(row-steps a loop that runs every row until its batch's longest answer ends computes, those
    that wrote an answer token), over `answer_all`'s batches: what dropping finished rows saves."""
    order = sorted(range(len(prefixes)), key=lambda i: len(prefixes[i]))
    computed = useful = 0
    for start in range(0, len(order), batch):
        lengths = [len(answers[i].tokens) for i in order[start : start + batch]]
        computed += len(lengths) * max(lengths)
        useful += sum(lengths)
    return computed, useful


def compare(model, tokenizer, *, seconds: float, old_batch: int, new_batch: int, max_new_tokens: int,
            new_model=None, seed: int = 11, log=print) -> dict:
    """Today's writer (`answer_all`) and this one on the same requests, turn by turn, until each has
    written for `seconds`: they alternate which goes first, so both see the same load on a shared
    machine. Greedy, so both write the same answers; `same_answers` says how many did."""
    from ..models.tokens import collect_eos_ids, encode_messages
    from . import prompts as request_source
    from .generation import answer_all, padding_id

    stops, pad_id = collect_eos_ids(model, tokenizer), padding_id(tokenizer)
    requests = request_source.build_prompts(20000, seed)
    options = dict(max_new_tokens=max_new_tokens, stops=stops, pad_id=pad_id)
    sides = {"today": lambda p: answer_all(model, p, batch=old_batch, **options),
             "batched": lambda p: write_all(new_model or model, p, batch=new_batch, **options)}
    spent = {name: 0.0 for name in sides}
    tokens = {name: 0 for name in sides}
    same = total = turn = 0
    row_steps = [0, 0]  # today's loop: row-steps computed, and those that wrote a token
    chunk = max(old_batch, new_batch)
    while min(spent.values()) < seconds and (turn + 1) * chunk <= len(requests):
        prefixes = [encode_messages(tokenizer, [(m["role"], m["content"]) for m in r["messages"]])
                    for r in requests[turn * chunk : (turn + 1) * chunk]]
        written = {}
        for name in (list(sides) if turn % 2 == 0 else list(sides)[::-1]):
            started = time.perf_counter()
            written[name] = sides[name](prefixes)
            spent[name] += time.perf_counter() - started
            tokens[name] += sum(len(a.tokens) for a in written[name])
        same += sum(a.tokens == b.tokens for a, b in zip(written["today"], written["batched"]))
        computed, useful = idle_share(prefixes, written["today"], old_batch)
        row_steps[0] += computed
        row_steps[1] += useful
        total += len(prefixes)
        turn += 1
        log(f"turn {turn}: " + ", ".join(f"{n} {tokens[n] / spent[n]:.0f} tokens/s" for n in sides))
    rates = {name: round(tokens[name] / spent[name], 1) for name in sides}
    return {"tokens_per_s": rates, "ratio": round(rates["batched"] / rates["today"], 3), "turns": turn,
            "requests": total, "same_answers": same,
            "today_idle_row_steps": round(1 - row_steps[1] / max(1, row_steps[0]), 3), "answer_tokens": tokens, "seconds": {
                n: round(s, 1) for n, s in spent.items()}, "threads": torch.get_num_threads(),
            "old_batch": old_batch, "new_batch": new_batch, "max_new_tokens": max_new_tokens}


def load_target(target: str | None, dtype: torch.dtype):
    """The target on the CPU: a save_pretrained folder, or the embedded SmolLM2 target."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if target:
        model, tokenizer = AutoModelForCausalLM.from_pretrained(target, dtype=dtype), AutoTokenizer.from_pretrained(target)
    else:
        from specdemo.models.embedded import load_embedded_target

        model, tokenizer = load_embedded_target(device="cpu", dtype=torch.float32)
        model = model.to(dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


def main(argv=None) -> int:

    parser = argparse.ArgumentParser(prog="python -m specdemo.training.writer", description=__doc__.split("\n")[0])
    parser.add_argument("--compare", action="store_true", required=True,
                        help="time today's writer and this one, interleaved, on the embedded target")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60, help="writing time each side gets at least")
    parser.add_argument("--batch", type=int, default=64, help="today's writer's batch (the corpus's default)")
    parser.add_argument("--new-batch", type=int, default=64, help="this writer's batch")
    parser.add_argument("--new-dtype", default="float32", choices=["float32", "bfloat16"],
                        help="this writer's precision (today's stays float32)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--target", help="a save_pretrained folder; default: the embedded SmolLM2 target")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_target(args.target, torch.float32)
    new_model = None
    if args.new_dtype != "float32":
        new_model, _ = load_target(args.target, getattr(torch, args.new_dtype))
    report = compare(model, tokenizer, seconds=args.seconds, old_batch=args.batch, new_batch=args.new_batch,
                     max_new_tokens=args.max_new_tokens, new_model=new_model, log=lambda m: print(m, flush=True))
    report["new_dtype"] = args.new_dtype
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__": raise SystemExit(main())
