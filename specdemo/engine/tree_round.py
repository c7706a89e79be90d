"""One round of a tree method: draft a tree, verify every node in one target forward, keep a path.

The decode loop calls `tree_round` where a chain method drafts and verifies; what comes back
reads like a chain round (the kept path as the accepted drafts, the first child refused after
it as the rejected one), plus the whole tree for the trace. Afterwards the target's cache holds
the context and the kept path only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .drafters import top_ids
from .lm import CachedLM
from .sampling import SamplingConfig, probabilities
from .trace import TreeRecord
from .tree import DraftTree
from .tree_drafting import TreeProposal
from .tree_verify import verify_tree


@dataclass
class TreeOutcome:
    proposal: TreeProposal
    drafted: list[int]  # the kept path, then the first child refused after it (if any)
    accepted: int
    next_token: int
    entropies: list[float]  # the drafter's normalised entropy at the root and each kept node
    verified_logits: torch.Tensor  # [accepted + 1, V]: the target at the root and after each kept draft
    verified_hidden: torch.Tensor | None  # their final hidden states, for a drafter that reads them
    target_top: list[list[int]] | None  # the target's best ids at those rows, for a drafter that asks
    record: TreeRecord


def tree_round(target: CachedLM, drafter, policy, sequence: list[int], limit: int, sampling: SamplingConfig,
               generator: torch.Generator | None, clock, reads_features: bool, target_top_k: int) -> TreeOutcome:
    proposal = drafter.propose_tree(sequence, policy, limit, sampling, generator)
    clock.lap()
    tree = proposal.tree
    device = target.device
    if len(tree):
        logits = target.tree_logits(sequence, torch.tensor(tree.draft_tokens(), device=device), tree.ancestor_mask(),
                                    torch.tensor(tree.depths[1:]), n_hidden=reads_features)
    else:
        logits = target.logits(sequence, 1, 1 if reads_features else 0)
    probs = torch.softmax(logits.float(), -1) if sampling.greedy else probabilities(logits, sampling)
    verdict = verify_tree(logits if sampling.greedy else probs, tree, sampling, generator)
    if len(tree):
        target.keep_tree_path([node - 1 for node in verdict.path])
    path_tokens = [tree.tokens[node] for node in verdict.path]
    target.note_fed(path_tokens)
    rows = torch.tensor([0] + verdict.path, device=logits.device)
    verified = logits.index_select(0, rows)
    refused = [tree.tokens[verdict.refused[0]]] if verdict.refused else []
    return TreeOutcome(
        proposal=proposal, drafted=path_tokens + refused, accepted=len(path_tokens), next_token=verdict.next_token,
        entropies=[tree.entropies[n] for n in [0] + verdict.path if n in tree.entropies],
        verified_logits=verified,
        verified_hidden=target.hidden.index_select(0, rows.to(target.hidden.device)) if reads_features else None,
        target_top=top_ids(verified, target_top_k).tolist() if target_top_k else None,
        record=_record(tree, probs, verdict.path, sampling),
    )


def _record(tree: DraftTree, probs: torch.Tensor, path: list[int], sampling: SamplingConfig) -> TreeRecord:
    nodes = range(1, len(tree) + 1)
    parents = [tree.parents[i] for i in nodes]
    p = probs[parents, tree.draft_tokens()].tolist() if len(tree) else []
    q = []
    for i, parent in zip(nodes, parents):
        if parent not in tree.child_q:
            q.append(None)  # a chain that needed no q
        elif tree.child_q[parent] is not None:
            q.append(float(tree.child_q[parent][tree.tokens[i]]))
        elif parent in tree.entropies:  # greedy: the key of a drawn child is its q
            q.append(tree.cumulative[i] / tree.cumulative[parent])
        else:
            q.append(None)  # a point mass
    return TreeRecord(tokens=tree.draft_tokens(), parents=parents, depths=tree.depths[1:], q=q, p=p, path=list(path))
