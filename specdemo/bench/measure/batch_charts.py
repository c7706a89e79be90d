"""The batch-size charts, pure functions of a batch summary (`batching.summarize_batches`): each
drafting method's throughput ÷ AR's against batch size, with the line at 1 and the first batch size
below it marked, and every method's throughput against batch size.

May import plotly (when a chart is drawn, so that a run without charts never loads it) and pandas; never
torch or gradio.
"""

from __future__ import annotations

import math

import pandas as pd

from .batching import crossover, drafting_methods

BATCH_FIGURES = {"batch_ratio": "Throughput ÷ AR's against batch size",
                 "batch_throughput": "Throughput against batch size"}


def _name(summary: pd.DataFrame, method: str) -> str:
    labels = summary[summary.method == method].label.dropna()
    return str(labels.iloc[0]) if len(labels) and labels.iloc[0] else method


def _layout(fig, title: str, y_title: str, sizes: list[int]):
    fig.update_layout(title=title, template="plotly_white", height=380, margin=dict(l=60, r=20, t=50, b=50),
                      legend=dict(orientation="h", y=-0.2))
    # Batch sizes are doublings: a log axis spaces them evenly and labels each one measured.
    fig.update_xaxes(title="batch size (requests)", type="log", tickvals=sizes, ticktext=[str(s) for s in sizes])
    fig.update_yaxes(title=y_title)
    return fig


def ratio_figure(summary: pd.DataFrame):
    """Each drafting method's throughput ÷ AR's at each batch size (error bars: the bootstrap interval), a
    dashed line at 1 and, where a method's ratio falls below it, a marker at the first such batch size."""
    import plotly.graph_objects as go

    fig = go.Figure()
    sizes = sorted(int(b) for b in summary.batch.unique()) if len(summary) else [1]
    for method in drafting_methods(summary):
        mine = summary[(summary.method == method) & summary.throughput_vs_ar.notna()].sort_values("batch")
        if mine.empty:
            continue
        upper = (mine.throughput_vs_ar_high - mine.throughput_vs_ar).fillna(0)
        lower = (mine.throughput_vs_ar - mine.throughput_vs_ar_low).fillna(0)
        name = _name(summary, method)
        fig.add_trace(go.Scatter(x=mine.batch.tolist(), y=mine.throughput_vs_ar.tolist(), mode="lines+markers",
                                 name=name, error_y=dict(type="data", array=upper.tolist(), arrayminus=lower.tolist(),
                                                         visible=True)))
        below = crossover(summary, method)
        if below is not None:
            ratio = float(mine[mine.batch == below].throughput_vs_ar.iloc[0])
            fig.add_trace(go.Scatter(x=[below], y=[ratio], mode="markers", showlegend=False,
                                     marker=dict(symbol="x", size=14, color="#d62728"),
                                     name=f"{name}: below AR from batch {below}"))
            fig.add_annotation(x=math.log10(below), y=ratio, text=f"{name} < AR from batch {below}",
                               showarrow=True, arrowhead=2, ay=-35)
    fig.add_hline(y=1.0, line_dash="dash", line_color="#555", annotation_text="AR",
                  annotation_position="bottom right")
    return _layout(fig, BATCH_FIGURES["batch_ratio"], "throughput ÷ AR's (same batch size)", sizes)


def throughput_figure(summary: pd.DataFrame):
    """Every method's throughput (all rows' new tokens ÷ the batches' wall time) at each batch size."""
    import plotly.graph_objects as go

    fig = go.Figure()
    sizes = sorted(int(b) for b in summary.batch.unique()) if len(summary) else [1]
    for method in dict.fromkeys(summary.method):
        mine = summary[(summary.method == method) & summary.throughput_tokens_per_s.notna()].sort_values("batch")
        if not mine.empty:
            fig.add_trace(go.Scatter(x=mine.batch.tolist(), y=mine.throughput_tokens_per_s.tolist(), mode="lines+markers",
                                     name=_name(summary, method)))
    return _layout(fig, BATCH_FIGURES["batch_throughput"], "new tokens / s (all requests)", sizes)


def batch_figures(summary: pd.DataFrame) -> dict:
    """Both charts, by the names in BATCH_FIGURES."""
    return {"batch_ratio": ratio_figure(summary), "batch_throughput": throughput_figure(summary)}
