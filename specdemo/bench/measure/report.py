"""The benchmark's Plotly figures and its single-page HTML report; writing and re-reading
a run's CSV files.

May import pandas, plotly and the other bench modules; never gradio.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from . import acceptance_charts, statistics
from ...engine.methods import REFERENCE
from ...engine.pair import DRAFT_ROLE, TARGET_ROLE
from ...models.precision import exactness_sentence
from .benchmark import ROUND_COLUMNS, TOKEN_COLUMNS, BenchResult, result_of
from .quality import QUALITY_COLUMNS
from .vs_float32 import VS_FLOAT32_COLUMNS
from .roofline import ROOFLINE_COLUMNS
from .runners import bench_methods
from .batch_charts import batch_figures
from .batching import batch_verdict
from .statistics import summarize
from .threads import threads_text


def make_figures(result: BenchResult) -> dict[str, Any]:
    summary = result.summary
    methods = list(dict.fromkeys(summary.method))
    figures = {
        "speedup_vs_ar": _bars(summary, "speedup_vs_ar", "speedup_vs_ar_std", "Speedup over our AR, per category",
                               "speedup (× AR)", skip=(REFERENCE,), line=1.0),
        "speedup_vs_hf": _bars(summary, "speedup_vs_hf", "speedup_vs_hf_std", "Speedup over transformers' generate",
                               "speedup (× hf-generate)", skip=("hf-generate",), line=1.0),
        "tokens_per_s": _bars(summary, "tokens_per_s_mean", "tokens_per_s_std", "Throughput", "new tokens / s"),
        "acceptance": _accepted_per_round(result.rounds, methods),
        "acceptance_by_category": _acceptance_by_category(result.rows, methods),
        "predicted_vs_measured": _predicted_vs_measured(summary),
    }
    figures.update(acceptance_charts.why_figures(result.tokens, statistics.break_evens(result.rows, summary),
                                                 label=lambda method: bench_methods().get(method, method)))
    return figures


def chart_layout(fig, title: str, x_title: str, y_title: str, **layout):
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, legend_title="method",
                      template="plotly_white", **layout)
    return fig


def _bars(summary: pd.DataFrame, column: str, std: str | None, title: str, y_title: str,
          skip: tuple[str, ...] = (), line: float | None = None):
    """A bar per (category, method) of `column`, with `std` as error bars."""
    import plotly.graph_objects as go

    categories = list(dict.fromkeys(summary.category))
    fig = go.Figure()
    for method in dict.fromkeys(summary.method):
        if method in skip:
            continue
        part = summary[summary.method == method].set_index("category").reindex(categories)
        if part[column].notna().sum() == 0:
            continue
        fig.add_bar(name=bench_methods().get(method, method), x=categories, y=part[column],
                    error_y=dict(type="data", array=part[std].fillna(0)) if std else None)
    if line is not None:
        fig.add_hline(y=line, line_dash="dot", line_color="grey")
    return chart_layout(fig, title, "category", y_title, barmode="group")


def _accepted_per_round(rounds: pd.DataFrame, methods: list[str]):
    """The distribution of accepted drafts per round, over rounds that drafted something."""
    import plotly.graph_objects as go

    rounds = rounds[rounds.drafted > 0]
    fig = go.Figure()
    for method in methods:
        part = rounds[rounds.method == method]
        if part.empty:
            continue
        counts = part.groupby("accepted")["count"].sum()
        fig.add_bar(name=bench_methods().get(method, method), x=counts.index.tolist(),
                    y=(counts / counts.sum()).tolist())
    return chart_layout(fig, "Accepted drafts per round (rounds that drafted)", "drafts accepted in the round",
                   "fraction of rounds", barmode="group")


def _acceptance_by_category(rows: pd.DataFrame, methods: list[str]):
    import plotly.graph_objects as go

    runs = rows[(rows.error.fillna("") == "") & rows.acceptance_rate.notna()]
    fig = go.Figure()
    for method in methods:
        part = runs[runs.method == method]
        if part.empty:
            continue
        fig.add_box(name=bench_methods().get(method, method), x=part.category, y=part.acceptance_rate,
                    boxpoints="all", jitter=0.3)
    return chart_layout(fig, "Acceptance rate per run, by category", "category", "accepted / drafted", boxmode="group")


def _predicted_vs_measured(summary: pd.DataFrame):
    """Leviathan's predicted speedup (with the measured verification cost too) against the measured one."""
    import plotly.graph_objects as go

    fig = go.Figure()
    predicted = summary[summary.predicted_speedup.notna() & summary.speedup_vs_ar.notna()]
    for method in dict.fromkeys(predicted.method):
        part = predicted[predicted.method == method]
        fig.add_scatter(name=bench_methods().get(method, method), x=part.predicted_speedup, y=part.speedup_vs_ar,
                        mode="markers+text", text=part.category, textposition="top center", marker_size=10,
                        customdata=part[["alpha", "cost_ratio"]].to_numpy(),
                        hovertemplate="%{text}<br>predicted %{x:.2f}×, measured %{y:.2f}×"
                                      "<br>α (Leviathan, per token)=%{customdata[0]:.2f}, c=%{customdata[1]:.3f}<extra></extra>")
        fig.add_scatter(name=f"{bench_methods().get(method, method)}, measured verify cost",
                        x=part.predicted_speedup_v, y=part.speedup_vs_ar, mode="markers", text=part.category,
                        marker=dict(size=10, symbol="circle-open"), customdata=part[["verify_cost_ratio"]].to_numpy(),
                        hovertemplate="%{text}<br>predicted with v=%{customdata[0]:.2f}: %{x:.2f}×, "
                                      "measured %{y:.2f}×<extra></extra>")
    values = pd.concat([predicted.predicted_speedup, predicted.predicted_speedup_v, predicted.speedup_vs_ar]).dropna()
    low, high = (min(0.5, values.min()), max(1.5, values.max())) if len(values) else (0.5, 1.5)
    fig.add_scatter(name="measured = predicted", x=[low, high], y=[low, high], mode="lines",
                    line=dict(dash="dot", color="grey"))
    return chart_layout(fig, "Leviathan predicted vs measured speedup over AR", "predicted (× AR)", "measured (× AR)")


