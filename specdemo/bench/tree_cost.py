"""What a tree's verification costs: one target forward over n rows, against one row.

    cost(n) = median seconds of a verification forward over n rows ÷ median seconds of a one-row forward

for two kinds of n-row forward, each as the decode loop makes it:
  chain  `CachedLM.logits` over the last context token and n − 1 drafts (causal mask);
  tree   `CachedLM.tree_logits` over the last context token and n − 1 tree nodes (ancestor mask,
         positions by depth), then `keep_tree_path` of one node, as a round ends.
All calls take turns (`interleaved_medians`), so a machine that others share slows them alike.
The node budget of a tree method is n − 1: the largest n whose cost stays under a bound (say
1.3 one-token forwards) is the budget at which a tree is nearly free to verify.

May import ``engine`` and pandas.
"""

from __future__ import annotations

import pandas as pd
import torch

from ..engine.clock import interleaved_medians
from ..engine.drafters.feature_head import FeatureHead
from ..engine.targets.lm import CachedLM
from ..engine.tree import ROOT, DraftTree

COST_COLUMNS = ["rows", "chain_seconds", "tree_seconds", "chain_cost", "tree_cost"]
_FILLER_TOKEN = 5


def bushy_tree(nodes: int, width: int = 3) -> DraftTree:
    """A tree of `nodes` drafts, each node taking up to `width` children, breadth first."""
    tree = DraftTree()
    parent = ROOT
    while len(tree) < nodes:
        for _ in range(width):
            if len(tree) < nodes:
                tree.add(parent, _FILLER_TOKEN, 0.5)
        parent += 1
    return tree


def verification_costs(pair, context: list[int], max_rows: int = 16, calls: int = 9, warmup: int = 2,
                       hidden: bool | None = None) -> pd.DataFrame:
    """One row per n = 1..max_rows: median seconds and cost ratio of the chain and tree forwards.
    `calls` timed turns each (after `warmup`); `context` holds at least two tokens."""
    device = pair.device
    if hidden is None:  # as the loop verifies: with the final hidden states when a feature head reads them
        hidden = isinstance(pair.draft, FeatureHead)
    target = CachedLM(pair.target, pair.vocab_size, cache="dynamic")
    calls_by_name = {}
    with torch.inference_mode():
        target.prefill(context[:-1])
        base = len(context) - 1

        for rows in range(1, max_rows + 1):
            drafts = torch.full((rows - 1,), _FILLER_TOKEN, dtype=torch.long, device=device)
            tree = bushy_tree(rows - 1)
            tokens = torch.tensor(tree.draft_tokens(), device=device)
            mask, depths = tree.ancestor_mask(), torch.tensor(tree.depths[1:])

            def chain(drafts=drafts, rows=rows):
                target.logits(context, rows, rows if hidden else 0, then=drafts)
                target.rollback(base)

            def tree_forward(tokens=tokens, mask=mask, depths=depths, rows=rows):
                if rows == 1:
                    target.logits(context, 1, 1 if hidden else 0)
                else:
                    target.tree_logits(context, tokens, mask, depths, n_hidden=hidden)
                    target.keep_tree_path([rows - 2])
                target.rollback(base)

            calls_by_name[("chain", rows)] = chain
            calls_by_name[("tree", rows)] = tree_forward
        medians = interleaved_medians(calls_by_name, calls, warmup=warmup, device=device)
    one = medians[("chain", 1)]
    table = pd.DataFrame([
        {"rows": n, "chain_seconds": medians[("chain", n)], "tree_seconds": medians[("tree", n)],
         "chain_cost": medians[("chain", n)] / one, "tree_cost": medians[("tree", n)] / one}
        for n in range(1, max_rows + 1)
    ], columns=COST_COLUMNS)
    return table


def largest_budget(table: pd.DataFrame, bound: float = 1.3) -> int:
    """The most tree nodes (rows − 1) whose verification costs at most `bound` one-row forwards."""
    cheap = table[table.tree_cost <= bound]
    return int(cheap.rows.max()) - 1 if len(cheap) else 0
