"""Pictures of draft trees: one round's tree (a slider picks the round) and per-round tree counts.

Pure functions from traces to Plotly figures, like `viz`, and in its colours: the kept path in
the accepted colour, the children tried and refused in the rejected colour, nodes the walk never
reached in grey, and the target's own token (bonus or correction) as a star after the path.
"""

from __future__ import annotations

from typing import Callable, Sequence

import plotly.graph_objects as go

from ..engine.trace import ACCEPTED, REJECTED, GenerationResult, Round, TreeRecord
from .viz import ORIGIN_STYLES, plain_figure, hover_with_label, method_color, method_label, stop_text

UNVISITED = "#cbd5e1"  # a node the walk never reached: its branch was cut above it
ROOT_COLOR = "#334155"
MAX_ROUNDS_DRAWN = 120  # the slider's reach: later rounds are left out of the figure (the CSV has them all)


def node_states(tree: TreeRecord) -> list[str]:
    """Per node (1..n): ACCEPTED (on the kept path), REJECTED (tried at a node the walk reached,
    and refused), or "" (never reached)."""
    on_path = set(tree.path)
    reached = {0} | on_path
    return [ACCEPTED if node in on_path else REJECTED if parent in reached else ""
            for node, parent in enumerate(tree.parents, start=1)]


