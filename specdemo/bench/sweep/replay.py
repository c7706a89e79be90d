"""A sweep replayed: one recorded AR run per prompt, and every setting of the grid replayed from it.

Under greedy decoding a setting's rounds are exact from a recording (`engine.replay`): the draft's chains
are drafted once per prompt (a `ChainBook`) and each setting is bookkeeping over them. What a replay
cannot give is time, since the target never ran; each replayed row's time is a prediction from this
machine's cost table (`bench.measure.costs`), in its own columns:

  replayed                 True: the row's rounds were replayed, not decoded (AR's row is the recorded run,
                           measured, and says False).
  predicted_seconds        the run's seconds by the cost table (setup, verification by rows, draft steps,
                           copies, each round's overhead), with AR's measured prefill on this prompt, scaled
                           so that the table's prediction of AR's recorded run equals its measured seconds
                           (the table gives the parts' relative costs, AR's run today the machine's speed).
  predicted_tokens_per_s   new tokens / predicted_seconds.
  predicted_speedup_vs_ar  predicted_tokens_per_s over AR's predicted tokens/s on the same prompt (both by the
                           table, so its own errors divide out).

The measured columns (tokens_per_s, speedup_vs_ar, seconds, draft_seconds, verify_seconds, cost_ratio,
predicted_speedup) are NaN on a replayed row: nothing was measured there. The exactness columns (rounds,
mean_accepted_tokens, acceptance_rate, mean_gamma, drafted, accepted, matches_ar, forwards and FLOPs per
token) come from the replayed rounds and equal a real run's.

`confirm` decodes the best settings for real (the sweep's own runner) and sets predicted beside measured.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from ...engine.params import DecodeParams
from ...engine.replay import record, replay_grid
from ..measure.costs import cost_table, ensure_drafter, predict_seconds, prediction_errors
from ..measure.runners import Run, measured_on
from ..suite import SuitePrompt, as_prompts, encode_prompt
from .grid import Setting
from .rows import group_rows, ratio
from .runner import run_sweep, sweep_runs
from .summary import SweepResult, summarize_sweep, sweep_result

REPLAY_COLUMNS = ["replayed", "predicted_seconds", "predicted_tokens_per_s", "predicted_speedup_vs_ar"]
CONFIRM_COLUMNS = ["label", "setting", "replayed_mean_accepted_tokens", "measured_mean_accepted_tokens",
                   "predicted_tokens_per_s", "measured_tokens_per_s", "error_pct"]

Progress = Callable[[int, int, str], None]


def replay_sweep(pair, prompts: Sequence[SuitePrompt] | Sequence[str] | str | Path | None,
                 settings: Sequence[Setting], *, progress: Progress | None = None, costs=None,
                 **params: Any) -> SweepResult:
    """The sweep `run_sweep(pair, prompts, settings, repeats=1, **params)` would run, from one recorded AR
    run per prompt: every setting replayed over the draft's chains shared across the grid (its rows say
    `replayed`, their time columns are predictions, named so: `REPLAY_COLUMNS`), AR's row the recorded run.
    params: the shared decoding parameters (greedy only: a sampled run is not replayed). costs: the machine's
    cost table (default: `cost_table(pair)`, calibrated and cached the first time). progress(done, total,
    message) after each prompt's recording and after its replays. `result.meta["seconds"]` holds the
    recording's and the replay's seconds."""
    base = DecodeParams.from_values(**params)
    if not base.sampling.greedy:
        raise ValueError(f"sweep --replay: temperature {base.temperature} samples, and a sampled run leaves "
                         "greedy AR's path, where nothing was recorded; replay at temperature 0")
    runs = sweep_runs(pair, settings, base)
    costs = costs if costs is not None else cost_table(pair)
    items = as_prompts(prompts)
    # record's own top_k is how many of the target's best ids it keeps; greedy decoding reads no sampling top-k.
    shared = {k: v for k, v in base.as_dict().items() if k not in ("seed", "top_k")}
    seed = base.seed if base.seed is not None else 1234
    grid = [(s.method, s.params()) for s in runs[1:]]
    rows: list[dict] = []
    seconds = {"record": 0.0, "replay": 0.0, "predict": 0.0}
    total = 2 * len(items)
    for index, item in enumerate(items):
        ids = encode_prompt(pair, item, base.chat)
        pair.check_fits(ids, base.max_new_tokens)
        start = time.perf_counter()
        recording = record(pair, ids, **{**shared, "seed": seed})
        seconds["record"] += time.perf_counter() - start
        _tick(progress, 2 * index + 1, total, f"{item.id} recorded")
        start = time.perf_counter()
        replayed = replay_grid(recording, grid, pair=pair)
        seconds["replay"] += time.perf_counter() - start
        start = time.perf_counter()
        rows += _prompt_rows(pair, costs, item, index, seed, ids, recording, runs, replayed)
        seconds["predict"] += time.perf_counter() - start
        _tick(progress, 2 * index + 2, total, f"{item.id} replayed ({len(grid)} settings)")
    result = sweep_result(pair, rows, runs, repeats=1, warmup=False, **params)
    for name in REPLAY_COLUMNS:
        result.rows[name] = [row[name] for row in rows]
    result.use_summary(replay_summary(result.rows))
    result.meta.update(replayed=True, seconds=seconds, cost_table=costs.key)
    return result


def _tick(progress: Progress | None, done: int, total: int, message: str) -> None:
    if progress is not None:
        progress(done, total, message)


def _prompt_rows(pair, costs, item, index, seed, ids, recording, runs, replayed) -> list[dict]:
    """One prompt's rows: AR's measured run (the recording), then each replayed setting, with predictions."""
    ar = recording.ar_result
    group = [(runs[0], 0, Run.of(ar, ar.seconds))] + [
        (setting, position + 1, Run.of(result, math.nan)) for position, (setting, result) in
        enumerate(zip(runs[1:], replayed))]
    rows = group_rows(item, index, 0, seed, ids, group, greedy=True)
    predicted = []
    for _, _, run in group:
        ensure_drafter(costs, pair, run.result)  # a drafter the table has not seen is timed once, and kept
        predicted.append(predict_seconds(run.result, costs, prefill_seconds=recording.ar_prefill_seconds))
    costs.save()
    # The table holds the parts' relative costs; how fast the machine runs today is what AR's run on this
    # prompt just measured, so every prediction is set to the scale at which the table predicts that run.
    scale = ratio(ar.seconds, predicted[0])
    predicted = [seconds * scale for seconds in predicted] if math.isfinite(scale) else predicted
    ar_rate = ratio(len(ar.token_ids), predicted[0])
    for row, (_, _, run), seconds in zip(rows, group, predicted):
        rate = ratio(len(run.token_ids), seconds)
        row.update(replayed=run.result is not ar, predicted_seconds=seconds, predicted_tokens_per_s=rate,
                   predicted_speedup_vs_ar=ratio(rate, ar_rate), temperature=0.0, batch=1, batch_index=index,
                   batch_row=0, batch_seconds=row["seconds"], **measured_on(pair.device))
    return rows


def replay_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """The sweep's summary (`summarize_sweep`) with, per setting, whether it was replayed and its predictions:
    tokens/s as new tokens over predicted seconds, the speedup as the geometric mean over prompts."""
    summary = summarize_sweep(rows)
    extra = []
    for key in summary.setting:
        mine = rows[rows.setting == key]
        speedups = mine.predicted_speedup_vs_ar.dropna()
        extra.append({"replayed": bool(mine.replayed.all()),
                      "predicted_tokens_per_s": ratio(mine.new_tokens.sum(), mine.predicted_seconds.sum()),
                      "predicted_speedup_vs_ar": math.exp(speedups.map(math.log).mean()) if len(speedups)
                      else math.nan})
    return pd.concat([summary, pd.DataFrame(extra, index=summary.index)], axis=1)


def best_settings(result: SweepResult, k: int) -> list[Setting]:
    """The k replayed settings of the highest predicted speedup over AR."""
    summary = result.summary[result.summary.replayed].sort_values("predicted_speedup_vs_ar", ascending=False)
    by_key = {s.key: s for s in result.settings}
    return [by_key[key] for key in summary.setting.head(k)]


def confirm(pair, prompts, replayed: SweepResult, k: int, *, repeats: int = 1, progress: Progress | None = None,
            **params: Any) -> tuple[SweepResult, pd.DataFrame]:
    """Decode the k best replayed settings for real (`run_sweep`, AR interleaved) and set each one's predicted
    tokens/s beside its measured: (the real sweep, CONFIRM_COLUMNS one row per setting)."""
    chosen = best_settings(replayed, k)
    real = run_sweep(pair, prompts, chosen, repeats=repeats, progress=progress, **params)
    predicted, measured = replayed.summary.set_index("setting"), real.summary.set_index("setting")
    errors = prediction_errors([(s.key, predicted.loc[s.key, "predicted_tokens_per_s"],
                                 measured.loc[s.key, "tokens_per_s"]) for s in chosen])
    table = pd.DataFrame({
        "label": [s.label for s in chosen], "setting": [s.key for s in chosen],
        "replayed_mean_accepted_tokens": [predicted.loc[s.key, "mean_accepted_tokens"] for s in chosen],
        "measured_mean_accepted_tokens": [measured.loc[s.key, "mean_accepted_tokens"] for s in chosen],
        "predicted_tokens_per_s": errors.predicted_tokens_per_s, "measured_tokens_per_s": errors.measured_tokens_per_s,
        "error_pct": errors.error_pct}, columns=CONFIRM_COLUMNS)
    return real, table
