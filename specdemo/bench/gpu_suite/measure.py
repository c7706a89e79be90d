"""What the synthetic and embedded stages share: one benchmark of a pair in one mode (after a
timed warm-up call of each method, as long as a timed one, whose extra seconds are the method's
compile seconds), its files, the round overhead, and the headline numbers read off the summary.

May import torch, pandas and the other bench modules.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Sequence

from ...engine.methods import FIXED_GAMMA, REFERENCE
from ...engine.params import DecodeParams
from ..measure.benchmark import BenchResult, run_benchmark
from ..overhead import measure_round_overhead
from ..measure.report import write_outputs
from ..measure.roofline import add_roofline
from ..measure.runners import HF_METHODS, HFRunner, run_ours
from ..suite import ALL, SuitePrompt, conversation, encode_prompt
from .stages import Mode, OutOfTime, StageContext


def decode_params(ctx: StageContext, chat: bool, copy_n: int | None = None,
                  max_new_tokens: int | None = None) -> DecodeParams:
    s = ctx.settings
    values = dict(max_new_tokens=max_new_tokens or s.max_new_tokens, gamma=s.gamma, temperature=0.0, seed=s.seed,
                  chat=chat)
    if copy_n is not None:
        values["copy_n"] = copy_n
    return DecodeParams.from_values(**values)


def prompt_ids(pair, prompts: Sequence[SuitePrompt], chat: bool) -> list[tuple[str, list[int]]]:
    return [(item.id, encode_prompt(pair, conversation(item, 1, []), chat)) for item in prompts]


def bench(ctx: StageContext, pair, prompts: Sequence[SuitePrompt], methods: list[str], mode: Mode,
          decode: DecodeParams, stem: str, repeats: int | None = None, warmup: bool = True,
          roofline: bool = True) -> BenchResult:
    """One benchmark run, its CSVs and report under the output folder, its roofline lines noted, each
    method's compile seconds recorded (warmup) and the run stopped at the stage's deadline."""
    repeats = repeats or ctx.settings.repeats
    ctx.log(f"{stem}: {', '.join(methods)} × {len(prompts)} prompt(s) × {repeats}")
    chat = bool(decode.chat)
    warm = warm_up(ctx, pair, encode_prompt(pair, conversation(prompts[0], 1, []), chat), methods, mode, decode) \
        if warmup else {}
    result = run_benchmark(pair, list(prompts), methods, repeats=repeats, warmup=False, decode=decode,
                           cache=mode.cache, compile=mode.compile, progress=deadline_progress(ctx, stem))
    ctx.compile_rows.extend(compile_rows(stem, warm, result))
    lines = add_roofline(result, pair, ctx.settings.bandwidth) if roofline else []
    ctx.note(f"**{stem}** ({mode.name})" + (": " + "; ".join(line.strip() for line in lines) if lines else ""))
    write_files(ctx, result, stem)
    errors = result.rows[result.rows.error.fillna("") != ""]
    for _, row in errors.drop_duplicates("method").iterrows():
        ctx.note(f"- {row.method} failed: `{row.error}`")
    return result


def warm_up(ctx: StageContext, pair, prompt_ids: list[int], methods: list[str], mode: Mode,
            decode: DecodeParams) -> dict[str, float]:
    """One untimed-by-the-benchmark call of each method, as long as a timed one, so that compiling,
    kernel selection and every cache shape happen here; the wall seconds of each."""
    hf = HFRunner(pair, decode) if any(m in HF_METHODS for m in methods) else None
    values = {k: v for k, v in decode.as_dict().items() if k != "seed"}
    seed = decode.seed if decode.seed is not None else 1234
    seconds = {}
    for method in methods:
        ctx.check_time(f"{method}'s warm-up")
        try:
            if method in HF_METHODS:
                warm = hf.run(method, prompt_ids, seed)
            else:
                warm = run_ours(pair, method, prompt_ids, values, seed, cache=mode.cache, compile=mode.compile)
        except Exception:  # the benchmark's own call of it records the error
            continue
        # As a timed call is timed (after its garbage collection), with what our runs keep off the clock.
        seconds[method] = warm.seconds + (warm.result.off_clock_seconds if warm.result is not None else 0.0)
    return seconds


def compile_rows(unit: str, warm: dict[str, float], result: BenchResult) -> list[dict]:
    """Per method: its warm-up's seconds, its timed calls' median, and the difference (compiling and
    first-call start-up; never below zero)."""
    rows = result.rows[result.rows.error.fillna("") == ""]
    out = []
    for method, seconds in warm.items():
        timed = float(rows[rows.method == method].seconds.median()) if (rows.method == method).any() else math.nan
        compiling = max(seconds - timed, 0.0) if not math.isnan(timed) else math.nan
        out.append({"unit": unit, "method": method, "warmup_s": seconds, "timed_s": timed, "compile_s": compiling})
    return out


def deadline_progress(ctx: StageContext, stem: str):
    """A benchmark progress callback that stops the run once the stage's time is spent."""
    def progress(done: int, total: int, message: str) -> None:
        if done < total and ctx.seconds_left() <= 0:
            raise OutOfTime(f"stopped at its budget in {stem} ({done} of {total} calls done)")
    return progress


