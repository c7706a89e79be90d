"""specdemo.engine.runtimes: each runtime declares what it runs, and `Runtime.refusal` is the one rule
the API, the CLI and every tab ask, so each reason reads the same wherever it is met."""

import pytest

from specdemo.engine.methods import METHODS
from specdemo.engine.runtimes import AUTO, ONNX, REMEDY, RUNTIME_CHOICES, RUNTIMES, TORCH, refusal, runtime_named
from specdemo.engine.runtimes.onnx_export import ONNX_PRECISIONS, check_runtime

pytestmark = pytest.mark.runtime


def test_torch_is_the_reference_and_refuses_nothing():
    torch_runtime = runtime_named(TORCH)
    assert torch_runtime.refusal(device="cuda:0", precision="bfloat16", trees=True, torch_loop="beam search",
                                 target_kv="streaming") is None


@pytest.mark.parametrize("asked, words", [
    ({"device": "cuda:0"}, "runs the target on the CPU, and the device is 'cuda:0'"),
    ({"precision": "bfloat16"}, "runs the target at float32, int8, int4, not bfloat16"),
    ({"trees": True}, "verifies a chain only"),
    ({"compile": True}, "graph capture is torch's"),
    ({"inner_layers": True}, "returns the last state only"),
    ({"torch_loop": "no KV cache"}, "torch's own loop over the target (no KV cache)"),
    ({"target_kv": "streaming"}, "keeps its own full cache, so target_kv=streaming cannot compress it"),
])
def test_the_onnx_runtime_says_what_it_cannot_run_and_what_to_choose(asked, words):
    reason = runtime_named(ONNX).refusal(**asked)
    assert words in reason and reason.endswith(REMEDY)


def test_what_the_onnx_runtime_runs_is_refused_nothing():
    assert runtime_named(ONNX).refusal(device="cpu", precision="int8", target_kv="full") is None


def test_an_unknown_runtime_names_the_ones_there_are():
    with pytest.raises(ValueError, match="runtime: 'tensorrt' is not one of auto, torch, onnx"):
        runtime_named("tensorrt")
    assert RUNTIMES == (TORCH, ONNX) and RUNTIME_CHOICES == (AUTO, TORCH, ONNX)


def test_loading_checks_through_the_same_rule():
    assert list(ONNX_PRECISIONS) == list(runtime_named(ONNX).precisions)
    with pytest.raises(ValueError) as error:
        check_runtime(ONNX, "cuda", "float32")
    assert str(error.value) == runtime_named(ONNX).refusal(device="cuda")


def test_a_method_running_torchs_own_loop_is_refused_by_the_rule():
    class OnRuntime:
        runtime, draft, draft_kind = ONNX, None, None

    assert refusal(OnRuntime(), "beam") == \
        "method 'beam': " + runtime_named(ONNX).refusal(torch_loop="beam search")
    assert METHODS["ar-nocache"].torch_loop == "no KV cache" and METHODS["sd"].torch_loop is None


# `refusal(pair, method, params, batch=, compile=)`: whether a method runs here, one sentence when it does not.
TREE_ON_ONNX = ("method 'sd-tree': the method drafts a tree, and the onnx runtime verifies a chain only (no tree "
                "attention mask): choose a chain method (sd, egag, nasd, rest, the adaptive stops), or " + REMEDY)
BATCH_ON_ONNX = ("method 'sd': a batch's rows accept different numbers of drafts, and the onnx runtime rewinds every "
                 "row of a batch together: give one prompt at a time, or " + REMEDY)


def _stand_in(runtime=TORCH, draft=True, draft_kind="model", encoder_decoder=False):
    from types import SimpleNamespace

    target = SimpleNamespace(config=SimpleNamespace(is_encoder_decoder=encoder_decoder))
    return SimpleNamespace(runtime=runtime, target_runtime=None if runtime == TORCH else object(), target=target,
                           draft=object() if draft else None, draft_kind=draft_kind if draft else None)


