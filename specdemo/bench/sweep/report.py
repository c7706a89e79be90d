"""A sweep's files: the rows CSV, the summary CSV and one HTML page with the verdict, the
summary table, the charts and the definitions of the columns.
"""

from __future__ import annotations

import html
from pathlib import Path

from ...engine.pair import DRAFT_ROLE, TARGET_ROLE
from ..measure.report import figure_divs, html_page, write_frames
from . import rows
from .charts import FIGURES, sweep_figures
from .summary import SweepResult

_SHOWN = ["label", "runs", "speedup_vs_ar", "speedup_vs_ar_std", "tokens_per_s", "tokens_per_s_std",
          "acceptance_rate", "mean_accepted_tokens", "mean_gamma", "wasted_drafts_per_token",
          "target_forwards_per_token", "draft_forwards_per_token", "draft_flops_per_token",
          "target_flops_per_token", "cost_ratio", "predicted_speedup", "exact_match_pct"]


WHY_TITLES = {
    "entropy_acceptance": "Does the drafter's entropy predict acceptance? (SD and EGAG runs)",
    "position_acceptance": "Acceptance by draft position",
    "break_even": "Break-even of each method's fastest setting: predicted speedup against α (Leviathan, per token)",
}


def report_html(result: SweepResult, path: str | Path | None = None, plotlyjs: str = "inline") -> str:
    """One HTML page: the verdict, the summary table, the figures and the definitions."""
    summary, meta = result.summary, result.meta
    figures = {**sweep_figures(summary), **result.why_figures()}
    titles = {**{name: title for name, (title, _) in FIGURES.items()}, **WHY_TITLES}
    parts = figure_divs([(name, figures[name], title) for name, title in titles.items()], plotlyjs)
    table = summary[_SHOWN].to_html(index=False, float_format=lambda v: f"{v:.3g}", na_rep="", border=0,
                                    classes="summary")
    params = ", ".join(f"{k}={v}" for k, v in meta.get("params", {}).items())
    info = html.escape(
        f"pair {meta.get('pair')} (target {meta.get(TARGET_ROLE)}, draft {meta.get(DRAFT_ROLE)}) "
        f"on {meta.get('device')}, "
        f"dtype {meta.get('dtype')}, {meta.get('threads')} threads; torch {meta.get('torch')}, transformers "
        f"{meta.get('transformers')}; {meta.get('prompts')} prompts × {meta.get('repeats')} repeats; {params}; "
        f"{meta.get('time')}" + ("; STOPPED EARLY" if result.stopped else ""))
    definitions = html.escape(rows.__doc__.split("Definitions of the row columns")[1])
    errors = result.errors if result.errors is not None else None
    errors_html = ("<h2>Failed tasks (their rows are left out)</h2>\n"
                   + html.escape(errors.to_string(index=False)).join(("<pre>", "</pre>"))
                   if errors is not None and not errors.empty else "")
    policies = result.policy_table
    policy_html = ("<h2>Adaptive draft length against the best fixed γ (95% bootstrap interval over prompts)</h2>\n"
                   + policies.to_html(index=False, float_format=lambda v: f"{v:.3g}", na_rep="", border=0,
                                      classes="summary")) if not policies.empty else ""
    return html_page("specdemo sweep", f"""<h1>Speculative decoding sweep</h1>
<p>{info}</p>
<p class="verdict">{html.escape(result.verdict)}</p>
<h2>Summary (mean over repeats; *_std: std over repeats)</h2>
{table}
{errors_html}
{policy_html}
{''.join(parts)}
<h2>Definitions</h2>
<pre>Definitions of the row columns{definitions}</pre>""", path)


def write_outputs(result: SweepResult, csv: str | Path | None = None, summary_csv: str | Path | None = None,
                  report: str | Path | None = None, plotlyjs: str = "inline",
                  tokens_csv: str | Path | None = None) -> list[Path]:
    """The rows CSV, the summary CSV, the per-token CSV (one row per drafted token) and the
    HTML report, each only if its path is given; beside the rows, *.errors.csv where tasks of a
    cluster run failed. Settings that do not apply to a method are empty cells."""
    failed = result.errors if csv and result.errors is not None and not result.errors.empty else None
    errors_csv = str(Path(csv).with_suffix("")) + ".errors.csv" if failed is not None else None
    written = write_frames([(csv, result.rows), (summary_csv, result.summary), (tokens_csv, result.tokens),
                            (errors_csv, failed)])
    if report:
        report_html(result, report, plotlyjs)
        written.append(Path(report))
    return written
