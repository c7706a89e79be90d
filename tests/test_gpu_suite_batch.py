"""The GPU suite's batch stage, rehearsed on the CPU (`--device cpu --tiny`): AR, SD and EGAG at batch
sizes 1, 8 and 32 on the random-weight pair with the planted oracle, each size's throughput over AR's in
the summary, with the verdict and the CSVs. No timing thresholds."""

from __future__ import annotations

import pandas as pd
import pytest

from specdemo.bench.gpu_suite import STAGES, main
from specdemo.bench.gpu_suite.batch import BATCH_METHODS, BATCH_SIZES, batch_rows, batch_units
from specdemo.bench.gpu_suite.stages import Settings

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_batch_stage_is_planned_after_lossless_with_an_estimate_that_scales_with_its_work(tmp_path):
    names = [s.name for s in STAGES]
    assert names.index("batch") == names.index("lossless") + 1
    assert batch_rows(2) == 2 + 8 + 32 and batch_rows(33) == 33 + 40 + 64
    small = Settings(out=tmp_path, device="cpu", dtype="float32", tiny=True, max_new_tokens=8, repeats=1, prompts=1)
    [unit] = batch_units(small)
    assert unit.name == "pythia-tiny batch 1,8,32" and unit.cost.calibrated and unit.cost.total > 0
    [bigger] = batch_units(Settings(out=tmp_path, device="cpu", dtype="float32", tiny=True, max_new_tokens=8,
                                    repeats=3, prompts=1))
    assert bigger.cost.total == pytest.approx(unit.cost.total * 2)  # (3 + 1) calls against (1 + 1)


def test_the_cpu_rehearsal_of_the_batch_stage_writes_each_sizes_ratio_and_the_verdict(tmp_path):
    out = tmp_path / "gpu"
    assert main(["--device", "cpu", "--tiny", "--stages", "batch", "--out", str(out), "--threads", "1"]) == 0
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "| batch | ok" in summary
    assert "**batch-pythia-tiny** (eager+dynamic, forced acceptance 80%): Drafting" in summary
    batches = pd.read_csv(out / "batch-pythia-tiny.batch.csv")
    assert sorted(batches.batch.unique()) == list(BATCH_SIZES)
    assert set(batches.method) == set(BATCH_METHODS)
    assert batches[batches.method == "ar"].throughput_vs_ar.eq(1.0).all()
    assert batches.throughput_tokens_per_s.gt(0).all() and batches.errors.eq(0).all()
    rows = pd.read_csv(out / "batch-pythia-tiny.csv")
    assert rows.groupby("batch").size().to_dict() == {1: 3, 8: 3 * 8, 32: 3 * 32}
    # The planted text: every row of every batch writes what AR writes alone.
    drafting = rows[rows.method != "ar"]
    assert drafting.matches_ar.notna().all() and drafting.matches_ar.astype(bool).all()
