"""The page compiles by default where CUDA serves a decoder-only pair, compiles at start before the
first timed Run, and can be told not to. CUDA is mocked; compiling is a stand-in that runs eagerly
and charges fake seconds to the clock, so what is timed where is visible without a GPU."""

from __future__ import annotations

import threading
import time
import weakref
from types import SimpleNamespace

import pytest
import torch

from specdemo.app import handlers, page, ui
from specdemo.app.engine_controls import (COMPILE_ENV, COMPILED, compile_setting,
                                          page_engine_defaults)
from specdemo.app.limits import Limits
from specdemo.app.playgroundtab import RunStreams, engine_values
from specdemo.engine.targets import lm
from specdemo.engine.methods import DEFAULT_METHODS
from specdemo.engine.params import EngineOptions
from specdemo.models.loading import Preset

EAGER = EngineOptions()
FAKE_COMPILE_S = 1e6  # what each new shape costs the fake compiler, on the clock every timing reads
PRESETS = {"tiny": Preset("tiny", "target", "draft", ""),
           "tiny-t5": Preset("tiny-t5", "t5-target", "t5-draft", "", encoder_decoder=True)}


def cuda_defaults(encoder_decoder: bool) -> EngineOptions:
    return page_engine_defaults("cuda", encoder_decoder)


@pytest.mark.parametrize("device, encoder_decoder, setting, zero_gpu, expected", [
    ("cuda", False, "auto", False, COMPILED),
    ("cpu", False, "auto", False, EAGER),
    ("cuda", True, "auto", False, EAGER),  # graph capture runs decoder-only models
    ("cuda", False, "off", False, EAGER),
    ("cuda", False, "auto", True, EAGER),  # ZeroGPU: a call's compiled steps die with its process
    ("cuda", False, "on", True, COMPILED),
    ("cpu", False, "on", False, COMPILED),
    ("cpu", True, "on", False, EAGER),
])
def test_the_page_default_is_static_and_compiled_only_where_cuda_serves_a_decoder_only_pair(
        device, encoder_decoder, setting, zero_gpu, expected):
    assert page_engine_defaults(device, encoder_decoder, setting, zero_gpu) == expected
    assert COMPILED == EngineOptions(cache="static", compile=True)


def test_the_compile_setting_comes_from_the_flag_then_the_environment(monkeypatch):
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    assert compile_setting() == "auto" and compile_setting("off") == "off"
    monkeypatch.setenv(COMPILE_ENV, "0")
    assert compile_setting() == "off" and compile_setting("on") == "on"
    monkeypatch.setenv(COMPILE_ENV, "sometimes")
    with pytest.raises(ValueError, match=f"compile must be one of auto, on, off .*{COMPILE_ENV}"):
        compile_setting()


def _engine_controls(demo) -> dict[str, object]:
    return {block.elem_id: block.value for block in demo.blocks.values()
            if getattr(block, "elem_id", None) in ("sd-cache", "sd-compile")}


