"""The page's handlers driven as plain generators on the tiny pair: no server, no browser."""

from __future__ import annotations

import gc
import inspect
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from specdemo.app import forms, handlers, viz
from specdemo.app.handlers import Request, RunUpdate, make_request
from specdemo.app.limits import Limits
from specdemo.bench.measure.threads import ThreadPlan
from specdemo.bench.measure.tables import TOKEN_COLUMNS
from specdemo.engine.params import PARAMS, SCHEMA, DecodeParams
from specdemo.models.loading import Preset
from tests.tiny import byte_level_tokenizer

PROMPT = "w3 w4 w5 w6 w7 w3 w4 w5"
PRESETS = {"tiny": Preset("tiny", "target-folder", "draft-folder", "")}


def request(methods, **params) -> Request:
    return make_request(PROMPT, "tiny", "", "", {"max_new_tokens": 12, "chat": False, **params}, PRESETS,
                        methods=methods)


def test_make_request_validates_once_and_keeps_the_params():
    req = request(["sd", "ar"], gamma=3, temperature="0.5")
    assert isinstance(req.params, DecodeParams)
    assert (req.params.gamma, req.params.temperature, req.params.max_new_tokens) == (3, 0.5, 12)
    assert (req.target, req.draft, req.methods) == ("target-folder", "draft-folder", ["sd", "ar"])
    with pytest.raises(ValueError, match="gamma must be an integer from 1 to 64"):
        request(["ar"], gamma=0)
    with pytest.raises(ValueError, match="choose at least one"):
        request([])
    with pytest.raises(ValueError, match="prompt is empty"):
        make_request("  ", "tiny", "", "", {}, PRESETS)
    with pytest.raises(ValueError, match="max_new_tokens must be at most 8"):
        make_request(PROMPT, "tiny", "", "", {"max_new_tokens": 9}, PRESETS, Limits(max_new_tokens=8))


def test_stream_run_yields_loading_each_method_and_the_final_comparison(tiny_pair):
    loaded = []

    def load(req):
        loaded.append((req.target, req.draft))
        return tiny_pair

    updates = list(handlers.stream_run(request(["egag", "ar", "sd"]), load))
    assert all(isinstance(u, RunUpdate) for u in updates)
    first, last = updates[0], updates[-1]
    assert loaded == [("target-folder", "draft-folder")]
    # Until the last method ends only the status line changes: the last run's page stays, said to be redrawn.
    assert first.status.startswith("Loading **target-folder** + **draft-folder**")
    assert first.status.endswith(handlers.STALE_NOTE)
    for update in updates[:-1]:
        assert (update.shown, update.panels, update.figures, update.table, update.files, update.charts_shown) == (
            None, {}, None, None, None, None)
    assert updates[1].status == "**AR** (1/3): decoding …"
    # The status line carries each finished method's speed into the next one's.
    sd_starts = [u.status for u in updates if u.status.endswith("(2/3): decoding …")]
    assert len(sd_starts) == 1 and re.fullmatch(r"AR ✓ [\d.]+ tok/s · \*\*SD\*\* \(2/3\): decoding …", sd_starts[0])
    # Then, in one update, every slot in the page's order (AR first), the table and the files.
    assert last.shown == 3 and sorted(last.panels) == [0, 1, 2]
    assert ['data-method="ar"' in last.panels[0], 'data-method="sd"' in last.panels[1],
            'data-method="egag"' in last.panels[2]] == [True, True, True]
    assert len(last.table) == 3
    assert [r.method for r in last.results] == ["ar", "sd", "egag"]
    summary_csv, rounds_csv, tokens_csv = last.files
    summary = pd.read_csv(summary_csv)
    assert list(summary.method) == ["ar", "sd", "egag"]
    assert summary.loc[summary.method != "ar", "matches_ar"].all()  # greedy: lossless
    assert (summary.threads == torch.get_num_threads()).all()
    assert last.status.startswith("Done in") and len(pd.read_csv(rounds_csv))
    assert f"{torch.get_num_threads()} torch thread" in last.status
    # One row per drafted token: as many as the methods drafted, with the trace's columns.
    tokens = pd.read_csv(tokens_csv)
    assert list(tokens.columns) == TOKEN_COLUMNS
    assert len(tokens) == sum(len(r.drafted) for result in last.results for r in result.rounds)


