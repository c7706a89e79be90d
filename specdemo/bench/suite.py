"""The prompt suite: reading and validating a suite, picking categories, encoding a prompt
(single or multi-turn) for a pair. The default suite ships inside the package.

A suite file is JSONL in either of two shapes, told apart by each line's content:
  ours        {"prompt": ..., "category": ...} with optional "id", "messages" (earlier turns
              of a chat) and "reference" (a string or a list of strings)
  question    Spec-Bench's and MT-bench's question.jsonl: {"question_id": 81, "category":
              "writing", "turns": ["first user turn", "second user turn"]}, with optional
              "reference" (one entry per turn, or for a single turn a string or a list)
A question of several turns is run turn by turn (`conversation`): each method answers
turn 1, then turn 2 with its own answer to turn 1 in the conversation. `category_map`
renames categories as they are read; `MT_BENCH` groups MT-bench's eight into Spec-Bench's
`multi_turn`. `hf:DATASET[:CONFIG]:SPLIT` suites are read by `specdemo.bench.hub_data`.

May import ``specdemo.models`` (chat encoding); nothing above it.
"""

from __future__ import annotations

import dataclasses
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


# MT-bench's eight categories, reported by Spec-Bench as one.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
MULTI_TURN = "multi_turn"
MT_BENCH = "mt-bench"
CATEGORY_MAPS: dict[str, dict[str, str]] = {MT_BENCH: {c: MULTI_TURN for c in MT_BENCH_CATEGORIES}}


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    category: str
    prompt: str
    # Earlier turns of a multi-turn chat, the last one the user's; None for a single turn.
    messages: tuple[tuple[str, str], ...] | None = None
    # What a good output says: the references of each turn (one entry per turn, () for none).
    references: tuple[tuple[str, ...], ...] = ()
    # The user turns of a question run turn by turn (question.jsonl shape); () for one request.
    turns: tuple[str, ...] = ()

    @property
    def turn_count(self) -> int:
        return max(1, len(self.turns))

    def references_for(self, turn: int) -> tuple[str, ...]:
        """The references of turn 1, 2, … (empty when there are none)."""
        return self.references[turn - 1] if turn - 1 < len(self.references) else ()


def prompts_label(prompts: Sequence[SuitePrompt]) -> str:
    """A run of prompts as a progress line names it: the one id, or the first and last and how many."""
    ids = [item.id for item in prompts]
    return ids[0] if len(ids) == 1 else f"{ids[0]}…{ids[-1]} ({len(ids)} prompts)"


def conversation(item: SuitePrompt, turn: int, answers: Sequence[str]) -> SuitePrompt:
    """The request of `turn` (1-based) of a question run turn by turn: its user turns so far,
    each earlier one followed by the method's own answer to it (answers[k] for turn k + 1)."""
    if not item.turns:
        return item
    if len(answers) < turn - 1:
        raise ValueError(f"turn {turn} of {item.id!r} needs the answers to the {turn - 1} turn(s) before it")
    messages: list[tuple[str, str]] = []
    for k in range(turn - 1):
        messages += [("user", item.turns[k]), ("assistant", answers[k])]
    messages.append(("user", item.turns[turn - 1]))
    return SuitePrompt(item.id, item.category, item.turns[turn - 1], tuple(messages), item.references)


