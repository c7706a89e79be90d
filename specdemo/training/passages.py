"""Broad text for the draft: passages the target reads rather than writes.

    python -m specdemo.training.passages --out DIR [--minutes M] [--package NAME ...]

Generating an answer costs a forward per token; reading a written passage costs one forward for
all of it, about five to ten times more tokens per second on a CPU. EAGLE found that a feature
head learns nearly as well from fixed text as from the target's own answers, because what it
imitates is how the target's hidden states move, and the target computes those on any text.

The text is what every Python installation carries under permissive licences: the docstrings
of the standard library (PSF licence), the interpreter's own help topics (`pydoc_data`), and the
docstrings of installed packages whose metadata names an MIT, BSD, Apache, ISC or PSF licence.
Each passage becomes the assistant's turn of a chat whose user asks about the passage's
subject, so the target reads it in the state it answers in. The shards have the corpus's
layout (`corpus.py`) minus the top-k log-probabilities, which a feature head does not read:
token ids and the target's final hidden state at every position.

Resumable like the corpus: the passage plan is written once, a shard at a time follows it.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.metadata
import importlib.util
import json
import random
import re
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .corpus import Corpus, append_jsonl, read_jsonl, save_atomic, encode_chat
from .corpus import default_dir as answers_dir
from .generation import padding_id

PACKAGES = ("transformers", "torch", "pandas", "numpy", "scipy", "sympy", "networkx", "gradio", "plotly",
            "huggingface_hub")
PERMISSIVE = ("mit", "bsd", "apache", "isc", "psf", "python software foundation")
SKIPPED_DIRS = {"test", "tests", "testing", "idlelib", "lib2to3", "ensurepip", "turtledemo", "site-packages",
                "dist-packages", "_vendor", "vendored", "__pycache__"}
REQUEST_FORMS = (
    "Explain {title}.",
    "What does {title} do?",
    "Tell me about {title}.",
    "Describe {title} in detail.",
    "How is {title} used?",
    "Write the documentation for {title}.",
)


@dataclass(frozen=True)
class Passage:
    source: str  # where the text comes from: "python stdlib", "python help topics" or a package name
    title: str  # what the passage documents (a dotted name or a help topic)
    text: str


def default_dir() -> Path:
    return answers_dir().with_name("text-corpus")


def licence_of(distribution: str) -> str:
    """The licence a distribution's metadata declares (expression, field or classifier), or ''."""
    try:
        meta = importlib.metadata.distribution(distribution).metadata
    except importlib.metadata.PackageNotFoundError:
        return ""
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License")]
    field = (meta.get("License") or "").strip()
    return meta.get("License-Expression") or (field if 0 < len(field) < 80 else "") or "; ".join(classifiers)


def is_permissive(licence: str) -> bool:
    lowered = licence.lower()
    return bool(lowered) and "gpl" not in lowered and any(name in lowered for name in PERMISSIVE)