def test_while_a_method_decodes_the_page_gets_a_status_line_and_nothing_else(tiny_pair):
    # Every round's status is let through here (interval 0); the page's own interval is a second.
    updates = list(handlers.decode_methods(tiny_pair, request(["ar", "sd", "sd-tree"], max_new_tokens=24),
                                           status_interval_s=0))
    *during, last = updates
    round_updates = [u for u in during if u.status and ": round " in u.status]
    assert len(round_updates) >= 10
    for update in round_updates:
        assert (update.panels, update.figures, update.table, update.files, update.charts_shown) == ({}, None, None,
                                                                                                    None, None)
    # No figure is sent before every method has ended; then all of them, once, and the sections shown.
    assert all(u.figures is None for u in during)
    assert set(last.figures) == set(handlers.charts.CHART_NAMES)
    assert last.charts_shown is True and last.trees_shown is True  # SD-tree drafted trees
    assert handlers.STATUS_INTERVAL_S >= 0.5


def test_the_tree_charts_stay_hidden_without_a_tree_method_and_are_neither_built_nor_sent(tiny_pair):
    last = list(handlers.decode_methods(tiny_pair, request(["ar", "sd"])))[-1]
    assert last.charts_shown is True and last.trees_shown is False
    assert set(last.figures) == set(viz.FIGURES)


def test_closing_the_stream_ends_the_method_in_flight(tiny_pair):
    stream = handlers.decode_methods(tiny_pair, request(["ar", "sd"], max_new_tokens=64), status_interval_s=0)
    seen = [next(stream) for _ in range(4)]  # AR starts, then its first rounds
    assert seen[-1].status.startswith("**AR** (1/2): round")
    assert not gc.isenabled()  # mid-decode
    stream.close()
    assert list(stream) == [] and gc.isenabled()


def test_a_method_decodes_with_the_collector_paused_as_the_benchmark_times_it(tiny_pair):
    enabled_during_rounds, enabled_between = [], []
    for update in handlers.decode_methods(tiny_pair, request(["ar", "sd"], max_new_tokens=24), status_interval_s=0):
        if update.status and ": round " in update.status:
            enabled_during_rounds.append(gc.isenabled())
        elif update.status and update.status.endswith("decoding …"):
            enabled_between.append(gc.isenabled())  # announced, not started
    assert enabled_during_rounds and not any(enabled_during_rounds)
    assert enabled_between == [True, True] and gc.isenabled()


def test_each_method_decodes_on_its_planned_threads_whichever_thread_resumes_the_stream(tiny_pair):
    """torch's thread count belongs to the thread that set it, and a server resumes a stream on any
    of its workers: every round must still run on the plan's count."""
    seen: dict[str, set[int]] = {}
    current = ["none"]
    hook = tiny_pair.target.register_forward_hook(lambda *_: seen.setdefault(current[0], set()).add(torch.get_num_threads()))
    stream = handlers.decode_methods(tiny_pair, request(["ar", "sd"], max_new_tokens=24), status_interval_s=0,
                                     threads=ThreadPlan(count=None, cores=2))
    before = torch.get_num_threads()

    def step_on_a_fresh_worker():
        def step():
            torch.set_num_threads(3)  # what this worker was last set to, by some other work
            return next(stream, None)

        with ThreadPoolExecutor(1) as worker:
            return worker.submit(step).result()

    try:
        while (update := step_on_a_fresh_worker()) is not None:
            if update.status and "**SD**" in update.status.split("·")[-1]:
                current[0] = "sd"
            elif update.status and "**AR**" in update.status:
                current[0] = "ar"
    finally:
        hook.remove()
        torch.set_num_threads(before)
    assert seen == {"ar": {1}, "sd": {2}}