def tree_layout(tree: TreeRecord) -> tuple[list[float], list[float]]:
    """x (depth) and y of the root and every node: leaves one unit apart in depth-first order,
    each inner node level with the middle of its children."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(tree.parents, start=1):
        children.setdefault(parent, []).append(node)
    ys: dict[int, float] = {}
    next_leaf = 0.0

    def place(node: int) -> float:
        nonlocal next_leaf
        kids = children.get(node, [])
        if not kids:
            ys[node] = next_leaf
            next_leaf += 1.0
        else:
            placed = [place(k) for k in kids]
            ys[node] = (placed[0] + placed[-1]) / 2
        return ys[node]

    place(0)
    xs = [0.0] + [float(d) for d in tree.depths]
    return xs, [-ys[n] for n in range(len(tree.tokens) + 1)]


def _round_traces(r: Round, decode: Callable[[int], str]) -> list[dict]:
    tree = r.tree
    xs, ys = tree_layout(tree)
    states = node_states(tree)
    edge_x: dict[str, list] = {ACCEPTED: [], REJECTED: [], "": []}
    edge_y: dict[str, list] = {ACCEPTED: [], REJECTED: [], "": []}
    for node, parent in enumerate(tree.parents, start=1):
        state = states[node - 1]
        edge_x[state] += [xs[parent], xs[node], None]
        edge_y[state] += [ys[parent], ys[node], None]
    traces = [
        dict(type="scatter", x=edge_x[state], y=edge_y[state], mode="lines", hoverinfo="skip", showlegend=False,
             line=dict(color=color, width=width))
        for state, color, width in (("", UNVISITED, 1), (REJECTED, ORIGIN_STYLES[REJECTED].foreground, 1.5),
                                    (ACCEPTED, ORIGIN_STYLES[ACCEPTED].foreground, 4))
    ]
    colors = [ROOT_COLOR] + [ORIGIN_STYLES[s].foreground if s else UNVISITED for s in states]
    labels = ["context"] + [decode(t) for t in tree.tokens]
    what = ["the last context token"] + [
        f"depth {d}, {'kept' if s == ACCEPTED else 'refused' if s == REJECTED else 'not reached'}"
        f"<br>q {'point mass' if q is None else f'{q:.3f}'} · p {p:.3f}"
        for d, s, q, p in zip(tree.depths, states, tree.q, tree.p)
    ]
    for node, note in tree.stops.items():  # where a stop rule cut the tree, and why
        what[node] += f"<br>no children: {stop_text(note)}"
    traces.append(dict(
        type="scatter", x=xs, y=ys, mode="markers+text", text=labels, textposition="top center", showlegend=False,
        marker=dict(size=14, color=colors, line=dict(color="white", width=1)), customdata=what,
        hovertemplate="%{text}<br>%{customdata}<extra></extra>",
    ))
    if r.next_token is not None:
        last = tree.path[-1] if tree.path else 0
        origin = r.next_origin
        traces.append(dict(
            type="scatter", x=[xs[last] + 1], y=[ys[last]], mode="markers+text", text=[decode(r.next_token)],
            textposition="top center", showlegend=False,
            marker=dict(size=18, symbol="star", color=ORIGIN_STYLES[origin].foreground),
            hovertemplate=f"%{{text}}<br>{ORIGIN_STYLES[origin].label}: the target's own token<extra></extra>",
        ))
    return traces


def tree_figure(result: GenerationResult | None, decode: Callable[[int], str] = str) -> go.Figure:
    """The tree of each tree round of `result`, one shown at a time, picked with a slider."""
    rounds = [r for r in (result.rounds if result is not None else []) if r.tree is not None and r.tree.nodes]
    rounds = rounds[:MAX_ROUNDS_DRAWN]
    figure = go.Figure()
    figure.update_layout(template="plotly_white", height=380, margin=dict(l=20, r=20, t=60, b=40),
                         xaxis=dict(title="depth", dtick=1, zeroline=False), yaxis=dict(visible=False))
    if not rounds:
        figure.update_layout(title=dict(text="Draft tree: run a tree method (sd-tree, egag-tree) to see one",
                                        font=dict(size=14)))
        return figure
    owners = []
    for i, r in enumerate(rounds):
        for trace in _round_traces(r, decode):
            trace["visible"] = i == 0
            figure.add_trace(trace)
            owners.append(i)
    label = method_label(result.method)

    def title(r: Round) -> str:
        return (f"{label}: round {r.index}'s tree, {r.tree.nodes} nodes, depth {r.tree.depth}; kept {r.accepted}, "
                f"then a {ORIGIN_STYLES[r.next_origin].label if r.next_token is not None else 'stop'}")

    steps = [dict(method="update", label=str(r.index),
                  args=[{"visible": [owner == i for owner in owners]}, {"title.text": title(r)}])
             for i, r in enumerate(rounds)]
    figure.update_layout(title=dict(text=title(rounds[0]), font=dict(size=14)),
                         sliders=[dict(active=0, steps=steps, currentvalue=dict(prefix="round "), pad=dict(t=30))])
    return figure


def tree_rounds_figure(results: Sequence[GenerationResult]) -> go.Figure:
    """Per round of each tree method: nodes drafted (bars), depth reached and tokens kept (lines)."""
    traces = []
    for result in results:
        rounds = [r for r in result.rounds if r.tree is not None]
        if not rounds:
            continue
        label, color = method_label(result.method), method_color(result.method)
        x = [r.index for r in rounds]
        traces += [
            dict(type="bar", x=x, y=[r.tree.nodes for r in rounds], name=f"{label} nodes drafted",
                 legendgroup=result.method, marker=dict(color=color, opacity=0.3),
                 hovertemplate=hover_with_label(label, "round %{x}<br>%{y} nodes drafted")),
            dict(type="scatter", x=x, y=[r.tree.depth for r in rounds], name=f"{label} depth reached",
                 legendgroup=result.method, mode="lines", line=dict(color=color, dash="dot", width=1.5),
                 hovertemplate=hover_with_label(label, "round %{x}<br>depth %{y}")),
            dict(type="scatter", x=x, y=[r.accepted for r in rounds], name=f"{label} accepted",
                 legendgroup=result.method, mode="lines+markers", line=dict(color=color, width=2),
                 marker=dict(size=4), hovertemplate=hover_with_label(label, "round %{x}<br>%{y} drafts kept")),
        ]
    return plain_figure(traces, "Trees per round: nodes drafted, depth reached, drafts kept", "round", "count",
                   barmode="overlay")

