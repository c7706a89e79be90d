"""A sweep's Plotly charts: pure functions of its summary (see `summarize_sweep`).
plotly is imported when a chart is drawn, so a sweep run without charts does not load it.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ...engine.methods import ENTROPY_GAMMA, FIXED_GAMMA, METHODS, REFERENCE, TABLE_DRAFTING
from ..measure.report import chart_layout
from .grid import SWEEP_METHODS, copy_phrase, fmt

# The trees a sweep grids by node budget: a tree offers the target its nodes as a chain offers its γ drafts.
_BUDGET_TREES = tuple(name for name in SWEEP_METHODS if "node_budget" in METHODS[name].sweep.axes)
# The methods placed at the drafts per round they made, each with the axis that labels its points (None: none).
_AT_DRAFTS = {name: next(iter(METHODS[name].sweep.axes), None) for name in SWEEP_METHODS
              if METHODS[name].sweep.at_drafts}


def _errors(part: pd.DataFrame, column: str) -> dict:
    return dict(type="data", array=part[f"{column}_std"].fillna(0).tolist())


def _egag_text(part: pd.DataFrame) -> list[str]:
    return [f"{fmt(g)}/{fmt(e)}{copy_phrase(c, ' ')}" for g, e, c in zip(part.gamma_max, part.ema, part.copy_n)]


def _sd_lines(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """SD's settings as lines over γ: one, or one per copy_n value when the sweep varies it."""
    sd = summary[summary.method == FIXED_GAMMA].sort_values("gamma")
    if sd.empty:
        return []
    if sd.copy_n.isna().all():
        return [("SD (fixed γ)", sd)]
    return [(f"SD (fixed γ, {copy_phrase(value)})", part) for value, part in sd.groupby("copy_n", sort=False)]


def speedup_figure(summary: pd.DataFrame):
    """Speedup against γ: SD a line, EGAG points at their mean γ labelled γmax/EMA, NASD at its γ."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, sd in _sd_lines(summary):
        fig.add_scatter(name=name, x=sd.gamma, y=sd.speedup_vs_ar, mode="lines+markers",
                        error_y=_errors(sd, "speedup_vs_ar"),
                        hovertemplate="γ=%{x}: %{y:.2f}× AR<extra>" + name + "</extra>")
    egag = summary[summary.method == ENTROPY_GAMMA]
    if not egag.empty:
        fig.add_scatter(name="EGAG (γmax/EMA)", x=egag.mean_gamma, y=egag.speedup_vs_ar, mode="markers+text",
                        text=_egag_text(egag), textposition="top center", marker=dict(size=10, symbol="diamond"),
                        error_y=_errors(egag, "speedup_vs_ar"),
                        hovertemplate="γmax/EMA %{text}: mean γ %{x:.2f}, %{y:.2f}× AR<extra>EGAG</extra>")
    nasd = summary[summary.method == TABLE_DRAFTING]
    if not nasd.empty:
        fig.add_scatter(name="NASD (n)", x=nasd.gamma, y=nasd.speedup_vs_ar, mode="markers+text",
                        text=[f"n={fmt(n)}" for n in nasd.ngram_n], textposition="bottom center",
                        marker=dict(size=9, symbol="square"), error_y=_errors(nasd, "speedup_vs_ar"))
    _add_budget_trees(fig, summary)
    _add_stopping_rules(fig, summary)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", annotation_text="AR")
    return chart_layout(fig, "Speedup over AR against γ (EGAG at its mean γ, trees at their nodes per round)",
                   "γ (EGAG: mean γ; SD-tree: nodes per round)", "speedup (× AR)")


def _add_budget_trees(fig, summary: pd.DataFrame) -> None:
    """Trees placed by nodes per round, their points labelled by node budget."""
    for method in _BUDGET_TREES:
        trees = summary[summary.method == method]
        if trees.empty:
            continue
        label = METHODS[method].label
        fig.add_scatter(name=f"{label} (nodes per round)", x=trees.nodes_per_round, y=trees.speedup_vs_ar,
                        mode="lines+markers+text", text=[f"{fmt(b)}" for b in trees.node_budget],
                        textposition="bottom center", marker=dict(size=9, symbol="triangle-up"),
                        error_y=_errors(trees, "speedup_vs_ar"),
                        hovertemplate="budget %{text}: %{x:.2f} nodes/round, %{y:.2f}× AR<extra>" + label + "</extra>")


def _add_stopping_rules(fig, summary: pd.DataFrame) -> None:
    """Rules that stop drafting as they go, and REST, placed at the drafts they made per round."""
    for method, axis in _AT_DRAFTS.items():
        part = summary[summary.method == method]
        if part.empty:
            continue
        text = [fmt(v) for v in part[axis]] if axis else ["" for _ in range(len(part))]
        fig.add_scatter(name=f"{part.label.iloc[0].split(' ')[0]} (drafts per round)", x=part.nodes_per_round,
                        y=part.speedup_vs_ar, mode="markers+text", text=text, textposition="top center",
                        marker=dict(size=9, symbol="circle-open"), error_y=_errors(part, "speedup_vs_ar"),
                        hovertemplate="%{text}: %{x:.2f} drafts/round, %{y:.2f}× AR<extra>" + method + "</extra>")


def acceptance_figure(summary: pd.DataFrame):
    """Acceptance rate and tokens per round against γ, SD as lines, EGAG at its mean γ."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance (accepted ÷ drafted)", "tokens per round"))
    lines = _sd_lines(summary)
    egag = summary[summary.method == ENTROPY_GAMMA]
    for col, metric in ((1, "acceptance_rate"), (2, "mean_accepted_tokens")):
        for index, (name, sd) in enumerate(lines):
            fig.add_trace(go.Scatter(name=name, x=sd.gamma, y=sd[metric], mode="lines+markers",
                                     error_y=_errors(sd, metric), legendgroup=name, showlegend=col == 1,
                                     line_color="#1f77b4" if index == 0 else None), row=1, col=col)
        if not egag.empty:
            fig.add_trace(go.Scatter(name="EGAG (γmax/EMA)", x=egag.mean_gamma, y=egag[metric], mode="markers+text",
                                     text=_egag_text(egag), textposition="top center", legendgroup=ENTROPY_GAMMA,
                                     showlegend=col == 1, marker=dict(size=10, symbol="diamond", color="#ff7f0e")),
                          row=1, col=col)
        fig.update_xaxes(title_text="γ (EGAG: mean γ)", row=1, col=col)
    fig.update_yaxes(title_text="accepted / drafted", row=1, col=1)
    fig.update_yaxes(title_text="new tokens / round", row=1, col=2)
    fig.update_layout(title="Acceptance and tokens per round against γ", legend_title="method",
                      template="plotly_white")
    return fig


