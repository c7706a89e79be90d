"""torch's threads per method: one count for every method, or auto (one thread for the methods
that write one token a step, every core for the drafting ones), in `bench` as on the page."""

from __future__ import annotations

import pytest
import torch

from specdemo.bench.measure import benchmark
from specdemo.bench.measure.benchmark import run_benchmark
from specdemo.bench.measure.threads import ThreadPlan, threads_text
from specdemo.cli import main as cli_main


def test_auto_gives_one_thread_to_what_writes_one_token_a_step_and_every_core_to_drafting():
    plan = ThreadPlan.parse("auto", cores=2)
    assert plan == ThreadPlan(count=None, cores=2)
    assert [plan.for_method(m) for m in ("ar", "hf-generate", "hf-generate-static")] == [1, 1, 1]
    assert [plan.for_method(m) for m in ("sd", "nasd", "egag", "hf-assisted", "hf-prompt-lookup")] == [2] * 5
    assert plan.default == 1  # work beside the per-method decodes: the page's suites
    assert plan.for_suites() == ThreadPlan(count=1) and ThreadPlan(count=2).for_suites() == ThreadPlan(count=2)
    assert ThreadPlan.parse("3").for_method("ar") == 3 and ThreadPlan.parse(1) == ThreadPlan(count=1)


@pytest.mark.parametrize("bad", [0, -1, "two", "", 1.5])
def test_a_plan_is_a_count_of_at_least_one_or_auto(bad):
    with pytest.raises(ValueError, match="threads must be an integer ≥ 1 or auto"):
        ThreadPlan.parse(bad)


def test_applying_a_plan_sets_the_count_for_one_decode_and_then_sets_it_back():
    before = torch.get_num_threads()
    with ThreadPlan(count=None, cores=2).applied("sd") as count:
        assert count == 2 and torch.get_num_threads() == 2
    assert torch.get_num_threads() == before


def test_a_report_says_which_methods_ran_on_which_count():
    assert threads_text(2) == "2 threads"
    assert threads_text({"ar": 1, "sd": 2, "hf-generate": 1}) == "1 thread: ar, hf-generate; 2 threads: sd"


def test_the_benchmark_decodes_each_method_on_its_planned_count_and_says_so(tiny_pair, monkeypatch):
    seen: dict[str, set[int]] = {}
    real = benchmark.run_ours

    def watched(pair, method, *args, **kwargs):
        seen.setdefault(method, set()).add(torch.get_num_threads())
        return real(pair, method, *args, **kwargs)

    monkeypatch.setattr(benchmark, "run_ours", watched)
    before = torch.get_num_threads()
    result = run_benchmark(tiny_pair, methods=["ar", "sd", "nasd"], repeats=1, categories="math", limit=1,
                           max_new_tokens=4, threads=ThreadPlan(count=None, cores=2))
    assert seen == {"ar": {1}, "sd": {2}, "nasd": {2}}  # the warm-up too
    assert dict(zip(result.rows.method, result.rows.threads)) == {"ar": 1, "sd": 2, "nasd": 2}
    assert result.meta["threads"] == {"ar": 1, "sd": 2, "nasd": 2}
    assert torch.get_num_threads() == before


def test_without_a_plan_every_run_has_the_process_count(tiny_pair):
    result = run_benchmark(tiny_pair, methods=["ar", "sd"], repeats=1, categories="math", limit=1, max_new_tokens=4,
                           warmup=False)
    assert (result.rows.threads == torch.get_num_threads()).all()
    assert result.meta["threads"] == torch.get_num_threads()


def test_bench_refuses_a_thread_count_it_cannot_use_before_loading_a_model(capsys):
    assert cli_main(["bench", "--target", "no/such-model", "--threads", "none"]) != 0
    assert "threads must be an integer ≥ 1 or auto" in capsys.readouterr().err
