"""One round of a tree method: draft a tree, verify every node in one target forward, keep a path.

The decode loop calls `tree_round` where a chain method calls `chain_round`; its `RoundOutcome`
reads like a chain round's (the kept path as the accepted drafts, the first child refused after
it as the rejected one), plus the whole tree for the trace. Afterwards the writer's cache holds
the context and the kept path only.
"""

from __future__ import annotations

import torch

from .drafters.base import top_ids
from .rounds import Decoding, RoundOutcome, cut_verdict_at_eos
from .sampling import SamplingConfig, probabilities
from .trace import DraftDecision, TreeRecord
from .tree import DraftTree
from .tree_verify import verify_tree


def tree_round(run: Decoding, sequence: list[int], limit: int) -> RoundOutcome:
    """limit: the most drafts the output has room for (the writer's own token comes on top)."""
    drafter, writer, sampling = run.drafter, run.writer, run.sampling
    reads_features = drafter.reads_target_features
    proposal = drafter.propose_tree(sequence, run.policy, limit, sampling, run.generator)
    run.clock.lap()
    tree = proposal.tree
    if len(tree):
        logits = writer.tree_logits(sequence, torch.tensor(tree.draft_tokens(), device=writer.device),
                                    tree.ancestor_mask(), torch.tensor(tree.depths[1:]), n_hidden=reads_features)
    else:
        logits = writer.logits(sequence, 1, 1 if reads_features else 0)
    probs = torch.softmax(logits.float(), -1) if sampling.greedy else probabilities(logits, sampling)
    verdict = verify_tree(logits if sampling.greedy else probs, tree, sampling, run.generator)
    if len(tree):
        writer.keep_tree_path([node - 1 for node in verdict.path])
    path_tokens = [tree.tokens[node] for node in verdict.path]
    writer.note_fed(path_tokens)
    rows = torch.tensor([0] + verdict.path, device=logits.device)
    verified = logits.index_select(0, rows)
    refused = [tree.tokens[verdict.refused[0]]] if verdict.refused else []
    record = _record(tree, probs, verdict.path, sampling)
    drafts, accepted, next_token = cut_verdict_at_eos(path_tokens + refused, len(path_tokens), verdict.next_token,
                                                      run.eos_ids)
    next_p = None if next_token is None else float(probabilities(verified[accepted], sampling)[next_token])
    entropies = [tree.entropies[n] for n in [0] + verdict.path if n in tree.entropies]
    return RoundOutcome(
        gamma=proposal.gamma, round_entropy=proposal.round_entropy, source=proposal.source if drafts else "",
        drafts=drafts, accepted=accepted, next_token=next_token, entropies=entropies[: len(drafts)],
        decisions=tree_decisions(record, drafts, accepted, next_token, next_p, sampling.greedy), next_p=next_p,
        verified_logits=verified,
        verified_hidden=writer.hidden.index_select(0, rows.to(writer.hidden.device)) if reads_features else None,
        target_top=top_ids(verified, drafter.target_top_k).tolist() if drafter.target_top_k else None, tree=record,
        early_stop=record.stop_at_path_end(),
    )


def tree_decisions(tree: TreeRecord, drafts: list[int], accepted: int, next_token: int | None,
                   next_p: float | None, greedy: bool) -> list[DraftDecision]:
    """A tree round's drafts read as a chain's: the kept path, then the first child refused after it.
    Their p and q are the tree's own; under sampling the acceptance probability shown is min(1, p/q),
    exact for the first child tried at a node (a later sibling is judged against the residual, which
    the tree view shows)."""
    decisions, parent = [], 0
    for i, token in enumerate(drafts):
        node = next(n for n in range(1, tree.nodes + 1)
                    if tree.parents[n - 1] == parent and tree.tokens[n - 1] == token)
        q, p = tree.q[node - 1], tree.p[node - 1]
        kept = i < accepted
        accept_prob = float(kept) if greedy else min(1.0, p / q) if q else min(1.0, p)
        rejected_here = i == accepted and next_token is not None
        decisions.append(DraftDecision(
            token=token, q=1.0 if q is None else q, p=p, accept_prob=accept_prob, accepted=kept, decided=i <= accepted,
            point_mass=q is None, correction=next_token if rejected_here else None,
            correction_p=next_p if rejected_here else None,
        ))
        parent = node
    return decisions


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
    return TreeRecord(tokens=tree.draft_tokens(), parents=parents, depths=tree.depths[1:], q=q, p=p, path=list(path),
                      stops=dict(tree.stops))
