"""Sweeps and benchmarks fanned out over a Ray cluster (bench/measure/cluster.py): one local Ray with two CPUs
and two logical GPUs (so workers ask for a GPU each, as on a GPU cluster, and place the tiny pair on the
CPU), shared by the module's tests.

A cluster run must leave what the one-process run leaves, timings aside; a worker that dies mid-task is
replaced; a task that fails lands in the errors with its reason and the other rows stay; a bad address
fails before any model loads.
"""

from __future__ import annotations

import math
import types

import pandas as pd
import pytest
import torch

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'specdemo[cluster]')")

from specdemo.bench import SuitePrompt, run_benchmark  # noqa: E402
from specdemo.bench.measure.cluster import Cluster, PairWorker, worker_plan  # noqa: E402
from specdemo.bench.sweep import expand_grid, run_sweep  # noqa: E402
from specdemo.bench.sweep.summary import verdict as sweep_verdict  # noqa: E402
from specdemo.models.spec import PairSpec  # noqa: E402

PROMPTS = ["w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "w11 w12 w13 w14", "w20 w21 w22 w20 w21", "w30 w31 w32 w33 w34"]
SUITE = [SuitePrompt(f"prompt-{i + 1}", "prompt", text) for i, text in enumerate(PROMPTS)]
SETTINGS = expand_grid(gamma=[1, 3], gamma_max=[4], ema=[0, 0.9], methods="sd,egag")  # AR, 2 γ, 2 EMA
DECODE = dict(max_new_tokens=8)
# What a run's clock says: everything else must be equal between a cluster run and the local one.
SWEEP_TIMINGS = ("tokens_per_s", "speedup_vs_ar", "cost_ratio", "predicted_speedup", "seconds", "draft_seconds",
                 "verify_seconds", "ttft_s", "batch_seconds")


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, object_store_memory=80 * 2**20, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def spec(tiny_pair):
    """The tiny pair as each worker loads it: its folders and precision, no device (the worker's choice)."""
    return PairSpec(tiny_pair.target_ref, tiny_pair.draft_ref, dtype="float64")


@pytest.fixture(scope="module")
def local(tiny_pair):
    return run_sweep(tiny_pair, PROMPTS, SETTINGS, repeats=2, warmup=False, **DECODE)


def _kill_one_worker(ticks: list):
    """A progress callback that kills a worker after the first task ends; every worker holds a task then
    (the one that finished was handed the next before the bar moved)."""
    def progress(done, total, message):
        ticks.append((done, total, message))
        if done == 1:
            names = [n for n in ray.util.list_named_actors() if n.startswith("specdemo-worker-")]
            ray.kill(ray.get_actor(sorted(names)[0]))
    return progress


@pytest.fixture(scope="module")
def on_cluster(ray_session, spec):
    """The local sweep's grid on two workers, one prompt a task, one worker killed after the first task."""
    ticks = []
    result = run_sweep(spec, PROMPTS, SETTINGS, repeats=2, warmup=False, cluster=Cluster("ray", prompts_per_task=1),
                       progress=_kill_one_worker(ticks), **DECODE)
    return result, ticks


@pytest.fixture(scope="module")
def with_failures(ray_session, spec):
    """On one worker, not retried (retries=0): a first task whose prompt is too long for the target (it
    raises), then the worker killed as it holds the next (handed to it before the bar moved), and the
    tasks left on the worker that replaces it. With one worker the task that raises ends first: with
    two, the kill could land on it before it had raised."""
    too_long = " ".join(["w9"] * 600)  # more positions than the tiny target has
    return run_sweep(spec, [too_long, PROMPTS[0], PROMPTS[1], PROMPTS[2]], SETTINGS[:2], repeats=1, warmup=False,
                     cluster=Cluster("ray", workers=1, prompts_per_task=1, retries=0),
                     progress=_kill_one_worker([]), **DECODE)


def _untimed(frame: pd.DataFrame) -> pd.DataFrame:
    kept = [c for c in frame.columns if not c.removesuffix("_std") in SWEEP_TIMINGS and c not in ("node", "device")]
    return frame[kept].reset_index(drop=True)


def test_workers_ask_for_a_gpu_each_where_the_cluster_has_gpus_else_cpus(spec):
    assert worker_plan({"CPU": 2, "GPU": 2}, spec, Cluster()) == (2, {"num_gpus": 1, "num_cpus": 1})
    assert worker_plan({"CPU": 8}, spec, Cluster(cpus_per_worker=2)) == (4, {"num_cpus": 2})
    # A pair pinned to the CPU leaves the GPUs alone.
    assert worker_plan({"CPU": 2, "GPU": 2}, PairSpec("x", device="cpu"), Cluster())[1] == {"num_cpus": 1}
    with pytest.raises(ValueError, match=r"room for 2 worker\(s\) \(2 GPUs"):
        worker_plan({"CPU": 2, "GPU": 2}, spec, Cluster(workers=3))


def test_a_cluster_sweep_leaves_the_local_summary_timings_aside(local, on_cluster):
    result, _ = on_cluster
    assert len(SETTINGS) == 1 + 2 + 2 and not result.stopped and result.errors.empty
    pd.testing.assert_frame_equal(_untimed(result.summary), _untimed(local.summary))
    # The rows themselves: tokens, acceptance, matches_ar, seeds and the interleaving's order.
    pd.testing.assert_frame_equal(_untimed(result.rows), _untimed(local.rows))
    assert result.rows.matches_ar.dropna().all() and result.summary.errors.eq(0).all()
    # The drafted tokens (p, q, accepted, entropy) the verdict's entropy clause reads.
    pd.testing.assert_frame_equal(result.tokens.reset_index(drop=True), local.tokens.reset_index(drop=True))
    # The verdict names the fastest setting, which timings decide: the cluster's is read from its own summary
    # and tokens by the local run's rule.
    assert result.verdict.startswith(sweep_verdict(result.summary, result.tokens))


def test_each_row_names_its_node_and_device_and_the_bar_counts_tasks(on_cluster):
    result, ticks = on_cluster
    assert result.rows.node.map(bool).all() and result.rows.device.str.startswith("CPU").all()
    assert [done for done, _, _ in ticks] == [1, 2, 3, 4] and {total for _, total, _ in ticks} == {4}
    node = result.rows.node.iloc[0]  # one machine here
    assert all(message.startswith(f"{node}: prompt-") for _, _, message in ticks)  # the node of the task that finished
    cluster = result.meta["cluster"]
    assert cluster["workers"] == 2 and cluster["worker_resources"] == {"num_gpus": 1, "num_cpus": 1}
    assert cluster["tasks"] == cluster["finished_tasks"] == 4 and result.meta["nodes"] == node


def test_a_worker_killed_mid_task_is_replaced_and_the_table_is_complete(on_cluster):
    result, ticks = on_cluster
    assert result.meta["cluster"]["replaced_workers"] == 1 and result.errors.empty
    assert len(result.rows) == len(PROMPTS) * 2 * len(SETTINGS)  # and equal to the local run's (above)


def test_failed_tasks_land_in_errors_with_their_reasons_and_the_other_rows_stay(with_failures):
    result = with_failures
    errors = result.errors.set_index("prompt_ids")
    assert "prompt-1" in errors.index and len(errors) == 2
    raised = errors.loc["prompt-1"]
    assert raised.attempts == 1 and raised.reason.startswith("ValueError: prompt 'prompt-1'")  # not retried
    died = errors.drop(index="prompt-1").iloc[0]
    assert died.attempts == 1 and died.runs == 1 and "its worker died 1 time(s)" in died.reason
    assert result.meta["cluster"]["replaced_workers"] == 1  # for the tasks left
    kept = {"prompt-2", "prompt-3", "prompt-4"} - {errors.index[errors.index != "prompt-1"][0]}
    assert set(result.rows.prompt_id) == kept and len(result.rows) == 2 * len(kept)
    assert result.summary.errors.eq(2).all() and result.summary.runs.eq(len(kept)).all()
    assert set(result.rows.prompt_index) == {int(p.split("-")[1]) - 1 for p in kept}  # their places in the whole


def test_an_interrupted_driver_keeps_what_finished(ray_session, spec):
    def interrupt(done, total, message):
        raise KeyboardInterrupt

    result = run_sweep(spec, PROMPTS, SETTINGS[:2], repeats=1, warmup=False,
                       cluster=Cluster("ray", workers=1, prompts_per_task=1), progress=interrupt, **DECODE)
    assert result.stopped and result.meta["cluster"]["finished_tasks"] == 1
    assert len(result.rows) == 2 and result.summary.runs.tolist() == [1, 1]


def test_a_bad_address_fails_clearly_before_any_model_loads(ray_session, spec, monkeypatch):
    def no_loading(self):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(PairSpec, "load", no_loading)
    with pytest.raises(ConnectionError, match=r"no Ray cluster answers at ray://127\.0\.0\.1:1 "):
        run_sweep(spec, PROMPTS, SETTINGS, cluster="ray://127.0.0.1:1", **DECODE)
    with pytest.raises(ValueError, match=r"cluster address 'ray://nowhere' is not ray://HOST:PORT"):
        run_sweep(spec, PROMPTS, SETTINGS, cluster="ray://nowhere", **DECODE)
    with pytest.raises(ValueError, match=r"cluster must be ray or ray://HOST:PORT, got 'yarn'"):
        run_benchmark(spec, SUITE, "ar", cluster="yarn", **DECODE)


def test_a_worker_loads_its_pair_once_and_a_failed_load_fails_every_task(ray_session):
    loads = []

    class Counted(PairSpec):
        def load(self):
            loads.append(self.device)
            return types.SimpleNamespace(device=torch.device("cpu"))

    class Echo:
        label = "echo"

        def run(self, pair, kept):
            kept["runs"] = kept.get("runs", 0) + 1
            return kept["runs"]

    worker = PairWorker(Counted("some-model"))
    ran = [worker.run(Echo()) for _ in range(3)]
    assert [value for value, _ in ran] == [1, 2, 3] and loads == ["cpu"]  # no GPU given: the CPU
    assert ran[0][1]["device"].startswith("CPU") and ran[0][1]["node"]
    broken = PairWorker(PairSpec("/no/such/model"))
    with pytest.raises(Exception, match="/no/such/model") as first:
        broken.run(Echo())
    with pytest.raises(Exception) as second:
        broken.run(Echo())
    assert second.value is first.value  # not loaded again


def test_a_cluster_benchmark_leaves_the_local_rows_and_summary_timings_aside(ray_session, tiny_pair, spec):
    kwargs = dict(repeats=1, warmup=False, vs_float32=None, **DECODE)
    local = run_benchmark(tiny_pair, SUITE[:3], "ar,sd,egag", **kwargs)
    # One worker is enough to show a cluster's rows equal the local ones (the sweep's tests above run two, and
    # replace one): each worker starts its own Python, imports torch and loads the pair.
    result = run_benchmark(spec, SUITE[:3], "ar,sd,egag", cluster=Cluster(prompts_per_task=2, workers=1), **kwargs)
    untimed = ["repeat", "prompt_index", "prompt_id", "method", "order", "seed", "new_tokens", "drafted", "accepted",
               "rounds", "matches_ar", "output_ids", "error"]
    pd.testing.assert_frame_equal(result.rows[untimed], local.rows[untimed])
    same = ["category", "method", "runs", "errors", "new_tokens_mean", "acceptance_rate", "alpha",
            "mean_accepted_tokens", "exact_match_pct"]
    pd.testing.assert_frame_equal(result.summary[same], local.summary[same])
    pd.testing.assert_frame_equal(result.rounds.sort_values(list(result.rounds.columns), ignore_index=True),
                                  local.rounds.sort_values(list(local.rounds.columns), ignore_index=True),
                                  check_dtype=False)
    assert result.rows.device.str.startswith("CPU").all() and result.meta["cluster"]["tasks"] == 2
    assert not math.isnan(result.summary.tokens_per_s_mean.iloc[0])


def _model_args(pair) -> list[str]:
    return ["--target", pair.target_ref, "--draft", pair.draft_ref, "--dtype", "float64"]


def test_the_sweep_command_writes_the_local_files_from_a_cluster(ray_session, tiny_pair, tmp_path, capsys):
    from specdemo import cli
    from specdemo.bench import sweep

    csv, report = tmp_path / "sweep.csv", tmp_path / "sweep.html"
    code = cli.main(["sweep", *_model_args(tiny_pair), "--gamma", "1,3", "--gamma-max", "4", "--ema", "0,0.9",
                     "--max-new-tokens", "6", "--repeats", "1", "--limit", "1", "--no-warmup", "--cluster", "ray",
                     "--workers", "1", "--csv", str(csv), "--report", str(report), "--plotlyjs", "cdn", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows, summary = pd.read_csv(csv), pd.read_csv(tmp_path / "sweep.summary.csv")
    assert list(rows.columns) == sweep.ROW_COLUMNS and list(summary.columns) == sweep.SUMMARY_COLUMNS
    assert len(summary) == 5 and rows.device.str.startswith("CPU").all() and rows.node.notna().all()
    assert "EGAG (γ_max 4" in out and "Speculative decoding sweep" in report.read_text(encoding="utf-8")


@pytest.mark.parametrize("flags, message", [
    (["--cluster", "yarn"], "cluster must be ray or ray://HOST:PORT, got 'yarn'"),
    (["--cluster", "ray://127.0.0.1:1"], "no Ray cluster answers at ray://127.0.0.1:1"),
    (["--workers", "2"], "--workers applies to --cluster runs only"),
    (["--cluster", "ray", "--retries", "-1"], "cluster retries must be an integer ≥ 0, got -1"),
    (["--cluster", "ray", "--tree-cost", "4"], "--tree-cost measure(s) the pair loaded on this machine"),
])
def test_bad_cluster_flags_fail_before_any_model_loads(tiny_pair, flags, message, monkeypatch, capsys):
    from specdemo import cli

    monkeypatch.setattr(PairSpec, "load", lambda self: pytest.fail("a model loaded"))
    assert cli.main(["bench", *_model_args(tiny_pair), "--no-warmup", *flags]) == 2
    assert message in capsys.readouterr().err