def reads_as_prose(text: str) -> bool:
    """Mostly words, not a doctest session or a table of numbers: the held-out requests are chat."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    session = sum(line.startswith((">>>", "...")) for line in lines)
    wordy = sum(c.isalpha() or c.isspace() for c in text)
    return session <= 0.2 * len(lines) and wordy >= 0.8 * len(text)


def split_paragraphs(text: str, max_chars: int) -> list[str]:
    """Consecutive paragraphs joined into pieces of at most about max_chars."""
    pieces, current = [], ""
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        if current and len(current) + len(paragraph) + 2 > max_chars:
            pieces.append(current)
            current = ""
        current = f"{current}\n\n{paragraph}" if current else paragraph
    if current:
        pieces.append(current)
    # A leading indent would merge with the chat template's newline into another token.
    return [p[:max_chars].strip() for p in pieces]


def docstring_passages(root: Path, source: str, prefix: str = "", min_chars: int = 300,
                       max_chars: int = 1600) -> list[Passage]:
    """The docstrings of every module, class and function under `root` that say something."""
    passages = []
    for path in sorted(root.rglob("*.py")):
        if SKIPPED_DIRS & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(filter(None, [prefix, *path.relative_to(root).with_suffix("").parts]))
        module = module.removesuffix(".__init__")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc) < min_chars:
                continue
            title = module if isinstance(node, ast.Module) else f"{module}.{node.name}"
            passages += [Passage(source, f"`{title}`", piece) for piece in split_paragraphs(doc, max_chars)
                         if len(piece) >= min_chars // 2 and reads_as_prose(piece)]
    return passages


def help_topic_passages(max_chars: int = 1600) -> list[Passage]:
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [Passage("python help topics", f"the Python topic '{name}'", piece)
            for name, text in sorted(topics.items()) for piece in split_paragraphs(text, max_chars)
            if len(piece) >= 150 and reads_as_prose(piece)]


def gather(packages=PACKAGES, stdlib: bool = True) -> tuple[list[Passage], dict[str, str]]:
    """Every passage of the chosen sources (each text once), and the licence of each source."""
    passages, licences = [], {}
    if stdlib:
        passages += docstring_passages(Path(sysconfig.get_paths()["stdlib"]), "python stdlib")
        passages += help_topic_passages()
        licences["python stdlib"] = licences["python help topics"] = "PSF-2.0"
    for name in packages:
        spec = importlib.util.find_spec(name)
        licence = licence_of(name)
        if spec is None or not spec.submodule_search_locations or not is_permissive(licence):
            continue
        licences[name] = licence
        passages += docstring_passages(Path(list(spec.submodule_search_locations)[0]), name, prefix=name)
    seen, unique = set(), []
    for passage in passages:
        key = hashlib.sha1(passage.text.encode()).hexdigest()
        if key not in seen:
            seen.add(key)
            unique.append(passage)
    return unique, licences


def as_messages(passage: Passage, rng: random.Random) -> list[dict]:
    return [{"role": "user", "content": rng.choice(REQUEST_FORMS).format(title=passage.title)},
            {"role": "assistant", "content": passage.text}]


@torch.no_grad()
def read_batch(model, prefixes: list[list[int]], answers: list[list[int]], pad_id: int) -> list[torch.Tensor]:
    """The target's final hidden state at every position but the last of prefix + answer, in one
    right-padded forward (the decoder body alone: a feature head needs no logits)."""
    device = next(model.parameters()).device
    sequences = [p + a for p, a in zip(prefixes, answers)]
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(sequence)
        mask[row, : len(sequence)] = 1
    hidden = model.get_decoder()(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
    return [hidden[row, : len(s) - 1].half().cpu().clone() for row, s in enumerate(sequences)]


def plan(corpus: Corpus, sources, seed: int, log=print) -> list[dict]:
    """The passages in the order the shards take them, written once so that a resumed run agrees.
    `sources()` gives the passages and the licence of each source (`gather`)."""
    path = corpus.root / "passages.jsonl"
    if path.is_file():
        return read_jsonl(path)
    passages, licences = sources()
    rng = random.Random(seed)
    rng.shuffle(passages)
    records = [{**asdict(p), "messages": as_messages(p, rng)} for p in passages]
    corpus.root.mkdir(parents=True, exist_ok=True)
    (corpus.root / "sources.json").write_text(json.dumps(licences, indent=1))
    append_jsonl(path, records)
    log(f"planned {len(records)} passages from {len(licences)} sources")
    return records


def build(model, tokenizer, out: Path, *, sources=gather, passages_per_shard: int = 64, batch_tokens: int = 8192,
          max_answer_tokens: int = 384, minutes: float | None = None, max_shards: int | None = None, seed: int = 0,
          worker: int = 0, workers: int = 1, log=print) -> dict:
    """Read passages into shards under `out` until they run out, `minutes` pass or `max_shards` exist."""
    deadline = None if minutes is None else time.monotonic() + 60 * minutes
    corpus = Corpus(out)
    records = plan(corpus, sources, seed, log) if worker == 0 else read_jsonl(corpus.root / "passages.jsonl")
    pad_id = padding_id(tokenizer)
    for index in range(0, -(-len(records) // passages_per_shard)):
        if max_shards is not None and index >= max_shards:
            break
        if deadline is not None and time.monotonic() > deadline:
            log("time is up; run again to go on")
            break
        if corpus.shard_path(index).exists() or index % workers != worker:
            continue
        started = time.monotonic()
        chosen = records[index * passages_per_shard : (index + 1) * passages_per_shard]
        prefixes = [encode_chat(tokenizer, r["messages"][:1]) for r in chosen]
        full = [encode_chat(tokenizer, r["messages"]) for r in chosen]
        # The answer is what the chat template puts after the request: the passage and its end.
        answers = [f[len(p):][:max_answer_tokens] if f[: len(p)] == p else [] for f, p in zip(full, prefixes)]
        keep = [i for i, a in enumerate(answers) if len(a) >= 2]
        features: dict[int, torch.Tensor] = {}
        order = sorted(keep, key=lambda i: len(prefixes[i]) + len(answers[i]))
        group: list[int] = []
        for i in order + [None]:
            if i is not None and (not group or (len(group) + 1) * (len(prefixes[i]) + len(answers[i])) <= batch_tokens):
                group.append(i)
                continue
            for j, feats in zip(group, read_batch(model, [prefixes[j] for j in group], [answers[j] for j in group],
                                                  pad_id)):
                features[j] = feats
            group = [i] if i is not None else []
        shard = {
            "messages": [chosen[i]["messages"] for i in keep],
            "categories": [f"text: {chosen[i]['source']}" for i in keep],
            "prefixes": [prefixes[i] for i in keep],
            "answers": [answers[i] for i in keep],
            "features": [features[i] for i in keep],
            "top_ids": [], "top_logp": [],  # a feature head reads hidden states only
            "temperature": None,
            "max_new_tokens": max_answer_tokens,
        }
        save_atomic(shard, corpus.shard_path(index))
        read = sum(len(answers[i]) for i in keep)
        log(f"shard {index}: {len(keep)} passages, {read} tokens, {read / (time.monotonic() - started):.0f} tokens/s")
    return corpus.write_manifest()


def main(argv=None) -> int:
    from .corpus import load_teacher

    parser = argparse.ArgumentParser(prog="python -m specdemo.training.passages", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=default_dir(), help="text corpus directory (resumed if it exists)")
    parser.add_argument("--target", help="a save_pretrained folder; default: the embedded SmolLM2 target")
    parser.add_argument("--package", action="append", help=f"packages whose docstrings to read (default: {', '.join(PACKAGES)})")
    parser.add_argument("--passages-per-shard", type=int, default=64)
    parser.add_argument("--batch-tokens", type=int, default=8192, help="padded tokens per forward")
    parser.add_argument("--minutes", type=float, help="stop after this long (run again to go on)")
    parser.add_argument("--max-shards", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1, help="processes reading into this corpus together")
    parser.add_argument("--worker", type=int, default=0, help="this process's index among --workers")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_teacher(args.target, args.device, torch.float32)
    packages = tuple(args.package or PACKAGES)
    manifest = build(model, tokenizer, args.out, sources=lambda: gather(packages),
                     passages_per_shard=args.passages_per_shard, batch_tokens=args.batch_tokens, minutes=args.minutes,
                     max_shards=args.max_shards, seed=args.seed, worker=args.worker, workers=args.workers,
                     log=lambda m: print(m, flush=True))
    print(json.dumps(manifest))
    return 0


if __name__ == "__main__": raise SystemExit(main())
