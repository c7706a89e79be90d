"""runtime="auto", the default of the API, the CLI and the page: the target on ONNX Runtime where it runs it
(the CPU, the packages installed, a target the builder exports), torch otherwise, with the reason; a Hub
target is exported from its snapshot in the Hub cache, as a local folder is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

import specdemo
from specdemo.engine.runtimes import onnx_export
from specdemo.engine.runtimes.onnx_export import resolve_runtime
from tests.tiny import write_model, write_seq2seq_model, write_seq2seq_tokenizer, write_tokenizer

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.runtime  # about the runtime: what auto gives, and the export it starts
MISSING = onnx_export.onnx_runtime_missing()
needs_runtime = pytest.mark.skipif(MISSING is not None, reason=str(MISSING))
VOCAB = 80  # not 64: a vocabulary as wide as a projection is one the builder would export wrongly


def exportable(folder: Path) -> Path:
    write_model(folder, seed=0, hidden=64, layers=1, vocab=VOCAB)
    write_tokenizer(folder, VOCAB)
    return folder


@needs_runtime
def test_auto_is_onnx_on_a_cpu_where_the_runtime_runs_the_target(tmp_path):
    choice = resolve_runtime("auto", "cpu", "float32", exportable(tmp_path / "m"))
    assert choice.runtime == "onnx" and choice.reason.startswith("the target on onnx (auto)")
    assert resolve_runtime("auto", "cpu", "int4").runtime == "onnx"  # the runtime's own int4


@pytest.mark.parametrize("device, precision, why", [
    ("cuda", "float32", "the device is 'cuda'"),
    ("cuda:0", "bfloat16", "the device is 'cuda:0'"),
    ("cpu", "bfloat16", "runs the target at float32, int8, int4, not bfloat16"),
])
def test_auto_is_torch_on_a_gpu_or_at_a_precision_the_runtime_does_not_run(device, precision, why):
    choice = resolve_runtime("auto", device, precision)
    assert choice.runtime == "torch" and choice.reason.startswith("the target on torch (auto): ") and why in choice.reason


def test_auto_is_torch_where_the_packages_are_missing(monkeypatch):
    monkeypatch.setattr(onnx_export, "onnx_runtime_missing", lambda: "runtime onnx needs the onnxruntime-genai package")
    choice = resolve_runtime("auto", "cpu", "float32")
    assert choice.runtime == "torch" and "needs the onnxruntime-genai package" in choice.reason


@needs_runtime
def test_auto_is_torch_for_a_model_the_builder_refuses_or_an_encoder_decoder(tmp_path):
    write_model(tmp_path / "wide", seed=0, hidden=64, layers=1, vocab=64)  # vocab as wide as a projection
    assert "as wide as one of its projections" in resolve_runtime("auto", "cpu", "float32", tmp_path / "wide").reason
    write_model(tmp_path / "narrow", seed=0, hidden=32, layers=1, vocab=VOCAB)  # heads 8 wide
    assert resolve_runtime("auto", "cpu", "float32", tmp_path / "narrow").runtime == "torch"
    write_seq2seq_model(tmp_path / "t5", "t5", seed=0)
    choice = resolve_runtime("auto", "cpu", "float32", tmp_path / "t5")
    assert choice.runtime == "torch" and "encoder-decoder" in choice.reason
    assert "is a .gguf file" in resolve_runtime("auto", "cpu", "float32", "'x.gguf' is a .gguf file").reason


def test_torch_and_onnx_asked_for_are_kept_and_anything_else_is_refused():
    assert resolve_runtime("torch", "cuda", "bfloat16") == onnx_export.RuntimeChoice("torch", "the target on torch, as asked")
    with pytest.raises(ValueError, match="on the CPU"):
        resolve_runtime("onnx", "cuda", "float32")
    with pytest.raises(ValueError, match="runtime: 'fast' is not one of auto, torch, onnx"):
        resolve_runtime("fast", "cpu", "float32")


def test_auto_on_an_encoder_decoder_pair_is_torch_with_the_reason(tmp_path):
    for side, seed in (("target", 0), ("draft", 1)):
        write_seq2seq_model(tmp_path / side, "t5", seed=seed)
        write_seq2seq_tokenizer(tmp_path / side)
    pair = specdemo.load_pair(str(tmp_path / "target"), str(tmp_path / "draft"), device="cpu", dtype="float32")
    assert pair.runtime == "torch"
    assert pair.runtime_reason.startswith("the target on torch (auto)") and "encoder-decoder" in pair.runtime_reason


HUB_SCRIPT = textwrap.dedent("""
    import json, sys
    import specdemo
    for runtime in sys.argv[1:]:
        pair = specdemo.load_pair("tiny-org/tiny-llama", device="cpu", dtype="float32", runtime=runtime)
        result = specdemo.generate(pair, [1, 5, 9, 14], method="ar", max_new_tokens=6, temperature=0.0)
        print(json.dumps({"runtime": result.runtime, "reason": pair.runtime_reason, "tokens": result.token_ids,
                          "folder": str(pair.target_runtime.folder) if pair.target_runtime else None}))
