"""The draft's training data: the target's own answers, with what a draft learns from.

    python -m specdemo.training.corpus --out DIR [--minutes M] [--prompts N] [--batch 64]

Pipeline, every stage resumable (stop it at any time, run it again and it goes on):
1. requests: written templates (`prompts.py`) plus requests the target writes itself at
   high temperature (self-instruct) as sampled personas would ask them in sampled formats,
   near-duplicates (word 3-gram overlap ≥ 0.5) and held-out requests refused;
2. answers, a shard of `batch` requests at a time: greedy, or sampled at temperature 1 on
   every `--sample-every`-th shard; later shards also ask follow-up questions on earlier
   exchanges and ask for summaries of passages the target wrote;
3. for every position of every sequence the shard keeps the target's final hidden state
   (what a feature-level draft reads), with `--feature-layers` also those intermediate
   layers' states (what a fused-feature head reads), and, for answer positions, its top-k
   next-token log-probabilities (what distillation matches), all from the one generation
   loop (`generation.py`). A corpus written without the layers gets them afterwards from one
   teacher-forced pass (`python -m specdemo.training.layers`).

A shard is one `torch.save` file, written atomically; `manifest.json` counts what exists.
The request plan only grows: a larger `--prompts` or `--self-instruct` than it holds appends the
new requests at its end, so a corpus whose requests are all answered can go on.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import torch

from ..models.tokens import collect_eos_ids, encode_messages
from . import prompts as request_source
from .generation import answer_all, answer_batch, padding_id

SELF_INSTRUCT_KINDS = [
    "a question", "a request for advice", "a how-to question", "a request to explain something",
    "a request for a list", "a short writing task", "a simple coding question", "a trivia question",
    "a maths word problem", "a request to compare two things", "a question about history",
    "a question about science", "a question about everyday life", "a request for a recipe or plan",
    "a question about health", "a question about travel", "a question about money",
    "a question about language or grammar", "a question about animals", "a question about technology",
]


def default_dir() -> Path:
    root = os.environ.get("SPECDEMO_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "specdemo"
    return base / "draft-corpus"


def encode_chat(tokenizer, messages: list[dict]) -> list[int]:
    """A stored request ({"role", "content"} turns) through the chat template."""
    return encode_messages(tokenizer, [(m["role"], m["content"]) for m in messages])


class Corpus:
    """The shards under one directory, and the requests they answer."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def requests_path(self) -> Path:
        return self.root / "requests.jsonl"

    @property
    def self_instruct_path(self) -> Path:
        return self.root / "self_instruct.jsonl"

    def shard_path(self, index: int) -> Path:
        return self.root / f"shard-{index:05d}.pt"

    def shards(self) -> list[Path]:
        return sorted(self.root.glob("shard-*.pt"))

    def load_shard(self, index_or_path) -> dict:
        path = index_or_path if isinstance(index_or_path, Path) else self.shard_path(index_or_path)
        return torch.load(path, weights_only=False)

    def manifest(self) -> dict:
        sequences = tokens = 0
        prompts: set[str] = set()
        for path in self.shards():
            shard = self.load_shard(path)
            sequences += len(shard["answers"])
            tokens += sum(len(a) for a in shard["answers"])
            prompts.update(json.dumps(m) for m in shard["messages"])
        return {"shards": len(self.shards()), "sequences": sequences, "answer_tokens": tokens,
                "distinct_prompts": len(prompts)}

    def write_manifest(self) -> dict:
        """Count what exists and keep the count beside the shards (`manifest.json`)."""
        manifest = self.manifest()
        (self.root / "manifest.json").write_text(json.dumps(manifest, indent=1))
        return manifest


def save_atomic(obj, path: Path) -> None:
    partial = path.with_suffix(".partial")
    torch.save(obj, partial)
    partial.replace(path)


