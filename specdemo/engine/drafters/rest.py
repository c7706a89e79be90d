"""Retrieval drafting (REST): drafts are what followed the longest match of the context's end
in a datastore of token ids.

The datastore is a token array and its suffix array, sorted on each suffix's first `window`
tokens, so every occurrence of a query of up to `window` tokens is one contiguous range found
by binary search. A round looks for the longest suffix of the context (from `MAX_MATCH` down
to `MIN_MATCH` tokens) that occurs in the datastore or earlier in the context itself, takes up
to `MAX_OCCURRENCES` of its occurrences, and drafts the continuation most of them share, token
by token (the chain that a trie of their continuations would rank first). Drafts have no q:
verification treats them as a point mass, like NASD's.

`build_datastore` turns lists of token ids (one per document) into the arrays; the command
that reads a text or JSONL corpus is `python -m specdemo.bench.rest build`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .base import Drafter, Proposal
from ..sampling import SamplingConfig
from ..tree import DraftTree

MIN_MATCH, MAX_MATCH = 2, 16
MAX_OCCURRENCES = 64
SEPARATOR = -1  # between documents: no match runs across one


@dataclass(frozen=True)
class Datastore:
    tokens: np.ndarray  # [n] int32, documents separated by SEPARATOR
    suffixes: np.ndarray  # [n] int64, positions sorted by their first `window` tokens
    window: int
    vocab_size: int  # one more than the largest id stored (0 when empty)
    tokenizer: str = ""

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def _key(self, position: int, length: int) -> list[int]:
        return self.tokens[position : position + length].tolist()

    def occurrences(self, query: Sequence[int], most: int = MAX_OCCURRENCES) -> np.ndarray:
        """Positions right after up to `most` occurrences of `query` (len ≤ window), in suffix order."""
        length, query = len(query), list(query)
        low, high = 0, len(self)
        while low < high:  # the first suffix whose key is ≥ query
            mid = (low + high) // 2
            if self._key(int(self.suffixes[mid]), length) < query:
                low = mid + 1
            else:
                high = mid
        found = []
        for index in range(low, min(len(self), low + most)):
            position = int(self.suffixes[index])
            if self._key(position, length) != query:
                break
            found.append(position + length)
        return np.asarray(found, dtype=np.int64)


def build_datastore(documents: Sequence[Sequence[int]], window: int = MAX_MATCH, tokenizer: str = "") -> Datastore:
    """The datastore of these token-id documents (separated so no match crosses two)."""
    parts = []
    for ids in documents:
        if len(ids):
            parts += [np.asarray(ids, dtype=np.int32), np.asarray([SEPARATOR], dtype=np.int32)]
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)
    padded = np.concatenate([tokens, np.full(window, SEPARATOR - 1, dtype=np.int32)])
    # lexsort sorts by its last key first: the suffix's first token is the primary key.
    keys = [padded[offset : offset + len(tokens)] for offset in reversed(range(window))]
    suffixes = np.lexsort(keys) if len(tokens) else np.zeros(0, dtype=np.int64)
    vocab = int(tokens.max()) + 1 if len(tokens) else 0
    return Datastore(tokens, suffixes.astype(np.int64), window, vocab, tokenizer)


def save_datastore(store: Datastore, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:  # a file handle: savez would add .npz to a bare name
        np.savez(handle, tokens=store.tokens, suffixes=store.suffixes, window=store.window,
                 vocab_size=store.vocab_size, tokenizer=np.asarray(store.tokenizer))
    return path


@lru_cache(maxsize=4)
def _load(path: str, mtime: float) -> Datastore:
    with np.load(path) as data:
        return Datastore(data["tokens"], data["suffixes"], int(data["window"]), int(data["vocab_size"]),
                         str(data["tokenizer"]))


def load_datastore(path: str | Path) -> Datastore:
    """A saved datastore (kept in memory while its file is unchanged)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"rest_datastore: no datastore at {str(path)!r}; build one with "
                         "`python -m specdemo.bench.rest build CORPUS OUT`")
    return _load(str(path.resolve()), path.stat().st_mtime)