_REPORT_SECTIONS = [
    ("speedup_vs_ar", "Speedup over our AR"),
    ("speedup_vs_hf", "Speedup over transformers' generate"),
    ("tokens_per_s", "Throughput"),
    ("acceptance", "Acceptance distribution"),
    ("acceptance_by_category", "Acceptance by category"),
    ("predicted_vs_measured", "Predicted vs measured speedup"),
    ("entropy_acceptance", "Does the drafter's entropy predict acceptance?"),
    ("position_acceptance", "Acceptance by draft position"),
    ("break_even", "Break-even: what α (Leviathan, per token) beats AR at the measured costs"),
]


# The reports' one stylesheet: tables right-aligned and ruled, definitions in a grey block.
REPORT_STYLE = """body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
td, th { padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: right; }
p.verdict { font-size: 1.2em; }
pre { background: #f6f6f6; padding: 1em; white-space: pre-wrap; font-size: 13px; }"""


def write_frames(targets) -> list[Path]:
    """Each (path, frame) pair with a path and a frame written as CSV; the paths written."""
    written = [(Path(target), frame) for target, frame in targets if target and frame is not None]
    for target, frame in written:
        target.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(target, index=False)
    return [target for target, _ in written]


def html_page(title: str, body: str, path: str | Path | None = None) -> str:
    """A report's whole page around `body`, written to path (its folder made) if given."""
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
            f"<style>\n{REPORT_STYLE}\n</style></head><body>\n{body}\n</body></html>\n")
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(page, encoding="utf-8")
    return page


def figure_divs(figures: Sequence[tuple[str, Any, str | None]], plotlyjs: str) -> list[str]:
    """Each (name, figure, title) as its div, under an <h2> of its title where it has one; plotly.js comes
    with the first: "inline" embeds it (works offline, ~4 MB), "cdn" links to it."""
    if plotlyjs not in ("inline", "cdn"):
        raise ValueError(f"plotlyjs must be 'inline' or 'cdn', got {plotlyjs!r}")
    return [(f"<h2>{html.escape(title)}</h2>\n" if title else "") + figure.to_html(
        full_html=False, include_plotlyjs=(True if plotlyjs == "inline" else "cdn") if i == 0 else False,
        div_id=f"fig-{name}") for i, (name, figure, title) in enumerate(figures)]


