"""Every chart of the Playground, by name, in the page's order: `viz`'s, then the trees' (`tree_view`)."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from ..engine.trace import GenerationResult
from . import viz
from .tree_view import tree_figure, tree_rounds_figure

CHART_NAMES = (*viz.FIGURES, "tree_rounds", "tree")


def all_charts(results: Sequence[GenerationResult], tokenizer=None, trees: bool = True) -> dict[str, go.Figure]:
    """viz's figures, then, with `trees`, nodes/depth/kept per tree round and the first tree
    method's trees (labelled with the tokenizer's text when given)."""
    figures = viz.all_figures(results)
    if not trees:
        return figures
    figures["tree_rounds"] = tree_rounds_figure(results)
    with_trees = next((r for r in results if any(round_.tree is not None for round_ in r.rounds)), None)
    specials = viz.special_tokens(tokenizer)  # a special token in a tree reads as its marker, as in the panels
    decode = (lambda token: viz.marked_text(tokenizer.decode([token]), specials)) if tokenizer is not None else str
    figures["tree"] = tree_figure(with_trees, decode)
    return figures
