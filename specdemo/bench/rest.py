"""Building REST's datastore from a corpus: plain text (one document per blank-line-separated
block) or JSONL (each line's text fields: text, content, prompt, turns, reference, answer,
response, output; else every string in it), tokenised with the pair's tokenizer.

    python -m specdemo.bench.rest build CORPUS OUT [--tokenizer embedded|HUB_ID|FOLDER]
    python -m specdemo.bench.rest info OUT

The datastore is then passed to the `rest` method as rest_datastore=OUT.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterator

from ..engine.drafters.rest import SEPARATOR, Datastore, build_datastore, load_datastore, save_datastore

TEXT_FIELDS = ("text", "content", "prompt", "turns", "reference", "answer", "response", "output")
EMBEDDED = "embedded"


def _strings(value) -> Iterator[str]:
    if isinstance(value, str):
        if value.strip():
            yield value
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)


def read_documents(path: str | Path) -> list[str]:
    """The corpus's documents as text."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return [block.strip() for block in text.split("\n\n") if block.strip()]
    documents = []
    for line in text.splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        chosen = {k: record[k] for k in TEXT_FIELDS if k in record} if isinstance(record, dict) else {}
        documents += list(_strings(chosen or record))
    return documents


def load_tokenizer(name: str):
    if name == EMBEDDED:
        from ..models.embedded import load_embedded_target

        return load_embedded_target(device="cpu")[1]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


def build_from_corpus(corpus: str | Path, out: str | Path, tokenizer=EMBEDDED) -> Datastore:
    """Tokenise the corpus (`tokenizer`: a name for `load_tokenizer`, or a tokenizer) and save its datastore."""
    name = tokenizer if isinstance(tokenizer, str) else getattr(tokenizer, "name_or_path", "")
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer
    documents = [tok(text, add_special_tokens=False)["input_ids"] for text in read_documents(corpus)]
    store = build_datastore(documents, tokenizer=name)
    save_datastore(store, out)
    return store


def describe(store: Datastore) -> str:
    documents = int((store.tokens == SEPARATOR).sum())
    return (f"{len(store) - documents:,} tokens in {documents:,} documents, ids below {store.vocab_size:,}, "
            f"sorted on {store.window} tokens, tokenizer {store.tokenizer or '(unnamed)'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdemo.bench.rest", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="tokenise a text or JSONL corpus into a datastore file")
    build.add_argument("corpus", help="a .txt/.md file (blank lines separate documents) or a .jsonl file")
    build.add_argument("out", help="the datastore file to write (.npz)")
    build.add_argument("--tokenizer", default=EMBEDDED, help="embedded (the embedded pair's), a hub id or a folder")
    info = commands.add_parser("info", help="describe a datastore file")
    info.add_argument("path")
    args = parser.parse_args(argv)
    if args.command == "build":
        store = build_from_corpus(args.corpus, args.out, args.tokenizer)
        print(f"wrote {args.out}: {describe(store)}")
    else:
        print(describe(load_datastore(args.path)))


if __name__ == "__main__": main()