def append_jsonl(path: Path, records: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def self_instruct(model, tokenizer, corpus: Corpus, count: int, *, batch: int, seed: int, stops: set[int],
                  pad_id: int, deadline: float | None = None, log=print) -> list[dict]:
    """Requests the target writes itself, appended batch by batch so a stop loses one batch. Stops
    at `deadline` (a `time.monotonic()` value) too; a later run writes the rest."""
    found = read_jsonl(corpus.self_instruct_path)
    seen = request_source.NearDuplicates()
    for text in [r["messages"][0]["content"] for r in found] + request_source.heldout_prompts():
        seen.add(text)
    examples = request_source.written_prompts() + request_source.CHAT + request_source.CODE
    # Rounds are counted, not inferred from the requests kept: a resumed run that repeated a round
    # would ask the same questions with the same seed and keep nothing from it.
    rounds_path = corpus.root / "self_instruct_rounds.txt"
    round_index = 1000 + (int(rounds_path.read_text()) if rounds_path.is_file() else len(found) // max(1, batch))
    attempts = 0
    while len(found) < count and attempts < 4 * count // max(1, batch) + 4:
        if deadline is not None and time.monotonic() > deadline:
            log("time is up while the target writes requests; run again to go on")
            break
        attempts += 1
        rng = random.Random(seed * 7919 + round_index)
        round_index += 1
        asks = []
        for _ in range(batch):
            example = rng.choice(examples).splitlines()[0][:120]
            asks.append(request_source.persona_ask(rng, rng.choice(SELF_INSTRUCT_KINDS), example))
        prefixes = [encode_chat(tokenizer, [{"role": "user", "content": a}]) for a in asks]
        generator = torch.Generator(device=model.device).manual_seed(seed + round_index)
        answers = answer_batch(model, prefixes, max_new_tokens=48, stops=stops, pad_id=pad_id,
                               temperature=1.0, topk=1, generator=generator)
        fresh = []
        for answer in answers:
            text = tokenizer.decode([t for t in answer.tokens if t not in stops], skip_special_tokens=True)
            text = text.strip().strip('"').strip()
            first = text.splitlines()[0].strip() if text else ""
            if 12 <= len(first) <= 300 and first.endswith(("?", ".", "!")) and not seen.is_near(first):
                seen.add(first)
                fresh.append({"category": "self-instruct", "messages": [{"role": "user", "content": first}]})
        append_jsonl(corpus.self_instruct_path, fresh)
        rounds_path.write_text(str(round_index - 1000))
        found += fresh
        log(f"self-instruct: {len(found)}/{count} requests")
    return found[:count]


def requests_for(corpus: Corpus, count: int, extra: list[dict], seed: int) -> list[dict]:
    """The shuffled request list. It is written once, so a resumed run answers the same list, and
    only ever grows: asking for more requests than it holds appends the new ones at its end, so
    the shards already written keep the requests they answered. A lock keeps workers that grow
    it at the same time from appending the same requests twice."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock, so grow the plan from one process there
        fcntl = None

    corpus.root.mkdir(parents=True, exist_ok=True)
    with open(corpus.root / ".requests.lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        plan = read_jsonl(corpus.requests_path)
        seen = {json.dumps(r["messages"]).lower() for r in plan}
        fresh = []
        for r in request_source.build_prompts(count, seed) + extra:
            key = json.dumps(r["messages"]).lower()
            if key not in seen:
                seen.add(key)
                fresh.append(r)
        random.Random(seed + len(plan)).shuffle(fresh)
        append_jsonl(corpus.requests_path, fresh)
    return plan + fresh


def derived_requests(corpus: Corpus, tokenizer, index: int, lag: int, count: int, seed: int,
                     stops: set[int]) -> list[dict]:
    """Requests built on an earlier shard's finished answers, in turn: a follow-up, a summary, a
    question to answer from the answer as a passage, and a translation of its first sentences."""
    source = index - lag
    if count <= 0 or source < 0 or not corpus.shard_path(source).exists():
        return []
    shard = corpus.load_shard(source)
    rng = random.Random(seed * 31 + index)
    candidates = []
    shortest = min(24, shard["max_new_tokens"])
    for messages, answer in zip(shard["messages"], shard["answers"]):
        if len(messages) > 1 or len([t for t in answer if t not in stops]) < shortest:
            continue
        candidates.append((messages, tokenizer.decode(answer, skip_special_tokens=True).strip()))
    rng.shuffle(candidates)
    derived = []
    for i, (messages, text) in enumerate(candidates[:count]):
        kind = i % 4
        if kind == 0:
            derived.append(request_source.follow_up(messages, text, rng))
        elif kind == 1:
            derived.append(request_source.summarise(text, rng))
        elif kind == 2:
            derived.append(request_source.passage_question(text, rng))
        else:
            derived.append(request_source.passage_translation(text, rng))
    return derived


def shard_record(requests: list[dict], prefixes: list[list[int]], answers, temperature: float, max_new_tokens: int,
                 feature_layers: tuple[int, ...]) -> dict:
    """What a shard stores of its requests and the target's answers to them."""
    shard = {
        "messages": [r["messages"] for r in requests],
        "categories": [r["category"] for r in requests],
        "prefixes": prefixes,
        "answers": [a.tokens for a in answers],
        "features": [a.features for a in answers],
        "top_ids": [a.top_ids for a in answers],
        "top_logp": [a.top_logp for a in answers],
        "temperature": temperature,
        "max_new_tokens": max_new_tokens,
    }
    if feature_layers:
        shard["feature_layers"] = list(feature_layers)
        shard["layer_features"] = [a.layer_features for a in answers]
    return shard


def build(model, tokenizer, out: Path, *, prompts: int = 6000, self_instruct_count: int = 1500, batch: int = 64,
          derived_per_shard: int = 16, max_new_tokens: int = 128, sample_every: int = 4, max_prompt_tokens: int = 512,
          minutes: float | None = None, max_shards: int | None = None, seed: int = 0, worker: int = 0,
          workers: int = 1, feature_layers: tuple[int, ...] = (), writer=answer_all, log=print) -> dict:
    """Grow the corpus under `out` until the requests run out, `minutes` pass or `max_shards` exist.

    `writer` answers a shard's requests: `generation.answer_all`, or that loop with other options.

    With `workers` > 1, this process writes only the shards whose index is `worker` modulo
    `workers`, so several processes (one per core) grow one corpus without writing the same shard.
    """
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    corpus = Corpus(out)
    stops = collect_eos_ids(model, tokenizer)
    pad_id = padding_id(tokenizer)
    if worker == 0:  # the target writes what is still missing of its requests; a resumed run finds them
        extra = self_instruct(model, tokenizer, corpus, self_instruct_count, batch=batch, seed=seed,
                              stops=stops, pad_id=pad_id, deadline=deadline, log=log)
    else:  # the other workers take the requests worker 0 has written so far rather than write the same ones
        extra = read_jsonl(corpus.self_instruct_path)[:self_instruct_count]
    requests = requests_for(corpus, prompts, extra, seed)
    base_per_shard = max(1, batch - derived_per_shard)
    index = 0
    while index * base_per_shard < len(requests):
        if max_shards is not None and index >= max_shards:
            break
        if deadline is not None and time.monotonic() > deadline:
            log("time is up; run again to go on")
            break
        if corpus.shard_path(index).exists() or index % workers != worker:
            index += 1
            continue
        started = time.monotonic()
        chosen = requests[index * base_per_shard : (index + 1) * base_per_shard]
        chosen = chosen + derived_requests(corpus, tokenizer, index, 4, derived_per_shard, seed, stops)
        prefixes = [encode_chat(tokenizer, r["messages"]) for r in chosen]
        keep = [i for i, p in enumerate(prefixes) if len(p) <= max_prompt_tokens]
        chosen, prefixes = [chosen[i] for i in keep], [prefixes[i] for i in keep]
        temperature = 1.0 if sample_every and index % sample_every == sample_every - 1 else 0.0
        # On the model's device: a CUDA multinomial takes only a CUDA generator.
        generator = torch.Generator(device=model.device).manual_seed(seed * 1_000_003 + index)
        answers = writer(model, prefixes, batch=batch, max_new_tokens=max_new_tokens, stops=stops,
                         pad_id=pad_id, temperature=temperature, generator=generator,
                         feature_layers=feature_layers)
        save_atomic(shard_record(chosen, prefixes, answers, temperature, max_new_tokens, feature_layers),
                     corpus.shard_path(index))
        made = sum(len(a.tokens) for a in answers)
        log(f"shard {index}: {len(chosen)} answers, {made} tokens, T={temperature}, "
            f"{made / (time.monotonic() - started):.0f} tokens/s")
        index += 1
    return corpus.write_manifest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdemo.training.corpus", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=default_dir(), help="corpus directory (resumed if it exists)")
    parser.add_argument("--target", help="a save_pretrained folder; default: the embedded SmolLM2 target")
    parser.add_argument("--prompts", type=int, default=6000, help="written requests to draw (more than the plan holds appends new ones)")
    parser.add_argument("--self-instruct", type=int, default=1500, help="requests the target writes itself")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--derived-per-shard", type=int, default=16, help="requests per shard built on earlier answers: follow-ups, summaries, questions about "
                             "them as passages, translations of them")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--sample-every", type=int, default=4, help="every N-th shard is sampled at T=1 (0: never)")
    parser.add_argument("--minutes", type=float, help="stop after this long (run again to go on)")
    parser.add_argument("--max-shards", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes growing this corpus together")
    parser.add_argument("--worker", type=int, default=0, help="this process's index among --workers")
    parser.add_argument("--feature-layers", type=parse_layers, default=(),
                        help="also keep these intermediate layers' states, e.g. 2,15 (for a fused-feature head)")
    args = parser.parse_args(argv)
    if not 0 <= args.worker < args.workers:
        parser.error("--worker must be in 0 .. --workers - 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_teacher(args.target, args.device, getattr(torch, args.dtype))
    manifest = build(model, tokenizer, args.out, prompts=args.prompts, self_instruct_count=args.self_instruct,
                     batch=args.batch, derived_per_shard=args.derived_per_shard, max_new_tokens=args.max_new_tokens,
                     sample_every=args.sample_every, minutes=args.minutes, max_shards=args.max_shards, seed=args.seed,
                     worker=args.worker, workers=args.workers, feature_layers=args.feature_layers,
                     log=lambda m: print(m, flush=True))
    print(json.dumps(manifest))
    return 0


def parse_layers(text: str) -> tuple[int, ...]:
    """"2,15" -> (2, 15): indices into the target's hidden states (0 the embedding, i after layer i)."""
    try:
        layers = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"layers are comma-separated layer indices such as 2,15, not {text!r}")
    if not layers or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"layers are comma-separated indices ≥ 0 such as 2,15, not {text!r}")
    return layers


def load_teacher(target: str | None, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if target:
        model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(target)
    else:
        from specdemo.models.embedded import load_embedded_target

        model, tokenizer = load_embedded_target(device="cpu", dtype=torch.float32)
        model = model.to(dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model.to(device).eval(), tokenizer


if __name__ == "__main__": raise SystemExit(main())