def report_html(result: BenchResult, path: str | Path | None = None, plotlyjs: str = "inline",
                figures: dict[str, Any] | None = None) -> str:
    """A single HTML page with the summary tables and the figures; written to path if given.

    plotlyjs="inline" embeds plotly.js (works offline, ~4 MB); "cdn" links to it.
    figures: `make_figures(result)` when the caller has drawn them already.
    """
    figures = figures if figures is not None else make_figures(result)
    meta, summary = result.meta, result.summary
    parts = figure_divs([(name, figures[name], title) for name, title in _REPORT_SECTIONS], plotlyjs)
    pivot = summary.pivot_table(index="category", columns="method", values="speedup_vs_ar", sort=False)
    table = _summary_table(summary)
    info = _run_info(meta)
    definitions = html.escape(statistics.__doc__.split("Definitions used in the tables (written into the report too):")[1])
    return html_page("specdemo benchmark", f"""<h1>Speculative decoding benchmark</h1>
<p>{info}</p>
<h2>Speedup over our AR (geometric mean over prompts)</h2>
{pivot.to_html(float_format=lambda v: f"{v:.2f}", na_rep="–", border=0, classes="pivot")}
{''.join(parts)}
{batch_section(result)}
<h2>Summary</h2>
{table}
<h2>Definitions</h2>
<pre>{definitions}</pre>""", path)


def batch_section(result: BenchResult) -> str:
    """Where the run measured several batch sizes (or one above 1): the verdict, the two batch charts and
    the per-size table; "" otherwise. plotly.js comes with the report's first figure."""
    batches = result.batches
    if batches.empty or result.meta.get("batch_sizes", sorted(batches.batch.unique())) == [1]:
        return ""
    figures = batch_figures(batches)
    charts = "".join(fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}")
                     for name, fig in figures.items())
    table = batches.to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="–", border=0, classes="summary")
    skipped = "".join(f"<li>{html.escape(m)}: {html.escape(r)}</li>"
                      for m, r in result.meta.get("batch_one_only", {}).items())
    return (f"<h2>Batch sizes</h2>\n<p>{html.escape(batch_verdict(batches))}</p>\n{charts}\n{table}"
            + (f"<ul>{skipped}</ul>" if skipped else ""))


def _summary_table(summary: pd.DataFrame) -> str:
    """The report's summary table: the columns a reader compares, in HTML."""
    shown = ["category", "method", "runs", "tokens_per_s_mean", "tokens_per_s_std", "speedup_vs_ar",
             "speedup_vs_hf", "acceptance_rate", "alpha", "mean_accepted_tokens", "target_forwards_per_token",
             "mean_gamma", "exact_match_pct", "first_divergence", "divergence_margin", "perplexity", "cost_ratio",
             "verify_cost_ratio", "predicted_speedup", "predicted_speedup_v", "cache", "runtime", "reference_runtime", "compile_seconds",
             "errors"]
    if summary.speedup_vs_hf_static.notna().any():
        shown.insert(shown.index("speedup_vs_hf") + 1, "speedup_vs_hf_static")
    shown += [c for c in QUALITY_COLUMNS if c in summary and summary[c].notna().any()]
    shown += [c for c in VS_FLOAT32_COLUMNS if c in summary and summary[c].notna().any()]
    shown += [c for c in ROOFLINE_COLUMNS if c in summary]
    return summary[shown].to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="–", border=0,
                                  classes="summary")


