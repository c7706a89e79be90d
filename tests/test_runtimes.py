"""specdemo.engine.runtimes: each runtime declares what it runs, and `Runtime.refusal` is the one rule
the API, the CLI and every tab ask, so each reason reads the same wherever it is met."""

import pytest

from specdemo.engine.methods import METHODS
from specdemo.engine.runtimes import AUTO, ONNX, REMEDY, RUNTIME_CHOICES, RUNTIMES, TORCH, runtime_named
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

    assert METHODS["beam"].unavailable(OnRuntime()) == \
        "method 'beam': " + runtime_named(ONNX).refusal(torch_loop="beam search")
    assert METHODS["ar-nocache"].torch_loop == "no KV cache" and METHODS["sd"].torch_loop is None
