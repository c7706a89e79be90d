"""The prompt suite: reading and validating a JSONL suite, picking categories, encoding a
prompt (single or multi-turn) for a pair. The default suite ships inside the package.

May import ``specdemo.models`` (chat encoding); nothing above it.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ..models.tokens import encode_messages

# A file inside the installed package, so `bench` finds it outside a checkout too.
DEFAULT_SUITE = files(__package__) / "suite.jsonl"
SUITE_CATEGORIES = ("chat", "translation", "summarisation", "rag", "math", "code")
ALL = "all"


class SuiteError(ValueError):
    """A prompt suite is missing, malformed or selects nothing; the message says where."""


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    category: str
    prompt: str
    # Earlier turns of a multi-turn chat, the last one the user's; None for a single turn.
    messages: tuple[tuple[str, str], ...] | None = None


def load_suite(source: str | Path | Iterable[dict]) -> list[SuitePrompt]:
    """Read and validate a suite: a JSONL file (one {"prompt", "category"} object a line,
    optional "id" and "messages") or the same objects as an iterable."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise SuiteError(f"suite file not found: {path}")
        records = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    records.append((f"{path.name}:{number}", json.loads(line)))
                except json.JSONDecodeError as error:
                    raise SuiteError(f"{path.name}:{number}: not valid JSON ({error.msg})") from None
        name = path.name
    else:
        records = [(f"item {i + 1}", item) for i, item in enumerate(source)]
        name = "suite"
    if not records:
        raise SuiteError(f"{name}: the suite is empty; each line needs a JSON object with 'prompt' and 'category'")
    prompts, seen = [], set()
    for where, item in records:
        category = item.get("category") if isinstance(item, dict) else None
        number = 1 + sum(1 for p in prompts if p.category == (category.strip() if isinstance(category, str) else None))
        prompt = _suite_item(where, item, number)
        if prompt.id in seen:
            raise SuiteError(f"{where}: duplicate id {prompt.id!r}")
        seen.add(prompt.id)
        prompts.append(prompt)
    return prompts


def _suite_item(where: str, item: Any, number: int) -> SuitePrompt:
    if not isinstance(item, dict):
        raise SuiteError(f"{where}: expected a JSON object with 'prompt' and 'category', got {type(item).__name__}")
    missing = [key for key in ("prompt", "category") if key not in item]
    if missing:
        raise SuiteError(f"{where}: missing {' and '.join(repr(k) for k in missing)}")
    prompt, category = item["prompt"], item["category"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise SuiteError(f"{where}: 'prompt' must be a non-empty string")
    if not isinstance(category, str) or not category.strip():
        raise SuiteError(f"{where}: 'category' must be a non-empty string")
    messages = item.get("messages")
    if messages is not None:
        ok = isinstance(messages, list) and messages and all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant", "system")
            and isinstance(m.get("content"), str) for m in messages
        )
        if not ok or messages[-1]["role"] != "user":
            raise SuiteError(f"{where}: 'messages' must be a list of {{'role', 'content'}} objects ending with a user turn")
        messages = tuple((m["role"], m["content"]) for m in messages)
    prompt_id = str(item.get("id") or f"{category.strip()}-{number}")
    return SuitePrompt(prompt_id, category.strip(), prompt, messages)


def select_prompts(
    suite: Sequence[SuitePrompt], categories: str | Sequence[str] | None = None, limit: int | None = None
) -> list[SuitePrompt]:
    """The suite's prompts in the given categories (all if None), the first `limit` of each."""
    present = list(dict.fromkeys(p.category for p in suite))
    if isinstance(categories, str):
        categories = [c.strip() for c in categories.split(",") if c.strip()]
    if categories:
        unknown = [c for c in categories if c not in present]
        if unknown:
            raise SuiteError(f"no prompts in categor{'y' if len(unknown) == 1 else 'ies'} "
                             f"{', '.join(map(repr, unknown))}; the suite has {', '.join(present)}")
        wanted = list(dict.fromkeys(categories))
    else:
        wanted = present
    if limit is not None and (isinstance(limit, bool) or int(limit) < 1):
        raise SuiteError(f"limit must be an integer ≥ 1 (prompts per category), got {limit!r}")
    chosen = []
    for category in wanted:
        items = [p for p in suite if p.category == category]
        chosen.extend(items[: int(limit)] if limit else items)
    return chosen


def encode_prompt(pair, item: SuitePrompt, chat: bool) -> list[int]:
    """Token ids every method is fed: through the chat template when chat is on."""
    if item.messages is None:
        return pair.encode(item.prompt, chat=chat)
    if chat:
        return encode_messages(pair.tokenizer, item.messages)
    transcript = "\n".join(f"{r.capitalize()}: {c}" for r, c in item.messages) + "\nAssistant:"
    return pair.encode(transcript, chat=False)
