"""Plotly figures of why drafts were kept (see `acceptance` for the numbers they draw):
acceptance against the drafter's entropy, acceptance by draft position, and predicted speedup
against acceptance at a method's measured costs (its break-even). The page, the benchmark
report and the sweep report draw the same figures.

Pure functions of frames; `label(method)` and `color(method)` name and colour a method
(the page passes its own, reports keep the defaults).

May import pandas and plotly; never gradio.
"""

from __future__ import annotations

from typing import Callable, Mapping

import pandas as pd

try:
    import plotly.graph_objects as go
except ImportError:  # a bare GPU image has no plotly: the benchmark still runs, only its figures need it
    go = None

from .acceptance import BreakEven, describe_auc, entropy_auc, entropy_bins, position_acceptance
from ...engine.trace import ALPHA_LABEL

Namer = Callable[[str], str]
PALETTE = ("#7c3aed", "#0e7490", "#db2777", "#4338ca", "#a16207", "#0f766e", "#be123c", "#1d4ed8")
_AXIS = dict(gridcolor="#e8edf3", linecolor="#cbd5e1", zeroline=False, automargin=True)
# Styled by hand, not by a template: an unvalidated figure keeps a template name as a bare string.
_LAYOUT = dict(paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="#ffffff", height=340, margin=dict(l=55, r=15, t=60, b=45),
               legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0, font=dict(size=11)),
               hovermode="closest")


def _default_colors(methods) -> Callable[[str], str]:
    order = {m: i for i, m in enumerate(dict.fromkeys(methods))}
    return lambda method: PALETTE[order.get(method, 0) % len(PALETTE)]


def _figure(traces: list[dict], title: str, x_title: str, y_title: str, **axes) -> go.Figure:
    layout = {**_LAYOUT, "title": dict(text=title, x=0.01, xanchor="left", font=dict(size=14)),
              "xaxis": {**_AXIS, "title": dict(text=x_title), **axes.get("xaxis", {})},
              "yaxis": {**_AXIS, "title": dict(text=y_title), **axes.get("yaxis", {})}}
    # Unvalidated: the page redraws these while a method runs.
    return go.Figure(data=traces, layout=layout, _validate=False)


