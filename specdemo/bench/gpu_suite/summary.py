"""The suite's markdown summary, and the README's GPU table filled from it.

The headline table sits between two markers, in the summary and in the README alike, so
`python -m specdemo.bench.gpu_suite --readme SUMMARY.md` copies one into the other.

May import torch and pandas.
"""

from __future__ import annotations

import math
import platform
import re
from pathlib import Path

import torch

START, END = "<!-- gpu-table:start -->", "<!-- gpu-table:end -->"
HEADLINE = [
    ("pair", "pair"), ("mode", "mode"), ("ar_tokens_per_s", "AR tok/s"), ("roofline_pct", "AR % of roofline"),
    ("ar_vs_hf_generate", "AR ÷ HF generate"), ("ar_vs_hf_static", "AR ÷ HF static"), ("sd_vs_ar", "SD ÷ AR"),
    # transformers refuses assisted generation with a static cache: its assisted peer always runs a dynamic one.
    ("sd_vs_hf_assisted", "SD ÷ HF assisted (dynamic cache)"), ("acceptance", "acceptance"),
    ("round_overhead", "round overhead"),
]
NOT_MEASURED = "not yet measured"


def environment(device: str, dtype: str) -> list[tuple[str, str]]:
    """Device, dtype and the versions every number depends on."""
    import transformers

    where = torch.device(device)
    if where.type == "cuda":
        name = f"{torch.cuda.get_device_name(where)} (cuda)"
        cuda = torch.version.cuda or "?"
    else:
        name, cuda = f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} thread(s)", "none"
    return [("device", name), ("dtype", dtype), ("torch", torch.__version__), ("CUDA", cuda),
            ("transformers", transformers.__version__), ("python", platform.python_version())]


def table_cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def headline_table(rows: list[dict], facts: list[tuple[str, str]], command: str) -> list[str]:
    """The table the README shows: one row per (pair, mode), the device and versions above it."""
    lines = [START, ", ".join(f"{k} {v}" for k, v in facts) + ".", "", f"`{command}`", ""]
    lines.append("| " + " | ".join(label for _, label in HEADLINE) + " |")
    lines.append("|" + "---|" * len(HEADLINE))
    for row in rows:
        lines.append("| " + " | ".join(table_cell(row.get(key)) for key, _ in HEADLINE) + " |")
    if not rows:
        lines.append("| " + " | ".join([NOT_MEASURED] + ["–"] * (len(HEADLINE) - 1)) + " |")
    return lines + [END]


def markdown(outcomes, facts: list[tuple[str, str]], command: str, out: Path) -> str:
    """The whole summary: environment, each stage's and unit's status, the headline, the compile
    seconds, details, failures."""
    lines = ["# GPU suite", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in facts]
    lines += [f"| command | `{command}` |", f"| results | {out} |", "", "## Stages", "",
              "| stage | status | seconds | budget (min) |", "|---|---|---|---|"]
    for outcome in outcomes:
        cap = "–" if outcome.budget_minutes is None else f"{outcome.budget_minutes:g}"
        lines.append(f"| {outcome.stage.name} | {outcome.status} | {outcome.seconds:.1f} | {cap} |")
    lines += ["", "## Units", "", "| stage | unit | estimate (min) | status | seconds |", "|---|---|---|---|---|"]
    for outcome in outcomes:
        for unit in outcome.units:
            lines.append(f"| {outcome.stage.name} | {unit.name} | {unit.estimate_minutes:.2f} | {unit.status} | "
                         f"{unit.seconds:.1f} |")
    rows = [row for o in outcomes if o.context for row in o.context.headline]
    lines += ["", "## Headline", ""] + headline_table(rows, facts, command)
    compiled = [row for o in outcomes if o.context for row in o.context.compile_rows]
    if compiled:
        lines += ["", "## Compile seconds", "",
                  "Each method's first call (the warm-up, as long as a timed one) against its timed calls: the "
                  "difference is what compiling and first-call start-up cost.", "",
                  "| unit | method | warm-up (s) | timed call, median (s) | compile (s) |", "|---|---|---|---|---|"]
        lines += [f"| {r['unit']} | {r['method']} | {table_cell(r['warmup_s'])} | {table_cell(r['timed_s'])} | "
                  f"{table_cell(r['compile_s'])} |" for r in compiled]
    for outcome in outcomes:
        if outcome.context and (outcome.context.lines or outcome.context.files):
            lines += ["", f"## {outcome.stage.name}: {outcome.stage.title}", ""] + outcome.context.lines
            if outcome.context.files:
                lines += ["", "Files: " + ", ".join(f"`{_relative(p, out)}`" for p in outcome.context.files)]
    failed = [o for o in outcomes if o.error]
    if failed:
        lines += ["", "## Failures"]
        for outcome in failed:
            lines += ["", f"### {outcome.stage.name}", "", "```", outcome.error.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def _relative(path: Path, out: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(out.resolve()))
    except ValueError:
        return str(path)


def table_block(text: str) -> str:
    """The marked headline block of a summary or README (markers included)."""
    match = re.search(re.escape(START) + r".*?" + re.escape(END), text, re.S)
    if match is None:
        raise ValueError(f"no {START} … {END} block found")
    return match.group(0)


def merge_blocks(blocks: list[str]) -> str:
    """One table from several runs' blocks (say, one per transfer): the first's device line, every
    run's command and measured rows."""
    head, commands, rows = [], [], []
    for index, block in enumerate(blocks):
        lines = block.splitlines()[1:-1]
        table = next(i for i, line in enumerate(lines) if line.startswith("| "))
        if index == 0:
            head = [line for line in lines[:table] if line and not line.startswith("`")]
        commands += [line for line in lines[:table] if line.startswith("`")]
        rows += [line for line in lines[table + 2:] if NOT_MEASURED not in line]
        header = lines[table: table + 2]
    if not rows:
        rows = [line for line in blocks[0].splitlines() if line.startswith("| ") and NOT_MEASURED in line]
    spaced = [part for command in commands for part in (command, "")]  # one paragraph each
    return "\n".join([START, *head, "", *spaced, *header, *rows, END])


def fill_readme(summaries: Path | list[Path], readme: Path) -> None:
    """Replace the README's GPU table with the summaries' (their rows together)."""
    summaries = [summaries] if isinstance(summaries, Path) else list(summaries)
    block = merge_blocks([table_block(s.read_text(encoding="utf-8")) for s in summaries])
    text = readme.read_text(encoding="utf-8")
    table_block(text)  # the README must have the block to replace
    readme.write_text(re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S),
                      encoding="utf-8")
