"""A tree of drafts: several candidates per position, verified by one target forward.

Node 0 is the root: the last token of the context, already decided. Nodes 1..n are drafts,
each with a parent of lower index (so a prefix of the nodes is always a tree, and row i of
the verification forward is node i). A node's children are kept in the order they were
drawn: sampling verification tries them in that order (see `tree_verify`).

For each expanded node the tree keeps q over its children (`child_q[node]`, a [V]
distribution, or None when every child is its own point mass, as n-gram drafts are), and
for each draft its cumulative draft probability (the product of the keys along its path,
see `TreeBuilder`), which is what the dynamic policy ranks nodes by.

`ancestor_mask` and `positions` give what the target forward needs: each node attends to the
context and to its ancestors, and sits at the position its depth says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .trace import StopNote

ROOT = 0


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=lambda: [-1])  # node 0, the root, has no draft token
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    cumulative: list[float] = field(default_factory=lambda: [1.0])
    child_q: dict[int, torch.Tensor | None] = field(default_factory=dict)  # node -> q over its children
    entropies: dict[int, float] = field(default_factory=dict)  # node -> normalised entropy of its q
    children: dict[int, list[int]] = field(default_factory=dict)  # node -> its children, in drawn order
    stops: dict[int, StopNote] = field(default_factory=dict)  # node -> why a stop rule gave it no children

    @classmethod
    def chain(cls, tokens: list[int], draft_probs: torch.Tensor | None = None) -> "DraftTree":
        """The chain as a tree: node i + 1 is the only child of node i (q at node i is draft_probs[i])."""
        tree = cls()
        for i, token in enumerate(tokens):
            tree.add(i, token, 1.0)
            tree.child_q[i] = None if draft_probs is None else draft_probs[i]
        return tree

    def __len__(self) -> int:
        """Drafted nodes (the root excluded)."""
        return len(self.tokens) - 1

    def add(self, parent: int, token: int, key: float) -> int:
        """Append a draft under `parent` (after its earlier children); returns its index."""
        index = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.cumulative.append(self.cumulative[parent] * key)
        self.children.setdefault(parent, []).append(index)
        return index

    @property
    def depth(self) -> int:
        return max(self.depths)

    def path_to(self, node: int) -> list[int]:
        """The drafts from the root's first child down to `node` (empty for the root)."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def draft_tokens(self) -> list[int]:
        return self.tokens[1:]

    def ancestor_mask(self) -> torch.Tensor:
        """[n, n] bool over the drafts: row i may see column j iff j is i or one of its ancestors."""
        n = len(self)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(1, n + 1):
            parent = self.parents[i]
            if parent != ROOT:
                mask[i - 1] = mask[parent - 1]
            mask[i - 1, i - 1] = True
        return mask

    def positions(self, root_position: int) -> torch.Tensor:
        """[n] position ids of the drafts: the root's position plus the depth."""
        return torch.tensor(self.depths[1:], dtype=torch.long) + root_position