@pytest.mark.parametrize("cuda, default, setting, expected", [
    (True, "tiny", None, {"sd-cache": "static", "sd-compile": True}),
    (False, "tiny", None, {"sd-cache": "auto", "sd-compile": False}),
    (True, "tiny-t5", None, {"sd-cache": "auto", "sd-compile": False}),
    (True, "tiny", "off", {"sd-cache": "auto", "sd-compile": False}),
])
def test_the_page_opens_with_the_engine_defaults_of_its_device_and_pair(monkeypatch, cuda, default, setting,
                                                                        expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    demo = ui.build_demo(pair_loader=lambda *a, **k: None, presets=PRESETS, default_preset=default, compile=setting)
    assert _engine_controls(demo) == expected


def test_the_environment_turns_the_page_default_off(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.setenv(COMPILE_ENV, "off")
    demo = ui.build_demo(pair_loader=lambda *a, **k: None, presets=PRESETS, default_preset="tiny")
    assert _engine_controls(demo) == {"sd-cache": "auto", "sd-compile": False}


def test_app_passes_its_compile_flag_and_refuses_a_bad_setting(monkeypatch):
    import app

    built = {}
    monkeypatch.setattr(ui, "build_demo", lambda **options: built.update(options) or "demo")
    monkeypatch.setattr(ui, "launch", lambda demo, **options: None)
    monkeypatch.setattr(ui, "serving_threads", lambda requested: ui.ThreadPlan(count=None))
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    app.main(["--compile", "off"])
    assert built["compile"] == "off"
    app.main([])
    assert built["compile"] == "auto"
    monkeypatch.setenv(COMPILE_ENV, "sometimes")
    with pytest.raises(SystemExit):
        app.main([])


def test_choosing_a_pair_sets_its_engine_defaults():
    ctx = SimpleNamespace(presets=PRESETS, engine_defaults=cuda_defaults)
    assert engine_values(ctx, "tiny") == ["static", True]
    assert engine_values(ctx, "tiny-t5") == ["auto", False]


def test_an_encoder_decoder_pair_typed_in_decodes_eagerly_and_the_status_says_so():
    request = handlers.make_request("w5", "tiny", "", "", {"cache": "static", "compile": True}, PRESETS)
    handlers.fit_engine(request, SimpleNamespace(is_encoder_decoder=True))
    assert request.engine == EngineOptions(cache="static") and "without compile" in request.note
    request = handlers.make_request("w5", "tiny", "", "", {"cache": "static", "compile": True}, PRESETS)
    handlers.fit_engine(request, SimpleNamespace(is_encoder_decoder=False))
    assert request.engine == COMPILED and request.note == ""


def test_the_warm_up_compiles_what_a_run_uses_on_the_thread_the_rounds_run_on(monkeypatch):
    ran = []
    monkeypatch.setattr(page, "generate", lambda pair, prompt, method, **params: ran.append(
        (pair.name, method, params["cache"], params["compile"], threading.get_ident())))
    decoder = page.decoding_thread().submit(threading.get_ident).result()
    pairs = {name: SimpleNamespace(name=name, draft=object(), draft_kind="lm", is_encoder_decoder=seq2seq,
                                   close=lambda: None) for name, seq2seq in (("target", False), ("t5-target", True))}
    cache = page.PairCache(lambda target, draft, **_: pairs[target], engine_defaults=cuda_defaults)
    cache.get("target", "draft")
    assert ran == [("target", name, "static", True, decoder) for name in DEFAULT_METHODS]
    ran.clear()
    cache.get("t5-target", "t5-draft")
    assert ran == [("t5-target", name, "auto", False, decoder) for name in DEFAULT_METHODS]


class FakeCompiler:
    """torch.compile's stand-in: the step runs eagerly, and each shape it has not seen (the fed ids and
    the cache's length, per compiled function) costs FAKE_COMPILE_S on the clock every timing reads."""

    def __init__(self, monkeypatch):
        self.shapes: set[tuple] = set()
        self.offset = 0.0
        real = time.perf_counter
        monkeypatch.setattr(time, "perf_counter", lambda: real() + self.offset)
        monkeypatch.setattr(torch, "compile", self.compile)
        # Steps and pooled caches start afresh, as in a new process.
        monkeypatch.setattr(lm, "_STEPS", weakref.WeakKeyDictionary())
        monkeypatch.setattr(lm, "_POOL", weakref.WeakKeyDictionary())

    def compile(self, forward, **options):
        def step(input_ids, cache):
            shape = (forward, tuple(input_ids.shape), cache.layers[0].max_cache_len)
            if shape not in self.shapes:
                self.shapes.add(shape)
                self.offset += FAKE_COMPILE_S
            return forward(input_ids, cache)
        return step


def _first_run(cache: page.PairCache) -> list:
    request = handlers.make_request("w5 w6 w7 w5 w6", "tiny", "", "",
                                    {"max_new_tokens": 12, "chat": False, "cache": "static", "compile": True},
                                    PRESETS, methods=list(DEFAULT_METHODS))
    updates = list(handlers.stream_run(request, lambda r: cache.get(r.target, r.draft), gpu=lambda fn: fn))
    assert updates[-1].results is not None, updates[-1].status
    return updates[-1].results


def test_the_page_compiles_at_start_so_the_first_run_compiles_nothing(tiny_pair, monkeypatch):
    compiler = FakeCompiler(monkeypatch)
    cache = page.PairCache(lambda target, draft, **_: tiny_pair, engine_defaults=cuda_defaults)
    ready = ui.preload_pair(cache, PRESETS["tiny"])
    assert ready.wait(120)
    compiled_at_start = set(compiler.shapes)
    assert compiled_at_start  # the warm-up compiled the steps
    results = _first_run(cache)
    assert compiler.shapes == compiled_at_start  # the first Run met every shape compiled already
    assert [r.method for r in results] == list(DEFAULT_METHODS)
    for result in results:
        assert result.compile_seconds < FAKE_COMPILE_S and result.seconds < FAKE_COMPILE_S, result.method
        assert result.stats["tokens_per_s"] == pytest.approx(len(result.tokens) / result.seconds)


def test_without_the_warm_up_the_first_run_compiles_but_never_counts_it_in_tokens_per_s(tiny_pair, monkeypatch):
    compiler = FakeCompiler(monkeypatch)
    cache = page.PairCache(lambda target, draft, **_: tiny_pair, warm_up=False)
    results = _first_run(cache)
    assert compiler.shapes and results[0].compile_seconds >= FAKE_COMPILE_S  # AR, first, compiled its step
    assert all(result.seconds < FAKE_COMPILE_S for result in results)


def test_a_run_pressed_during_the_warm_up_waits_for_it_and_says_so(tiny_pair, monkeypatch):
    release, events = threading.Event(), []

    def held_warm_up(pair, prompt, method, **params):
        release.wait(60)
        events.append("warm-up")

    monkeypatch.setattr(page, "generate", held_warm_up)
    cache = page.PairCache(lambda target, draft, **_: tiny_pair)
    ready = ui.preload_pair(cache, PRESETS["tiny"])

    def load(target, draft, **precisions):
        events.append("run loads")
        return cache.get(target, draft)

    ctx = page.TabContext(presets=PRESETS, default_preset="tiny", load=load, limits=Limits(), gpu=lambda fn: fn,
                          export=page.export_dir, ready=ready, warming="⏳ compiling the decode steps …")
    form = {"prompt": "w5 w6", "preset": "tiny", "target": "", "draft": "", "methods": ["ar"],
            "max_new_tokens": 4, "chat": False, "cache": "static", "compile": False}
    updates = RunStreams(ctx, None, None).updates(form)
    assert next(updates).status == ctx.warming and events == []
    release.set()
    last = list(updates)[-1]
    assert last.results and events == ["warm-up"] * len(DEFAULT_METHODS) + ["run loads"]


def test_waiting_for_a_page_that_is_ready_yields_nothing():
    ready = threading.Event()
    ready.set()
    assert list(handlers.wait_for_warm_up(ready, "warming")) == []
    assert list(handlers.wait_for_warm_up(None, "warming")) == []