def parse_category_map(value: str | dict | None) -> dict[str, str]:
    """A category map from "mt-bench" (built in), "old=new,old2=new2", a JSON file of
    {"old": "new"} or a dict; {} for None or ""."""
    if not value:
        return {}
    if isinstance(value, dict):
        mapping = value
    elif value.strip() in CATEGORY_MAPS:
        return dict(CATEGORY_MAPS[value.strip()])
    elif Path(value).is_file():
        try:
            mapping = json.loads(Path(value).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise SuiteError(f"category map {value}: not valid JSON ({error.msg})") from None
    else:
        mapping = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            old, sep, new = part.partition("=")
            if not sep or not old.strip() or not new.strip():
                raise SuiteError(f"category map: {part!r} is not old=new; give 'old=new,…', a JSON file or one of "
                                 f"{', '.join(CATEGORY_MAPS)}")
            mapping[old.strip()] = new.strip()
    if not isinstance(mapping, dict) or not all(isinstance(k, str) and isinstance(v, str) and v.strip()
                                                for k, v in mapping.items()):
        raise SuiteError("category map: expected {\"old category\": \"new category\"} with non-empty names")
    return {k: v.strip() for k, v in mapping.items()}


def load_suite(source: str | Path | Iterable[dict], category_map: str | dict | None = None) -> list[SuitePrompt]:
    """Read and validate a suite: a JSONL file of either shape (see the module doc), one object
    a line, or the same objects as an iterable; categories renamed by `category_map`."""
    renames = parse_category_map(category_map)
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
        raise SuiteError(f"{name}: the suite is empty; each line needs a JSON object with 'prompt' and 'category' "
                         "(or 'turns' and 'category')")
    prompts, seen = [], set()
    for where, item in records:
        category = item.get("category") if isinstance(item, dict) else None
        number = 1 + sum(1 for p in prompts if p.category == (category.strip() if isinstance(category, str) else None))
        prompt = _question_item(where, item) if isinstance(item, dict) and "turns" in item else \
            _suite_item(where, item, number)
        if prompt.id in seen:
            raise SuiteError(f"{where}: duplicate id {prompt.id!r}")
        seen.add(prompt.id)
        prompts.append(prompt)
    return rename_categories(prompts, renames)


def rename_categories(prompts: Sequence[SuitePrompt], category_map: str | dict | None) -> list[SuitePrompt]:
    """The prompts with their categories renamed by a category map (see `parse_category_map`)."""
    renames = parse_category_map(category_map)
    return [dataclasses.replace(p, category=renames[p.category]) if p.category in renames else p for p in prompts]


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
    references = (_references(where, item["reference"]),) if item.get("reference") is not None else ()
    return SuitePrompt(prompt_id, category.strip(), prompt, messages, references)


def _references(where: str, value: Any) -> tuple[str, ...]:
    """One turn's references: a string or a list of strings."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise SuiteError(f"{where}: 'reference' must be a string or a list of strings")
    return tuple(values)


def _question_item(where: str, item: dict) -> SuitePrompt:
    """A line of a Spec-Bench / MT-bench question.jsonl."""
    turns, category = item["turns"], item.get("category")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
        raise SuiteError(f"{where}: 'turns' must be a list of non-empty strings (the user's turns)")
    if not isinstance(category, str) or not category.strip():
        raise SuiteError(f"{where}: 'category' must be a non-empty string")
    question_id = item.get("question_id", item.get("id"))
    if question_id is None:
        raise SuiteError(f"{where}: a question needs a 'question_id'")
    reference = item.get("reference")
    references: tuple[tuple[str, ...], ...] = ()
    if reference is not None:
        if len(turns) == 1 and not (isinstance(reference, list) and len(reference) == 1 and isinstance(reference[0], list)):
            references = (_references(where, reference),)
        elif isinstance(reference, list) and len(reference) == len(turns):
            references = tuple(() if r is None else _references(where, r) for r in reference)
        else:
            raise SuiteError(f"{where}: 'reference' of a question of {len(turns)} turns must be a list with one "
                             "entry per turn (a string, a list of strings or null)")
    first = turns[0]
    if len(turns) == 1:  # one request, as any prompt
        return SuitePrompt(str(question_id), category.strip(), first, references=references)
    return SuitePrompt(str(question_id), category.strip(), first, (("user", first),), references, tuple(turns))


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


def as_prompts(prompts: Sequence[SuitePrompt] | Sequence[str] | Iterable[dict] | str | Path | None) -> list[SuitePrompt]:
    """What a run was given as prompts, as suite prompts: the default suite for None, a suite file's
    for a path, bare strings as prompts of category "prompt", anything else read as a suite's records."""
    if prompts is None:
        prompts = DEFAULT_SUITE
    if isinstance(prompts, (str, Path)):
        return load_suite(prompts)
    prompts = list(prompts)
    if not prompts or not all(isinstance(p, (str, SuitePrompt)) for p in prompts):
        return load_suite(prompts)  # an empty list is refused as an empty suite is
    return [p if isinstance(p, SuitePrompt) else SuitePrompt(f"prompt-{i + 1}", "prompt", p)
            for i, p in enumerate(prompts)]


def encode_prompt(pair, item: SuitePrompt, chat: bool) -> list[int]:
    """Token ids every method is fed: through the chat template when chat is on (never for an
    encoder-decoder pair, whose encoder reads the request, or the transcript, as text)."""
    chat = chat and not getattr(pair, "is_encoder_decoder", False)
    if item.messages is None:
        return pair.encode(item.prompt, chat=chat)
    if chat:
        return encode_messages(pair.tokenizer, item.messages)
    transcript = "\n".join(f"{r.capitalize()}: {c}" for r, c in item.messages) + "\nAssistant:"
    return pair.encode(transcript, chat=False)