def write_files(ctx: StageContext, result: BenchResult, stem: str) -> None:
    out = ctx.settings.out
    csv, summary_csv, report = out / f"{stem}.csv", out / f"{stem}.summary.csv", out / f"{stem}.html"
    if importlib.util.find_spec("plotly") is None:
        # The GPU image may lack plotly: the numbers still land, as a plain table.
        write_outputs(result, csv, summary_csv)
        report.write_text(result.summary.to_html(index=False), encoding="utf-8")
        ctx.note(f"- plotly is not installed: `{report.name}` is the summary table without figures")
    else:
        write_outputs(result, csv, summary_csv, report, plotlyjs="cdn")
    ctx.wrote(csv, summary_csv, report)


def overhead(ctx: StageContext, pair, prompts: list[tuple[str, list[int]]], mode: Mode, stem: str) -> float:
    """SD's round time over its model calls timed alone; the table lands in `stem`.overhead.csv."""
    s = ctx.settings
    report = measure_round_overhead(pair, prompts, gamma=s.gamma, max_new_tokens=s.max_new_tokens, cache=mode.cache,
                                    compile=mode.compile, calls=5 if s.tiny else 30)
    path = s.out / f"{stem}.overhead.csv"
    report.table.to_csv(path, index=False)
    ctx.wrote(path)
    ctx.note("- " + report.summary.replace("\n", " — "))
    overall = report.table.set_index("prompt").loc[ALL]
    return float(overall.round_overhead)


def _overall(result: BenchResult, method: str, column: str) -> float:
    summary = result.summary[result.summary.category == ALL].set_index("method")
    if method not in summary.index or column not in summary:
        return math.nan
    return float(summary.loc[method, column])


def ratio(result: BenchResult, method: str, other_method: str = REFERENCE) -> float:
    """tokens/s of `method` over tokens/s of `other_method` in the same run."""
    mine, theirs = (_overall(result, m, "tokens_per_s_mean") for m in (method, other_method))
    return mine / theirs if theirs and theirs == theirs else math.nan


def headline(pair_name: str, mode: Mode, result: BenchResult, round_overhead: float = math.nan) -> dict:
    """One row of the README's table."""
    return {
        "pair": pair_name, "mode": mode.name,
        "ar_tokens_per_s": _overall(result, REFERENCE, "tokens_per_s_mean"),
        "roofline_pct": 100 * _overall(result, REFERENCE, "roofline_fraction"),
        "ar_vs_hf_generate": ratio(result, REFERENCE, "hf-generate"),
        "ar_vs_hf_static": ratio(result, REFERENCE, "hf-generate-static"),
        "sd_vs_ar": ratio(result, FIXED_GAMMA),
        "sd_vs_hf_assisted": ratio(result, FIXED_GAMMA, "hf-assisted"),
        "acceptance": _overall(result, FIXED_GAMMA, "acceptance_rate"),
        "round_overhead": round_overhead,
    }