def next_counts(tokens: np.ndarray, starts: np.ndarray) -> Counter:
    """How often each token comes next after the occurrences at `starts`, in the order first seen
    (a separator ends a document's occurrence: it counts as no token)."""
    following = tokens[starts[starts < len(tokens)]]
    return Counter(following[following >= 0].tolist())


def follow(tokens: np.ndarray, starts: np.ndarray, token: int) -> np.ndarray:
    """The occurrences whose next token is `token`, each moved on past it."""
    starts = starts[starts < len(tokens)]
    return starts[tokens[starts] == token] + 1


def shared_continuation(tokens: np.ndarray, starts: np.ndarray, most: int) -> list[int]:
    """Follow the occurrences token by token, keeping those that agree with the most common next token."""
    drafted: list[int] = []
    while len(drafted) < most:
        counts = next_counts(tokens, starts)
        if not counts:
            break
        token = counts.most_common(1)[0][0]
        drafted.append(int(token))
        starts = follow(tokens, starts, token)
    return drafted


def context_occurrences(context: Sequence[int], length: int) -> np.ndarray:
    """Positions right after earlier occurrences of the context's last `length` tokens, latest first."""
    ids = np.asarray(context, dtype=np.int64)
    if len(ids) <= length:
        return np.zeros(0, dtype=np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(ids[:-1], length)
    hits = np.flatnonzero((windows == ids[-length:]).all(axis=1)) + length
    return hits[::-1][:MAX_OCCURRENCES]


class RestDrafter(Drafter):
    """Drafts the continuation of the longest suffix match, in the datastore or the context so far."""

    def __init__(self, store: Datastore | None, vocab_size: int, device: torch.device | str = "cpu"):
        if store is not None and store.vocab_size > vocab_size:
            raise ValueError(f"rest_datastore holds ids up to {store.vocab_size - 1}, beyond this pair's vocabulary "
                             f"({vocab_size}); build it with this pair's tokenizer")
        self.store = store
        self.device = torch.device(device)
        self.matched = 0  # the length of the last round's match (0: none)

    def match(self, context: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The longest suffix match of the context (in the context itself first, then the
        datastore): the token array it was found in and the positions right after its
        occurrences (none: no match of MIN_MATCH tokens or more)."""
        longest = min(MAX_MATCH, len(context), self.store.window if self.store is not None else MAX_MATCH)
        for length in range(longest, MIN_MATCH - 1, -1):
            seen = context_occurrences(context, length)
            if len(seen):
                self.matched = length
                return np.asarray(context, dtype=np.int64), seen
            if self.store is not None and len(self.store):
                found = self.store.occurrences(context[-length:])
                if len(found):
                    self.matched = length
                    return self.store.tokens, found
        self.matched = 0
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)

    def draft(self, context: Sequence[int], most: int) -> list[int]:
        tokens, starts = self.match(context)
        return shared_continuation(tokens, starts, most)

    def describe(self, model_name: str | None) -> str:
        return f"retrieval ({len(self.store):,} datastore tokens + the context)" if self.store is not None else \
            "retrieval (the context)"

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        gamma = policy.round_gamma(None)
        tokens = self.draft(context, min(gamma, limit)) if limit > 0 else []
        return Proposal(gamma, torch.tensor(tokens, dtype=torch.long, device=self.device), None, None, None)


class RestStepper:
    """REST's tree: the continuations of the longest match's occurrences, a trie ranked by how
    many occurrences share each branch (point masses, as NASD's table)."""

    point_masses = True

    def __init__(self, drafter: RestDrafter, context: list[int], sampling: SamplingConfig):
        self.tokens, self.starts = drafter.match(context)
        self.root_q = self._counts(self.starts)

    def _counts(self, starts) -> dict[int, int] | None:
        return dict(next_counts(self.tokens, starts)) or None

    def q_at(self, tree: DraftTree, node: int) -> dict[int, int] | None:
        starts = self.starts
        for token in (tree.tokens[n] for n in tree.path_to(node)):
            starts = follow(self.tokens, starts, token)
        return self._counts(starts)

    def finish(self) -> None:
        pass


RestDrafter.tree_stepper = RestStepper