""")


@pytest.fixture(scope="module")
def hub_runs(tmp_path_factory):
    """A model laid out as the Hub cache lays it out (models--org--name/snapshots/<commit>, refs/main), loaded by
    its Hub id with HF_HUB_OFFLINE=1 in a child process, on auto and then on torch. The child exports the target
    from the snapshot folder into the module's export cache, where the other tests that load it find it: an
    export is a child process of its own and seconds of CPU, and what auto gives does not depend on it."""
    root = tmp_path_factory.mktemp("hub-target")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / "hub" / "models--tiny-org--tiny-llama"
    snapshot = exportable(repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(root / "home"), "HF_HUB_CACHE": str(root / "hub"),
           "SPECDEMO_CACHE": str(root / "cache"), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    runtimes = ("auto", "torch")
    done = subprocess.run([sys.executable, "-c", HUB_SCRIPT, *runtimes], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = dict(zip(runtimes, map(json.loads, done.stdout.strip().splitlines()[-len(runtimes):])))
    return SimpleNamespace(snapshot=snapshot, cache=root / "cache", outputs=outputs)


@needs_runtime
def test_a_hub_target_is_exported_from_its_snapshot_in_the_hub_cache_offline(hub_runs):
    """Read with HF_HUB_OFFLINE=1, a Hub id is the snapshot folder of the Hub cache: the target is exported
    from that folder and runs on the runtime."""
    outputs = hub_runs.outputs
    assert outputs["auto"]["runtime"] == "onnx fp32" and "(auto)" in outputs["auto"]["reason"]
    assert Path(outputs["auto"]["folder"]).name.startswith("tiny-org--tiny-llama-01234567-")
    assert onnx_export.is_exported(Path(outputs["auto"]["folder"]))
    assert Path(outputs["auto"]["folder"]).parent == hub_runs.cache / "onnx"
    assert outputs["torch"]["runtime"] == "torch"
    assert outputs["auto"]["tokens"] == outputs["torch"]["tokens"]  # the same weights, at float32


@needs_runtime
def test_load_pair_defaults_to_auto_and_says_which_runtime_and_why(hub_runs, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(hub_runs.cache))
    target = hub_runs.snapshot  # a local folder here, exported already by the hub run
    pair = specdemo.load_pair(str(target), device="cpu", dtype="float32")
    assert pair.runtime == "onnx" and pair.runtime_reason.startswith("the target on onnx (auto)")
    result = specdemo.generate(pair, [1, 5, 9, 14], method="ar", max_new_tokens=6, temperature=0.0)
    assert result.runtime == "onnx fp32" and result.runtime_reason == pair.runtime_reason
    write_model(tmp_path / "wide", seed=0, hidden=64, layers=1, vocab=64)
    write_tokenizer(tmp_path / "wide", 64)
    wide = specdemo.load_pair(str(tmp_path / "wide"), device="cpu", dtype="float32")
    assert wide.runtime == "torch" and wide.target_runtime is None and "projections" in wide.runtime_reason
    assert specdemo.load_pair(str(target), device="cpu", dtype="float32", runtime="torch").runtime == "torch"


def test_the_pair_cache_finds_the_pair_auto_loaded_under_the_runtime_it_gave():
    from specdemo.app.page import PairCache

    loads = []

    def loader(target, draft, device=None, dtype=None, **chosen):
        loads.append(chosen.get("runtime", "auto"))
        return SimpleNamespace(runtime=chosen.get("runtime", "onnx"), close=lambda: None)

    cache = PairCache(loader, warm_up=False, limit=2)
    auto = cache.get("t", None, runtime="auto")
    assert cache.get("t", None, runtime="onnx") is auto and cache.get("t", None) is auto
    torch_pair = cache.get("t", None, runtime="torch")
    assert torch_pair is not auto and loads == ["auto", "torch"]


def test_the_page_starts_by_preparing_the_fast_target_and_a_run_waits_for_it():
    from specdemo.app import handlers
    from specdemo.app.engine_controls import warming_status
    from specdemo.app.ui import fast_start
    from specdemo.engine.params import EngineOptions
    from specdemo.models.loading import PRESETS

    embedded = PRESETS["embedded"]
    assert fast_start("auto", "onnx", embedded) and fast_start("onnx", "torch", embedded)
    assert not fast_start("auto", "torch", embedded) and not fast_start("auto", "onnx", PRESETS["flan-t5-large"])
    status = warming_status("embedded", EngineOptions(), fast_target=True)
    assert "preparing the fast target, first time only" in status and "a Run pressed now waits for it" in status
    assert "never counted in tokens/s" in status
    assert "preparing the fast target, first time only" in handlers.runtime_loading_note("auto")


def test_the_cli_and_the_page_default_to_auto():
    import inspect

    from specdemo.app.ui import page_runtimes
    from specdemo.cli import build_parser

    for command in (["compare", "--prompt", "hi"], ["bench"]):
        assert build_parser().parse_args(command).runtime == "auto", command
    assert page_runtimes("cuda")[0] == "auto"
    assert inspect.signature(specdemo.load_pair).parameters["runtime"].default == "auto"