def _run_info(meta: dict[str, Any]) -> str:
    """The paragraph that says what ran where, and the roofline when one was measured."""
    params = ", ".join(f"{k}={v}" for k, v in meta.get("params", {}).items())
    info = (f"pair <b>{html.escape(str(meta.get('pair')))}</b> (target {html.escape(str(meta.get(TARGET_ROLE)))}, "
            f"draft {html.escape(str(meta.get(DRAFT_ROLE)))}; SD and EGAG drafted with "
            f"{html.escape(str(meta.get('drafter')))}) on {html.escape(str(meta.get('device')))} "
            f"({html.escape(str(meta.get('device_name')))}, {html.escape(threads_text(meta.get('threads')))}), "
            f"dtype {meta.get('dtype')}{_precisions(meta)}, our cache {meta.get('cache', '–')}, compile {meta.get('compile', '–')}; "
            f"torch {meta.get('torch')}, transformers {meta.get('transformers')}; "
            f"{meta.get('prompts')} prompts × {meta.get('repeats')} repeats; {html.escape(params)}; {meta.get('time')}")
    bound = meta.get("roofline")
    if bound:
        bandwidth = bound.get("bandwidth")
        info += (f"<br>Roofline: the target reads {bound['bytes_per_token'] / 1e6:,.2f} MB per token at a mean "
                 f"context of {bound['context_length']:.1f} positions; "
                 + (f"at {bandwidth / 1e9:,.1f} GB/s the bound is {bound['tokens_per_s']:,.1f} tokens/s"
                    + (f", our AR reaches {100 * bound['ar_fraction']:.1f} % of it" if "ar_fraction" in bound else "")
                    if bandwidth else f"no memory bandwidth is known for {html.escape(str(bound['device_name']))}"))
    return info


def _precisions(meta: dict[str, Any]) -> str:
    """Each model's precision, where the run recorded it, and what the vs-fp32 columns read."""
    if not meta.get("target_dtype"):
        return ""
    text = f" (target {html.escape(str(meta['target_dtype']))}"
    text += f", draft {html.escape(str(meta['draft_dtype']))})" if meta.get("draft_dtype") else ")"
    if meta.get("exactness"):
        text += f"; {html.escape(exactness_sentence(meta['exactness']))}"
    if meta.get("fp32_reference"):
        text += f"; the vs fp32 columns read {html.escape(str(meta['fp32_reference']))}"
    return text


def write_outputs(result: BenchResult, csv: str | Path | None = None, summary_csv: str | Path | None = None,
                  report: str | Path | None = None, plotlyjs: str = "inline",
                  figures: dict[str, Any] | None = None, tokens_csv: str | Path | None = None,
                  batch_csv: str | Path | None = None) -> list[Path]:
    """The rows CSV (plus, beside it, *.rounds.csv, *.tokens.csv and *.meta.json so `load_result`
    can rebuild the report), the summary CSV, the per-token CSV (at tokens_csv, else beside the
    rows) and the HTML report; each only if a path is given.
    figures: `make_figures(result)` when the caller has drawn them already."""
    stem = str(Path(csv).with_suffix("")) if csv else None
    written = write_frames([(csv, result.rows), (summary_csv, result.summary),
                            (stem and stem + ".rounds.csv", result.rounds),
                            (tokens_csv or (stem and stem + ".tokens.csv"), result.tokens),
                            (batch_csv, result.batches)])
    if stem:
        meta_path = Path(stem + ".meta.json")
        meta_path.write_text(json.dumps(result.meta, indent=1, default=str), encoding="utf-8")
        written.append(meta_path)
    if report:
        report_html(result, report, plotlyjs, figures)
        written.append(Path(report))
    return written


def load_result(csv: str | Path) -> BenchResult:
    """Rebuild a BenchResult (summary and figures recomputed) from what write_outputs wrote."""
    stem = str(Path(csv).with_suffix(""))
    rows = pd.read_csv(csv, keep_default_na=True)
    rows["error"] = rows["error"].astype(object).where(rows["error"].notna(), "")
    rounds_path, meta_path = Path(stem + ".rounds.csv"), Path(stem + ".meta.json")
    rounds = pd.read_csv(rounds_path) if rounds_path.is_file() else pd.DataFrame(columns=ROUND_COLUMNS)
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    gamma = meta.get("params", {}).get("gamma")
    tokens_path = Path(stem + ".tokens.csv")
    tokens = pd.read_csv(tokens_path) if tokens_path.is_file() else pd.DataFrame(columns=TOKEN_COLUMNS)
    return result_of(rows, gamma, rounds, meta, tokens)
