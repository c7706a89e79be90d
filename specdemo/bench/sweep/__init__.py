"""Sweeps: speedup against γ (SD), γ_max and EMA (EGAG) and n (NASD), AR interleaved.

The question a sweep answers: where does fixed-γ SD peak, and does entropy-guided γ
(EGAG) reach that peak without tuning? Every grid point runs on the same prompts, with AR
interleaved so every speedup is a ratio to AR on the same prompt in the same repeat.

    settings = expand_grid(gamma=[1, 2, 4], gamma_max=[4, 6], ema=[0, 0.9])
    for event in iter_sweep(pair, prompts, settings, repeats=2):   # streams
        chart = sweep_figures(summarize_sweep(event.rows))["speedup_vs_gamma"]
    result = run_sweep(pair, prompts, settings, repeats=2)         # blocks

The pieces, each importing only those before it:
  grid     `Setting`, `expand_grid`: the points a sweep runs.
  rows     one row per run (the column definitions are there).
  charts   the Plotly charts, pure functions of the summary.
  verdict  `policy_verdict`: adaptive rules against the best fixed γ, per category, bootstrapped over prompts.
  summary  `summarize_sweep`, `verdict`, and `SweepResult`, what a finished sweep leaves.
  runner   `iter_sweep`, `run_sweep`: the interleaved runs.
  report   the CSVs and the HTML page.
"""

from .charts import FIGURES, acceptance_figure, flops_figure, predicted_figure, speedup_figure, sweep_figures
from ...engine.flops import matmul_parameters
from .grid import (
    ADAPTIVE_METHODS, AR, DEFAULT_EMAS, DEFAULT_GAMMA_MAXES, DEFAULT_GAMMAS, DEFAULT_NGRAM_NS, SETTING_COLUMNS, SWEEP_METHODS, Setting,
    copy_phrase, expand_grid,
)
from .report import report_html, write_outputs
from .rows import ROW_COLUMNS, rows_frame
from .runner import Progress, SweepEvent, iter_sweep, run_sweep
from .summary import SUMMARY_COLUMNS, SweepResult, summarize_sweep, sweep_result, verdict
from .verdict import VERDICT_COLUMNS, policy_sentence, policy_verdict

__all__ = [
    "ADAPTIVE_METHODS", "AR", "DEFAULT_EMAS", "DEFAULT_GAMMAS", "DEFAULT_GAMMA_MAXES", "DEFAULT_NGRAM_NS", "FIGURES", "ROW_COLUMNS",
    "SETTING_COLUMNS", "SUMMARY_COLUMNS", "SWEEP_METHODS", "Progress", "Setting", "SweepEvent", "SweepResult",
    "acceptance_figure", "copy_phrase", "expand_grid", "flops_figure", "iter_sweep", "matmul_parameters",
    "predicted_figure", "report_html", "rows_frame", "run_sweep", "speedup_figure", "summarize_sweep",
    "sweep_figures", "sweep_result", "verdict", "write_outputs", "VERDICT_COLUMNS", "policy_sentence", "policy_verdict",
]