def test_every_round_of_every_run_decodes_on_one_long_lived_thread_whichever_worker_resumes_the_stream(tiny_pair):
    """torch's OpenMP threads belong to the thread that starts them, and a server's workers come and
    go: rounds that moved to a new worker ran on a new team of threads, slower for seconds."""
    forwards_on: set[int] = set()
    hook = tiny_pair.target.register_forward_hook(lambda *_: forwards_on.add(threading.get_ident()))
    workers: set[int] = set()  # (a new thread may take an ended one's identity)
    steps = [0]

    def run_on_fresh_workers() -> None:
        stream = handlers.decode_methods(tiny_pair, request(["ar", "sd"], max_new_tokens=12), status_interval_s=0)

        def step():
            workers.add(threading.get_ident())
            steps[0] += 1
            return next(stream, None)

        while True:
            with ThreadPoolExecutor(1) as worker:  # a worker of its own for every step, as after a pause
                if worker.submit(step).result() is None:
                    return

    try:
        run_on_fresh_workers()
        run_on_fresh_workers()
    finally:
        hook.remove()
    assert steps[0] > 4 and len(forwards_on) == 1
    assert forwards_on == {handlers.decoding_thread().submit(threading.get_ident).result()}
    assert not forwards_on & workers


def test_without_a_plan_rounds_decode_on_the_thread_count_of_whoever_asks_for_them():
    def counts():
        while True:
            yield torch.get_num_threads()

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert next(handlers.rounds_on_threads(counts(), threads=None)) == 3
        assert next(handlers.rounds_on_threads(counts(), threads=2)) == 2
    finally:
        torch.set_num_threads(before)


def test_a_failure_inside_a_round_reaches_the_stream_that_asked_for_it():
    def rounds():
        yield "first round"
        raise RuntimeError("out of memory")

    stream = handlers.rounds_on_threads(rounds(), threads=None)
    assert next(stream) == "first round"
    with pytest.raises(RuntimeError, match="out of memory"):
        next(stream)


def test_chat_falls_back_to_the_plain_prompt_for_a_tokenizer_without_a_chat_template():
    tokenizer = byte_level_tokenizer(["a plain prompt, no template"])
    req = request(["ar"], chat=True)
    handlers.fit_chat(req, SimpleNamespace(tokenizer=tokenizer))
    assert req.params.chat is False
    assert "no chat template" in req.note and "plain text" in req.note


def test_chat_stays_on_for_a_tokenizer_with_a_chat_template():
    tokenizer = byte_level_tokenizer(["a plain prompt, no template"])
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    req = request(["ar"], chat=True)
    handlers.fit_chat(req, SimpleNamespace(tokenizer=tokenizer))
    assert req.params.chat is True and req.note == ""


def test_a_failed_load_and_a_method_without_draft_are_reported_not_raised(tiny_pair):
    def refuse(req):
        raise ValueError("no such model folder")

    updates = list(handlers.stream_run(request(["ar"]), refuse))
    assert updates[-1].status == "⚠️ no such model folder" and updates[-1].warning == "no such model folder"

    class NoDraft:
        def __getattr__(self, name):
            return getattr(tiny_pair, name)

        draft = None

    updates = list(handlers.decode_methods(NoDraft(), request(["ar", "sd"])))
    assert any(u.warning and u.warning.startswith("SD") for u in updates)
    assert [r.method for r in updates[-1].results] == ["ar"] and updates[-1].files is not None
    assert "sd-panel-state error" in updates[-1].panels[1]  # the failed method's slot says why, at the end too


