"""The long suite: prompts of 1–2 k tokens for long-text runs (≥ 1024 new tokens) and the
KV-cache policies that bound their memory.

Each prompt is made from the shipped suite's own texts (its summarisation, RAG and code
requests, which carry passages), laid end to end from a different starting text each time
until the target's tokenizer counts the wanted length, then one request about them. So the
suite needs nothing beyond the package, and every pair cuts it to the same token counts.

May import ``specdemo.models`` (chat encoding); nothing above it.
"""

from __future__ import annotations

from .suite import DEFAULT_SUITE, SuitePrompt, load_suite

LONG_LENGTHS = (1024, 1536, 2048)  # prompt tokens
SOURCE_CATEGORIES = ("summarisation", "rag", "code")
REQUESTS = (
    "Summarise the documents above, one paragraph for each.",
    "Write a detailed report on everything the documents above describe.",
    "Continue the last document above in the same style.",
)


def long_suite(tokenizer, lengths: tuple[int, ...] = LONG_LENGTHS, per_length: int = 1) -> list[SuitePrompt]:
    """`per_length` prompts of each length in `lengths` (tokens of `tokenizer`, request included),
    as suite prompts of category "long-<length>"."""
    texts = [p.prompt for p in load_suite(DEFAULT_SUITE) if p.category in SOURCE_CATEGORIES]
    prompts = []
    for length in lengths:
        for i in range(per_length):
            request = REQUESTS[i % len(REQUESTS)]
            request_tokens = len(tokenizer(request, add_special_tokens=False)["input_ids"])
            body = _documents(tokenizer, texts, start=i * 5 + length // 256, tokens=length - request_tokens - 8)
            prompts.append(SuitePrompt(f"long-{length}-{i}", f"long-{length}", f"{body}\n\n{request}"))
    return prompts


def _documents(tokenizer, texts: list[str], start: int, tokens: int) -> str:
    """Texts end to end from `start` (cycling), cut to `tokens` tokens."""
    ids: list[int] = []
    k = start
    while len(ids) < tokens:
        ids += tokenizer(f"Document {k - start + 1}:\n{texts[k % len(texts)]}\n\n", add_special_tokens=False)["input_ids"]
        k += 1
    return tokenizer.decode(ids[:tokens])