def _fade(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def entropy_acceptance_figure(bins: pd.DataFrame, aucs: Mapping[str, tuple[float, int]] | None = None,
                              label: Namer = str, color: Namer | None = None) -> go.Figure:
    """Acceptance rate per bin of normalised drafter entropy (`acceptance.entropy_bins`), a 95 %
    Wilson band around it and each bin's count on hover; the AUC per method in the legend."""
    color = color or _default_colors(bins.method)
    traces = []
    for method, part in bins.groupby("method", sort=False):
        c, name = color(method), label(method)
        if aucs and method in aucs:
            auc, n = aucs[method]
            name += f" (AUC {auc:.2f}, n = {n:,})" if auc == auc else f" (n = {n:,})"
        x = part.entropy_mid.tolist()
        traces.append(dict(type="scatter", x=x + x[::-1], y=part.rate_high.tolist() + part.rate_low.tolist()[::-1],
                           mode="lines", fill="toself", fillcolor=_fade(c, 0.15), line=dict(width=0),
                           hoverinfo="skip",
                           showlegend=False, legendgroup=method, name=f"{name} 95 % band"))
        traces.append(dict(
            type="scatter", x=x, y=part.rate.tolist(), name=name, legendgroup=method, mode="lines+markers",
            line=dict(color=c, width=2), marker=dict(size=[6 + min(10, n ** 0.5) for n in part["count"]]),
            customdata=part[["count", "entropy_low", "entropy_high", "rate_low", "rate_high"]].to_numpy().tolist(),
            hovertemplate=("entropy %{customdata[1]:.1f}–%{customdata[2]:.1f}: %{y:.0%} kept of %{customdata[0]} "
                           "drafts<br>95 % band %{customdata[3]:.0%}–%{customdata[4]:.0%}<extra>"
                           + label(method) + "</extra>"),
        ))
    title = "Acceptance against drafter entropy"
    if aucs and len(aucs) == 1:
        title += ": " + describe_auc(*next(iter(aucs.values())))
    return _figure(traces, title, "normalised drafter entropy (bins of 0.1)", "drafts kept",
                   xaxis=dict(range=[0, 1]), yaxis=dict(range=[0, 1.02], tickformat=".0%"))


def position_acceptance_figure(positions: pd.DataFrame, label: Namer = str, color: Namer | None = None) -> go.Figure:
    """Share of rounds that kept their i-th draft, among those that drafted that far
    (`acceptance.position_acceptance`), one line per method."""
    color = color or _default_colors(positions.method)
    traces = []
    for method, part in positions.groupby("method", sort=False):
        traces.append(dict(
            type="scatter", x=part.position.tolist(), y=part.rate.tolist(), name=label(method), mode="lines+markers",
            line=dict(color=color(method), width=2), customdata=part[["accepted", "drafted"]].to_numpy().tolist(),
            hovertemplate="draft %{x}: %{y:.0%} kept (%{customdata[0]} of %{customdata[1]} rounds)<extra>"
                          + label(method) + "</extra>",
        ))
    return _figure(traces, "Acceptance by draft position", "draft position in the round", "rounds that kept it",
                   xaxis=dict(dtick=1, rangemode="tozero"), yaxis=dict(range=[0, 1.02], tickformat=".0%"))


def break_even_figure(evens: Mapping[str, tuple[BreakEven, float]], label: Namer = str,
                      color: Namer | None = None) -> go.Figure:
    """Predicted speedup over AR against α (Leviathan's, per token: `BreakEven.alpha`, from
    `engine.trace.leviathan_alpha`) at each method's measured c, v and γ̄ (a curve), the line where it
    matches AR, and the run's point: (measured α, measured speedup). Not the acceptance (accepted ÷ drafted)
    the tables show beside it."""
    color = color or _default_colors(evens)
    alphas = [i / 50 for i in range(51)]
    traces = []
    for method, (even, measured) in evens.items():
        c = color(method)
        traces.append(dict(
            type="scatter", x=alphas, y=[even.predicted_speedup(a) for a in alphas], mode="lines",
            name=f"{label(method)} predicted", legendgroup=method, line=dict(color=c, width=2),
            hovertemplate=(f"γ̄ {even.gamma:.1f}, c {even.draft_cost:.2f}, v {even.verify_cost:.2f}"
                           "<br>α (Leviathan) %{x:.2f} → %{y:.2f}× AR<extra>" + label(method) + "</extra>"),
        ))
        if even.alpha == even.alpha and measured == measured:
            traces.append(dict(
                type="scatter", x=[even.alpha], y=[measured], mode="markers", name=f"{label(method)} this run",
                legendgroup=method, marker=dict(color=c, size=11, symbol="diamond", line=dict(color="#111", width=1)),
                customdata=[[even.obtained, even.needed]],
                hovertemplate=("α (Leviathan) %{x:.2f}, measured %{y:.2f}× AR<br>%{customdata[0]:.2f} tokens per round, "
                               "%{customdata[1]:.2f} needed<extra>" + label(method) + "</extra>"),
            ))
    if traces:
        traces.append(dict(type="scatter", x=[0, 1], y=[1, 1], mode="lines", name="AR", hoverinfo="skip",
                           line=dict(color="#64748b", dash="dot", width=1)))
    return _figure(traces, "Break-even: predicted speedup against α (Leviathan, per token)", ALPHA_LABEL,
                   "speedup over AR", xaxis=dict(range=[0, 1]), yaxis=dict(rangemode="tozero"))


def why_figures(tokens: pd.DataFrame, evens: Mapping[str, tuple[BreakEven, float]], label: Namer = str,
                color: Namer | None = None, key: str = "method") -> dict[str, go.Figure]:
    """The three figures from a per-token frame and measured break-evens, by name:
    entropy_acceptance, position_acceptance, break_even. `key` names the column a line is
    drawn per (a sweep draws one per setting)."""
    tokens = tokens.assign(method=tokens[key]) if key != "method" and not tokens.empty else tokens
    aucs = {m: entropy_auc(part) for m, part in tokens.groupby("method", sort=False)} if len(tokens) else {}
    aucs = {m: v for m, v in aucs.items() if v[1]}
    return {
        "entropy_acceptance": entropy_acceptance_figure(entropy_bins(tokens), aucs, label=label, color=color),
        "position_acceptance": position_acceptance_figure(position_acceptance(tokens), label=label, color=color),
        "break_even": break_even_figure(evens, label=label, color=color),
    }