def predicted_figure(summary: pd.DataFrame):
    """Measured speedup against Leviathan's prediction, one point per setting."""
    import plotly.graph_objects as go

    fig = go.Figure()
    shown = summary[summary.predicted_speedup.notna() & summary.speedup_vs_ar.notna() & (summary.method != REFERENCE)]
    for method in dict.fromkeys(shown.method):
        part = shown[shown.method == method]
        fig.add_scatter(name=method.upper(), x=part.predicted_speedup, y=part.speedup_vs_ar, mode="markers+text",
                        text=part.label, textposition="top center", marker_size=9,
                        hovertemplate="%{text}<br>predicted %{x:.2f}×, measured %{y:.2f}×<extra></extra>")
    values = pd.concat([shown.predicted_speedup, shown.speedup_vs_ar]).dropna()
    low, high = (min(0.5, values.min()), max(1.5, values.max())) if len(values) else (0.5, 1.5)
    fig.add_scatter(name="measured = predicted", x=[low, high], y=[low, high], mode="lines",
                    line=dict(dash="dot", color="grey"))
    return chart_layout(fig, "Measured against predicted speedup (Leviathan, measured α per token and c)",
                   "predicted (× AR)", "measured (× AR)")


def flops_figure(summary: pd.DataFrame):
    """Estimated FLOPs per new token (draft + target) against speedup, one point per setting."""
    import plotly.graph_objects as go

    fig = go.Figure()
    shown = summary[summary.speedup_vs_ar.notna()]
    for method in dict.fromkeys(shown.method):
        part = shown[shown.method == method]
        total = part.draft_flops_per_token.fillna(0) + part.target_flops_per_token
        fig.add_scatter(name=method.upper(), x=part.speedup_vs_ar, y=total, mode="markers+text", text=part.label,
                        textposition="top center", marker_size=9,
                        customdata=part[["draft_flops_per_token", "target_flops_per_token"]].to_numpy(),
                        hovertemplate="%{text}<br>%{x:.2f}× AR<br>draft %{customdata[0]:.3s}, target "
                                      "%{customdata[1]:.3s} FLOPs/token<extra></extra>")
    return chart_layout(fig, "Estimated FLOPs per new token (draft + target) against speedup",
                   "speedup (× AR)", "FLOPs per new token (estimate)")


FIGURES = {
    "speedup_vs_gamma": ("Speedup against γ", speedup_figure),
    "acceptance_vs_gamma": ("Acceptance and tokens per round", acceptance_figure),
    "predicted_vs_measured": ("Measured against predicted speedup", predicted_figure),
    "flops_vs_speedup": ("FLOPs per token against speedup", flops_figure),
}


def sweep_figures(summary: pd.DataFrame) -> dict[str, Any]:
    """Every chart of the report by name (see FIGURES); pure functions of the summary."""
    return {name: make(summary) for name, (_, make) in FIGURES.items()}


def temperature_figure(summary: pd.DataFrame):
    """Acceptance rate and speedup over that temperature's AR against the temperature, one line per
    setting; `summary` is the stacked summary of a sweep with a temperature axis (a `temperature` column)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("acceptance (accepted ÷ drafted)", "speedup over AR at that temperature"))
    shown = (summary[(summary.method != REFERENCE) & summary.temperature.notna()] if "temperature" in summary
             else summary.iloc[:0])
    for setting in dict.fromkeys(shown.setting):
        part = shown[shown.setting == setting].sort_values("temperature")
        name = str(part.label.iloc[0])
        for col, metric in ((1, "acceptance_rate"), (2, "speedup_vs_ar")):
            fig.add_trace(go.Scatter(name=name, x=part.temperature, y=part[metric], mode="lines+markers",
                                     error_y=_errors(part, metric), legendgroup=name, showlegend=col == 1),
                          row=1, col=col)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(title_text="temperature (0 = greedy)", row=1, col=col)
    fig.update_yaxes(title_text="accepted / drafted", row=1, col=1)
    fig.update_yaxes(title_text="speedup (× AR)", row=1, col=2)
    fig.update_layout(title="Acceptance and speedup against temperature", legend_title="setting",
                      template="plotly_white")
    return fig