@pytest.mark.parametrize("pair, method, params, batch, compile, sentence", [
    (dict(), "sd", {}, 1, False, None),
    (dict(), "sd-tree", {}, 1, True, None),
    (dict(), "sd", {}, 4, False, None),
    (dict(runtime=ONNX), "sd", {}, 1, False, None),
    (dict(runtime=ONNX), "sd-tree", {}, 1, False, TREE_ON_ONNX),
    (dict(runtime=ONNX), "nasd", {"nasd_tree": True}, 1, False, "method 'nasd': the method drafts a tree, and the "
     "onnx runtime verifies a chain only"),
    (dict(runtime=ONNX), "beam", {}, 1, False, "method 'beam': the method runs torch's own loop over the target "
     "(beam search), not the onnx runtime's: " + REMEDY),
    (dict(runtime=ONNX), "ar", {}, 1, True, "method 'ar': graph capture is torch's, and the onnx runtime runs its "
     "own graph: turn compile off, or " + REMEDY),
    (dict(runtime=ONNX), "sd", {"target_kv": "streaming", "kv_budget": 16}, 1, False, "method 'sd': the onnx "
     "runtime keeps its own full cache, so target_kv=streaming cannot compress it: use full, or " + REMEDY),
    (dict(runtime=ONNX), "sd", {}, 2, False, BATCH_ON_ONNX),
    (dict(draft=False), "sd", {}, 1, False, "method 'sd' needs a draft model; load the pair with draft=... or pick "
     "ar or nasd"),
    (dict(draft=False), "nasd", {}, 1, False, None),
    (dict(), "osd", {}, 1, False, "method 'osd' adapts the pair's feature head while serving, and this pair "
     "drafts with a draft model"),
    (dict(draft_kind="feature-head"), "draft", {}, 1, False, "method 'draft' runs the pair's draft model alone, "
     "and this pair drafts with a feature head"),
    (dict(encoder_decoder=True), "ar", {}, 1, True, "compile: graph capture runs decoder-only models; this "
     "pair's target is an encoder-decoder model: turn compile off"),
    (dict(encoder_decoder=True), "sd-tree", {}, 1, False, "method 'sd-tree' drafts a tree, which runs on "
     "decoder-only pairs only"),
    (dict(encoder_decoder=True), "sd", {}, 2, False, "a batch runs decoder-only pairs; this pair is "
     "encoder-decoder: give one prompt at a time"),
    (dict(), "beam", {}, 2, False, "method 'beam' runs its own loop over one request; a batch runs the chain "
     "methods"),
    (dict(), "ar-nocache", {}, 2, False, "method 'ar-nocache' runs its own loop over one request"),
    (dict(), "sd", {"draft_kv": "streaming", "kv_budget": 16}, 2, False, "target_kv/draft_kv: a batch keeps full "
     "caches: use full, or one prompt at a time"),
    (dict(), "sd-tree", {}, 2, False, "method 'sd-tree' drafts a tree; a batch runs chain methods: pick sd, egag, "
     "nasd or rest (without nasd_tree or rest_tree), or one prompt"),
])
def test_refusal_says_whether_a_method_runs_here_in_one_sentence(pair, method, params, batch, compile, sentence):
    from specdemo.engine.params import DecodeParams
    from specdemo.engine.runtimes import refusal

    said = refusal(_stand_in(**pair), method, DecodeParams.from_values(**params), batch=batch, compile=compile)
    if sentence is None:
        assert said is None
    else:
        assert said is not None and said.startswith(sentence)


def test_what_the_runtime_refuses_and_torch_runs_is_the_torch_copys_reason():
    from specdemo.engine.params import DecodeParams
    from specdemo.engine.runtimes import refusal, runtime_reason

    onnx, torch_pair = _stand_in(runtime=ONNX), _stand_in()
    assert runtime_reason(onnx, "sd-tree", DecodeParams()) == runtime_named(ONNX).reason(trees=True)
    assert refusal(torch_pair, "sd-tree") is None  # so the torch copy runs it
    assert runtime_reason(onnx, "sd", DecodeParams()) is None
    assert runtime_reason(torch_pair, "sd-tree", DecodeParams()) is None
    assert "rewinds every row" in runtime_reason(onnx, "sd", DecodeParams(), batch=2)


def _on_onnx(pair):
    import dataclasses

    stand_in = type("RuntimeTarget", (), {"eos_ids": pair.eos_ids, "precision": "float32"})()
    return dataclasses.replace(pair, runtime=ONNX, target_runtime=stand_in)


def test_every_caller_says_the_rules_sentence(tiny_pair):
    from specdemo.bench.measure.runners import parse_bench_methods
    from specdemo.bench.sweep import run_sweep
    from specdemo.bench.sweep.grid import Setting
    from specdemo.engine.batch import generate_batch
    from specdemo.engine.decoding import generate
    from specdemo.engine.params import DecodeParams
    from specdemo.engine.runtimes import refusal

    on_onnx = _on_onnx(tiny_pair)
    with pytest.raises(ValueError) as loop:
        generate(on_onnx, [5, 9], "sd-tree", max_new_tokens=4)
    assert str(loop.value) == refusal(on_onnx, "sd-tree", DecodeParams()) == TREE_ON_ONNX
    with pytest.raises(ValueError) as batch:
        generate_batch(on_onnx, [[5, 9], [6, 7]], "sd", max_new_tokens=4)
    assert str(batch.value) == refusal(on_onnx, "sd", DecodeParams(), batch=2) == BATCH_ON_ONNX
    with pytest.raises(ValueError) as bench:
        parse_bench_methods("osd", tiny_pair)
    assert str(bench.value) == refusal(tiny_pair, "osd")
    with pytest.raises(ValueError) as sweep:
        run_sweep(tiny_pair, ["w5 w6"], [Setting("osd")], repeats=1, max_new_tokens=4, warmup=False)
    assert str(sweep.value) == "sweep: " + refusal(tiny_pair, "osd")
    with pytest.raises(ValueError) as batched_sweep:
        run_sweep(tiny_pair, ["w5 w6", "w7 w8"], [Setting("sd-tree")], repeats=1, batch=2, max_new_tokens=4,
                  warmup=False)
    assert str(batched_sweep.value).endswith(": " + refusal(tiny_pair, "sd-tree", DecodeParams(), batch=2))
