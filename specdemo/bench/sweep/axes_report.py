"""What a sweep over several combinations of the axes adds to each combination's own report: the batch
sizes set side by side (each size's throughput over AR's, the verdict, the charts), acceptance and
speedup against temperature, and the combinations' table, on one HTML page.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from ..measure.batch_charts import batch_figures
from ..measure.batching import batch_verdict, summarize_batches
from ..measure.report import figure_divs, html_page
from .axes import label, stacked
from .charts import temperature_figure
from .summary import SweepResult

Runs = Sequence[tuple[Mapping[str, Any], SweepResult]]


def _other_axes(runs: Runs, but: str) -> list[str]:
    return [name for name in dict.fromkeys(n for combination, _ in runs for n in combination) if name != but]


def axes_batches(runs: Runs) -> pd.DataFrame | None:
    """Where the sweep had a batch axis: each (other axes' values, batch size, setting)'s throughput, latency and
    ratio to AR's (`batching.summarize_batches`, keyed by setting); None without one."""
    if not any("batch" in combination for combination, _ in runs):
        return None
    rows = stacked(runs, "rows")
    others = _other_axes(runs, "batch")
    parts = rows.groupby(others, sort=False, dropna=False) if others else [((), rows)]
    tables = []
    for values, part in parts:
        values = values if isinstance(values, tuple) else (values,)
        table = summarize_batches(part, key="setting")
        for name, value in zip(others, values):
            table.insert(0, name, value)
        tables.append(table)
    return pd.concat(tables, ignore_index=True)


def batch_verdicts(batches: pd.DataFrame, others: Sequence[str]) -> list[str]:
    """One verdict per combination of the other axes, prefixed by it where there are several."""
    if not others:
        return [batch_verdict(batches)]
    return [f"{label(dict(zip(others, values if isinstance(values, tuple) else (values,))))}: {batch_verdict(part)}"
            for values, part in batches.groupby(list(others), sort=False, dropna=False)]


def axes_report_html(runs: Runs, table: pd.DataFrame, path: str | Path | None = None, plotlyjs: str = "inline") -> str:
    """The page: the verdicts, the batch charts and table, the temperature chart, the combinations' table."""
    figures: list[tuple[str, Any]] = []
    sections = []
    batches = axes_batches(runs)
    if batches is not None:
        others = _other_axes(runs, "batch")
        verdicts = "".join(f"<p>{html.escape(v)}</p>" for v in batch_verdicts(batches, others))
        sections.append(f"<h2>Batch sizes</h2>{verdicts}")
        for values, part in (batches.groupby(others, sort=False, dropna=False) if others else [((), batches)]):
            figures += [(f"{name}{len(figures)}", fig) for name, fig in batch_figures(part).items()]
    if any("temperature" in combination for combination, _ in runs):
        figures.append(("temperature", temperature_figure(stacked(runs, "summary"))))
    charts = "".join(figure_divs([(name, fig, None) for name, fig in figures], plotlyjs))
    tables = table.to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="–", border=0)
    if batches is not None:
        tables += batches.to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="–", border=0)
    return html_page("specdemo sweep axes", f"<h1>Sweep over {html.escape(', '.join(_other_axes(runs, '')))}</h1>"
                     f"{''.join(sections)}{charts}<h2>Combinations</h2>{tables}", path)
