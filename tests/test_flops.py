"""Forwards and FLOPs per token, counted by the decode loop: the model wrappers it runs count the
tokens each forward feeds and the logit rows it computes, so the figures are the same on the torch
target and on ONNX Runtime (the default on a CPU), and every surface reads them from the trace.

A tiny random Llama goes through the runtime's export once for the module, as in test_onnx_lm.py.
"""

from __future__ import annotations

import math

import pytest

import specdemo
from specdemo.bench.sweep import expand_grid, matmul_parameters, run_sweep
from specdemo.engine.runtimes.onnx_export import onnx_runtime_missing
from tests.tiny import write_model, write_tokenizer

pytestmark = [pytest.mark.runtime,
              pytest.mark.skipif(onnx_runtime_missing() is not None, reason=str(onnx_runtime_missing()))]

VOCAB = 80  # as test_onnx_lm.py: not a projection's width, which the export refuses
PROMPTS = ["w5 w9 w14 w5 w9 w14 w5", "w30 w31 w32 w33 w40 w41"]
FIGURES = ["target_forwards", "draft_forwards", "target_forwards_per_token", "draft_forwards_per_token",
           "target_flops_per_token", "draft_flops_per_token"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("flops")
    target, draft = root / "target", root / "draft"
    write_model(target, seed=0, hidden=64, layers=2, vocab=VOCAB)
    write_tokenizer(target, VOCAB)
    write_model(draft, seed=1, hidden=64, layers=2, vocab=VOCAB, like=target, noise=0.5)
    write_tokenizer(draft, VOCAB)
    with pytest.MonkeyPatch.context() as patch:  # the export lands beside the models, for this module only
        patch.setenv("SPECDEMO_CACHE", str(root / "cache"))
        yield target, draft


@pytest.fixture(scope="module")
def onnx_pair(folders):
    pair = specdemo.load_pair(str(folders[0]), str(folders[1]), device="cpu", dtype="float32", runtime="onnx")
    assert pair.target_runtime is not None
    return pair


@pytest.fixture(scope="module")
def torch_pair(folders):
    return specdemo.load_pair(str(folders[0]), str(folders[1]), device="cpu", dtype="float32", runtime="torch")


def test_a_sweep_on_the_runtime_counts_every_models_forwards_and_flops(onnx_pair):
    result = run_sweep(onnx_pair, PROMPTS, expand_grid(gamma=[2], gamma_max=[4], ema=[0.9], methods="sd,egag"),
                       repeats=1, warmup=False, max_new_tokens=12, temperature=0.0)
    rows = result.rows
    assert rows.runtime.str.startswith("onnx").all()
    ar, drafting = rows[rows.method == "ar"], rows[rows.method.isin(["sd", "egag"])]
    assert (ar.target_forwards_per_token == 1.0).all() and (ar.draft_forwards_per_token == 0).all()
    body, head = matmul_parameters(onnx_pair.target)  # the torch weights the pair keeps beside the runtime
    assert ar.target_flops_per_token.tolist() == pytest.approx([2.0 * (body + head)] * len(ar))
    assert (ar.draft_flops_per_token == 0).all()
    assert (drafting.draft_forwards_per_token > 0).all() and (drafting.draft_flops_per_token > 0).all()
    assert drafting.predicted_speedup.map(math.isfinite).all()
    summary = result.summary.set_index("method")
    assert summary.loc["ar", "target_forwards_per_token"] == 1.0
    assert (summary.loc[["sd", "egag"], "draft_flops_per_token"] > 0).all()


def test_a_benchmark_on_the_runtime_reads_the_same_figures_from_the_trace(onnx_pair):
    from specdemo.bench import run_benchmark
    from specdemo.bench.suite import SuitePrompt

    result = run_benchmark(onnx_pair, [SuitePrompt("p", "chat", PROMPTS[0])], ["ar", "sd"], repeats=1,
                           warmup=False, max_new_tokens=12, temperature=0.0, chat=False)
    rows = result.rows.set_index("method")
    assert rows.loc["ar", "target_forwards_per_token"] == 1.0
    assert rows.loc["sd", "draft_forwards_per_token"] > 0 and rows.loc["sd", "draft_flops_per_token"] > 0
    summary = result.summary[result.summary.category == "all"].set_index("method")
    assert math.isfinite(summary.loc["sd", "predicted_speedup"])


@pytest.mark.parametrize("method", ["ar", "sd", "egag", "nasd"])
def test_the_same_greedy_run_counts_alike_on_torch_and_on_the_runtime(onnx_pair, torch_pair, method):
    on_runtime = specdemo.generate(onnx_pair, PROMPTS[1], method=method, max_new_tokens=16, temperature=0.0,
                                   seed=0, gamma=3)
    on_torch = specdemo.generate(torch_pair, PROMPTS[1], method=method, max_new_tokens=16, temperature=0.0,
                                 seed=0, gamma=3)
    assert on_runtime.runtime.startswith("onnx") and on_torch.runtime == "torch"
    assert on_runtime.token_ids == on_torch.token_ids  # the same tokens, so the same counts
    assert on_runtime.fed == on_torch.fed and on_runtime.parameters == on_torch.parameters
    ran, reference = on_runtime.stats, on_torch.stats
    assert [ran[name] for name in FIGURES] == [reference[name] for name in FIGURES]


def test_decodings_flops_are_twice_the_parameters_times_what_each_model_was_fed(torch_pair):
    result = specdemo.generate(torch_pair, PROMPTS[0], method="sd", max_new_tokens=16, temperature=0.0, seed=0,
                               gamma=3, copy_n=0)
    target, draft = result.fed["target"], result.fed["draft"]
    # The target: one forward a round, fed its drafts and the token before them, a logit row for each.
    assert target.forwards == len(result.rounds) == result.target_forwards
    assert target.tokens == target.logit_rows == sum(len(r.drafted) + 1 for r in result.rounds)
    (body, head), new = matmul_parameters(torch_pair.target), len(result.tokens)
    assert result.stats["target_flops_per_token"] == pytest.approx(2.0 * (body + head) * target.tokens / new)
    # The draft: its prefill is left out; each forward after it asks for one row of logits.
    assert draft.forwards == result.draft_forwards - 1 and draft.logit_rows == draft.forwards
    draft_body, draft_head = matmul_parameters(torch_pair.draft)
    assert result.stats["draft_flops_per_token"] == pytest.approx(
        2.0 * (draft_body * draft.tokens + draft_head * draft.logit_rows) / new)