def test_compare_returns_the_table_files_and_texts(tiny_pair):
    outcome = handlers.compare(request("nasd,ar"), lambda req: tiny_pair)
    assert list(outcome.table.method) == ["ar", "nasd"]
    assert set(outcome.texts) == {"ar", "nasd"} and len(set(outcome.texts.values())) == 1
    assert list(pd.read_csv(outcome.summary_csv).method) == ["ar", "nasd"]
    tokens = pd.read_csv(outcome.tokens_csv)
    assert set(tokens.method) == {"nasd"} and tokens.point_mass.all() and (tokens.q == 1.0).all()


def test_endpoints_take_the_schemas_parameters_in_order():
    def handler(form, request):
        return form

    fn = forms.endpoint(handler, ("prompt",), ("target",), helps={"prompt": "the text", "target": "a model id"})
    names = list(inspect.signature(fn).parameters)
    assert names == ["prompt", *PARAMS, "target", "request"]
    form = fn("hi", *[p.default for p in SCHEMA], "t", None)
    assert form == {"prompt": "hi", **{p.name: p.default for p in SCHEMA}, "target": "t"}

    def streaming(form, request):
        yield form["prompt"]

    assert inspect.isgeneratorfunction(forms.endpoint(streaming, ("prompt",), generator=True,
                                                      helps={"prompt": "the text"}))


def test_every_schema_parameter_gets_a_page_control():
    import gradio as gr

    with gr.Blocks():
        controls = forms.param_controls(PARAMS, {"seed": 0}, row_width=forms.ROW_WIDTH,
                                        maxima={"max_new_tokens": 256})
    assert list(controls) == list(PARAMS)
    assert all(controls[p.name].label == p.label for p in SCHEMA)
    assert isinstance(controls["chat"], gr.Checkbox) and isinstance(controls["ngram_storage"], gr.Radio)
    assert isinstance(controls["ema"], gr.Slider) and controls["ema"].maximum == PARAMS["ema"].slider[1]
    assert isinstance(controls["max_new_tokens"], gr.Slider) and controls["max_new_tokens"].maximum == 256
    assert isinstance(controls["gamma"], gr.Number) and controls["gamma"].precision == 0
    assert controls["gamma"].value == PARAMS["gamma"].default and controls["seed"].value == 0
    assert set(forms.MAIN_PARAMS) | set(forms.ADVANCED_PARAMS) == set(PARAMS)


def test_engine_options_travel_from_the_form_to_the_loop(tiny_pair):
    req = request(["ar", "sd"], cache="static")
    assert req.engine.cache == "static" and not req.engine.compile
    updates = list(handlers.stream_run(req, lambda r: tiny_pair))
    assert {r.cache for r in updates[-1].results} == {"static"}
    assert set(pd.read_csv(updates[-1].files[0]).cache) == {"static"}
    with pytest.raises(ValueError, match="compile"):
        request(["ar"], cache="dynamic", compile=True)


def test_the_page_offers_the_draft_alone_only_where_the_draft_is_a_model(tmp_path):
    from specdemo.app.handlers import offered_methods

    assert "draft" not in offered_methods("embedded") and "draft" not in offered_methods("embedded-head")
    assert "draft" in offered_methods("embedded-lm") and "draft" in offered_methods("some/hub-model")
    assert {"beam", "ar-nocache", "sd"} <= set(offered_methods("embedded"))
    without = offered_methods(None)
    assert "draft" not in without and "sd" not in without and {"ar", "nasd", "beam", "ar-nocache"} <= set(without)


def test_choosing_a_feature_head_pair_drops_the_draft_alone_from_the_methods_box():
    from types import SimpleNamespace

    from specdemo.app import playgroundtab
    from specdemo.models.loading import PRESETS

    ctx = SimpleNamespace(presets=PRESETS)
    update = playgroundtab._offer_methods(ctx, "embedded-head", ["ar", "draft", "beam"])
    assert update["value"] == ["ar", "beam"]
    assert "draft" not in [name for _, name in update["choices"]]
    update = playgroundtab._offer_methods(ctx, "embedded-lm", ["ar", "draft"])
    assert update["value"] == ["ar", "draft"] and ("Draft alone", "draft") in update["choices"]
