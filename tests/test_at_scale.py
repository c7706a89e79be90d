"""The draft at scale, one command: its budget plan, a run cut short, the size cap, and the CPU
rehearsal of every stage (`--device cpu --tiny`, at the smallest budget that runs each to its end)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from specdemo.training.at_scale import (CAP_BYTES, STAGES, CutShort, Plan, directory_bytes, keep_within_cap,
                                        parse_plan, run_stages, stop_on_sigterm)

ROOT = Path(__file__).resolve().parent.parent


class Ticking:
    """A clock that moves only when told: deadlines are checked without waiting."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Context:
    partial: dict = {}


def test_each_stage_gets_its_share_and_its_deadline_adds_the_shares_before_it():
    plan = Plan(10, {"write": 0.5, "train": 0.3, "measure": 0.15})
    assert [plan.minutes(s) for s in STAGES] == pytest.approx([5, 3, 1.5])
    deadlines = plan.deadlines(start=100.0)
    assert [deadlines[s] for s in STAGES] == pytest.approx([100 + 300, 100 + 480, 100 + 570])
    assert plan.as_dict() == {"budget_minutes": 10, "minutes": {"write": 5.0, "train": 3.0, "measure": 1.5}}


def test_a_plan_is_refused_when_its_shares_exceed_the_budget_or_name_no_stage():
    with pytest.raises(ValueError, match="add up to at most 1"):
        Plan(9, {"write": 0.7, "train": 0.5})
    with pytest.raises(ValueError, match="unknown stages"):
        Plan(9, {"write": 0.5, "sleep": 0.1})
    with pytest.raises(ValueError, match="positive"):
        Plan(0)
    assert parse_plan("write=0.6, train=0.2") == {"write": 0.6, "train": 0.2, "measure": 0.2}


def test_every_stage_is_given_its_own_deadline_and_the_summary_is_written_after_each(tmp_path):
    clock, seen = Ticking(), {}

    def stage(name, minutes):
        def run(context, deadline):
            seen[name] = (deadline, json.loads((tmp_path / "summary.json").read_text())["stages"].copy())
            clock.now += 60 * minutes
            return {"made": name}
        return run

    summary = run_stages(tmp_path, Plan(10), {s: stage(s, 1) for s in STAGES}, Context(), log=lambda m: None,
                         clock=clock)
    assert [seen[s][0] for s in STAGES] == pytest.approx([1000 + 270, 1000 + 450, 1000 + 570])
    assert set(seen["measure"][1]) == {"write", "train"}  # on disk before the last stage began
    assert summary["finished"] and [summary["stages"][s]["status"] for s in STAGES] == ["done"] * 3
    assert json.loads((tmp_path / "summary.json").read_text()) == json.loads(json.dumps(summary))


def test_a_stage_that_raises_leaves_the_finished_stages_and_its_error_in_the_summary(tmp_path):
    def fail(context, deadline):
        context.partial = {"checkpoint": {"step": 40}}
        raise RuntimeError("out of memory")

    stages = {"write": lambda c, d: {"answer_tokens": 123}, "train": fail, "measure": lambda c, d: {}}
    run_stages(tmp_path, Plan(3), stages, Context(), log=lambda m: None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stages"]["write"] == {"status": "done", "seconds": summary["stages"]["write"]["seconds"],
                                          "answer_tokens": 123}
    assert summary["stages"]["train"]["status"] == "failed"
    assert summary["stages"]["train"]["error"] == "RuntimeError: out of memory"
    assert summary["stages"]["train"]["checkpoint"] == {"step": 40}  # what it had made before it failed
    assert summary["stages"]["measure"]["status"] == "not run"
    assert summary["finished"] is False


def test_sigterm_cuts_the_running_stage_short_and_the_summary_says_so(tmp_path):
    def killed(context, deadline):
        context.partial = {"checkpoint": {"step": 7}}
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("SIGTERM did not stop the stage")

    previous = signal.getsignal(signal.SIGTERM)
    try:
        stop_on_sigterm()
        run_stages(tmp_path, Plan(3), {"write": lambda c, d: {}, "train": killed}, Context(), log=lambda m: None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["stages"]["write"]["status"] == "done"
    assert summary["stages"]["train"] | {"seconds": 0} == {"status": "cut short", "reason": "SIGTERM",
                                                            "checkpoint": {"step": 7}, "seconds": 0}
    assert not summary["finished"]


def test_the_cap_removes_what_is_not_essential_largest_first(tmp_path):
    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "feature_head.safetensors").write_bytes(b"w" * 400)
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "log.txt").write_bytes(b"l" * 300)
    (tmp_path / "answers.json").write_bytes(b"a" * 900)
    assert keep_within_cap(tmp_path, cap=1000) == ["answers.json"]
    assert (tmp_path / "log.txt").exists() and directory_bytes(tmp_path) <= 1000
    assert keep_within_cap(tmp_path, cap=500) == ["log.txt"]
    with pytest.raises(ValueError, match="essentials"):
        keep_within_cap(tmp_path, cap=100)
    assert CutShort.__doc__ and CAP_BYTES == 50 * 2**20


@pytest.mark.slow
def test_the_cpu_rehearsal_runs_every_stage_and_leaves_the_head_its_card_its_curve_and_a_summary(tmp_path):
    """`--device cpu --tiny`: a tiny target built and saved on the spot, the corpus written with the
    batched writer, the head trained with the best recipe and measured on the held-out prompts and
    the suite; DIR under the cap, the corpus in the shards the trainer reads. The budget is the
    smallest that runs every stage to its end: 64 requests are written in seconds, training stops at
    its deadline, and measuring the 12 requests is given most of the 36 s."""
    from specdemo.engine.drafters.feature_head import FeatureHead
    from specdemo.training.corpus import Corpus
    from specdemo.training.eagle import read_sequences

    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "specdemo.training.at_scale", "--device", "cpu", "--tiny",
                           "--budget", "0.6", "--plan", "write=0.25,train=0.15,measure=0.55", "--prompts", "64",
                           "--out", str(out), "--work", str(work)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and [summary["stages"][s]["status"] for s in STAGES] == ["done"] * 3
    assert summary["stages"]["write"]["answer_tokens"] > 0
    assert summary["stages"]["train"]["steps"] > 0
    measured = summary["stages"]["measure"]["measured"]["head"]
    for name in ("heldout", "suite"):
        assert measured[name]["prompts"] == 6 and 0 <= measured[name]["acceptance"] <= 1
        assert measured[name]["tokens_per_round"] >= 1 and "heldout_agreement_step1" in measured[name]
    assert set(measured["suite"]["by_group"]) <= {"chat", "translation", "summarisation", "rag", "math", "code"}
    assert FeatureHead.load(out / "head").config.hidden_size == 64
    assert "feature head" in (out / "README.md").read_text()
    assert json.loads((out / "card.json").read_text())["hand_written"]["prompts"] == 6
    assert (out / "curve.csv").read_text().startswith("step,answer_tokens_seen")
    assert (out / "curve.html").is_file()
    assert summary["out_bytes"] <= CAP_BYTES and directory_bytes(out) <= CAP_BYTES
    assert read_sequences(Corpus(work / "corpus"))
