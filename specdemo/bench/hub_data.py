"""Suites from Hugging Face datasets: `hf:DATASET[:CONFIG]:SPLIT`.

`load_hf_suite("hf:wmt16:de-en:validation", prompt_field="translation.de",
reference_field="translation.en", template="Translate to English: {prompt}", limit=50)`
reads a split through the `datasets` library (an optional dependency: `pip install
'specdemo[data]'`) and turns each row into a `SuitePrompt`:
  prompt_field      the row's text for the request; dotted names reach into nested
                    fields ("translation.de")
  reference_field   the reference (a string or a list of strings), optional
  template          the request, with {prompt} standing for the prompt field's text
                    (default: the text as it is)
  prompt_words      (low, high): keep rows whose prompt has at least `low` words and cut
                    it to its first `high`; the words that followed become the reference
                    when no reference_field is given (continuations: WikiText, C4)
  prompt_tokens     the same in tokens of `tokenizer` (the pair's): rows of at least `low`
                    tokens, cut to `high`, the rest the reference
  category          the rows' category (default: the dataset's name)
  limit             read at most this many rows (after the filter)
DATASET is a Hub id or a local folder: a folder written by `save_to_disk` is read with
`load_from_disk`, any other (JSON, CSV or parquet files) with `load_dataset`, the same call
that reads a Hub dataset. The Hub's datasets are cached by `datasets` (HF_DATASETS_CACHE)
and read from that cache offline; one not cached fails with a message that says so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .suite import SuiteError, SuitePrompt

PREFIX = "hf:"


def is_hf_suite(source: Any) -> bool:
    return isinstance(source, str) and source.startswith(PREFIX)


def parse_hf_source(source: str) -> tuple[str, str | None, str]:
    """"hf:DATASET[:CONFIG]:SPLIT" → (dataset, config or None, split)."""
    parts = source[len(PREFIX):].split(":")
    if len(parts) not in (2, 3) or not all(p.strip() for p in parts):
        raise SuiteError(f"{source!r}: write hf:DATASET:SPLIT or hf:DATASET:CONFIG:SPLIT "
                         "(e.g. hf:abisee/cnn_dailymail:3.0.0:test)")
    if len(parts) == 2:
        return parts[0].strip(), None, parts[1].strip()
    return parts[0].strip(), parts[1].strip(), parts[2].strip()


def _field(row: dict, name: str, source: str) -> Any:
    value: Any = row
    for key in name.split("."):
        if not isinstance(value, dict) or key not in value:
            raise SuiteError(f"{source}: no field {name!r} in its rows; they have {', '.join(map(repr, row))}")
        value = value[key]
    return value


def _open(name: str, config: str | None, split: str, source: str):
    try:
        import datasets
    except ImportError:
        raise SuiteError(f"{source}: reading Hugging Face datasets needs the datasets library; "
                         "install it with pip install 'specdemo[data]' (or pip install datasets)") from None
    folder = Path(name)
    try:
        if folder.is_dir() and ((folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()):
            data = datasets.load_from_disk(str(folder))
            if isinstance(data, datasets.DatasetDict):
                if split not in data:
                    raise SuiteError(f"{source}: no split {split!r}; the dataset has {', '.join(data)}")
                data = data[split]
            return data
        return datasets.load_dataset(name, config, split=split)
    except SuiteError:
        raise
    except Exception as error:
        text = f"{type(error).__name__}: {error}"
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1" \
            or "offline" in text.lower() or "connection" in text.lower() or "couldn't reach" in text.lower()
        if offline and not folder.exists():
            raise SuiteError(f"{source}: the Hugging Face Hub cannot be reached (offline) and {name!r} is not in the "
                             "datasets cache; run once with the Hub reachable to cache it, or give a local folder") \
                from None
        raise SuiteError(f"{source}: cannot load {name!r}: {text.splitlines()[0]}") from None


def load_hf_suite(source: str, prompt_field: str, reference_field: str | None = None, template: str | None = None,
                  limit: int | None = None, category: str | None = None,
                  prompt_words: tuple[int, int] | None = None, prompt_tokens: tuple[int, int] | None = None,
                  tokenizer=None) -> list[SuitePrompt]:
    """The rows of a dataset split as suite prompts (see the module doc)."""
    name, config, split = parse_hf_source(source)
    if not prompt_field:
        raise SuiteError(f"{source}: say which field holds the prompt (--prompt-field, e.g. text or article)")
    if template is not None and "{prompt}" not in template:
        raise SuiteError(f"template {template!r} must contain {{prompt}} where the prompt's text goes")
    if limit is not None and (isinstance(limit, bool) or int(limit) < 1):
        raise SuiteError(f"limit must be an integer ≥ 1, got {limit!r}")
    for what, bounds in (("words", prompt_words), ("tokens", prompt_tokens)):
        if bounds is not None and not (1 <= bounds[0] <= bounds[1]):
            raise SuiteError(f"prompt {what} must be LOW:HIGH with 1 ≤ LOW ≤ HIGH, got {bounds[0]}:{bounds[1]}")
    if prompt_words is not None and prompt_tokens is not None:
        raise SuiteError("cut prompts in words or in tokens, not both")
    if prompt_tokens is not None and tokenizer is None:
        raise SuiteError("cutting prompts in tokens needs the pair's tokenizer")
    cut = _word_cut(prompt_words) if prompt_words else _token_cut(prompt_tokens, tokenizer) if prompt_tokens else None
    data = _open(name, config, split, source)
    label = category or f"{Path(name).name}"
    prompts: list[SuitePrompt] = []
    for index, row in enumerate(data):
        text = _field(row, prompt_field, source)
        if not isinstance(text, str) or not text.strip():
            continue
        references: tuple[str, ...] = ()
        if cut is not None:
            parts = cut(text)
            if parts is None:
                continue
            text, rest = parts
            if rest.strip() and reference_field is None:
                references = (rest.strip(),)
        if reference_field is not None:
            value = _field(row, reference_field, source)
            values = [value] if isinstance(value, str) else list(value or [])
            references = tuple(v for v in values if isinstance(v, str) and v.strip())
        request = template.replace("{prompt}", text) if template else text
        prompts.append(SuitePrompt(f"{label}-{index}", label, request, references=(references,) if references else ()))
        if limit is not None and len(prompts) >= int(limit):
            break
    if not prompts:
        shortest = (f" of at least {prompt_words[0]} words" if prompt_words else
                    f" of at least {prompt_tokens[0]} tokens" if prompt_tokens else "")
        raise SuiteError(f"{source}: no row has a non-empty {prompt_field!r}{shortest}")
    return prompts


def _word_cut(bounds: tuple[int, int]):
    """text → (its first `high` words, the words after them), or None under `low` words."""
    low, high = bounds

    def cut(text: str) -> tuple[str, str] | None:
        words = text.split()
        return None if len(words) < low else (" ".join(words[:high]), " ".join(words[high:]))
    return cut


def _token_cut(bounds: tuple[int, int], tokenizer):
    """text → (its first `high` tokens as text, the text after them), or None under `low` tokens."""
    low, high = bounds

    def cut(text: str) -> tuple[str, str] | None:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < low:
            return None
        head = tokenizer.decode(ids[:high])
        # The rest is the original text after the head, so the reference keeps its own spelling.
        rest = text[len(head):] if text.startswith(head) else tokenizer.decode(ids[high:])
        return head, rest
    return cut
