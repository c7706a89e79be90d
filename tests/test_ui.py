"""The playground served on 127.0.0.1 with a tiny pair, driven through gradio_client."""

from __future__ import annotations

import gc
import os
import time
from types import SimpleNamespace

import pandas as pd
import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client.exceptions import AppError  # noqa: E402

import torch  # noqa: E402

from specdemo.app import handlers, ui  # noqa: E402
from specdemo.app.charts import CHART_NAMES  # noqa: E402
from specdemo.app.playgroundtab import TREE_CHARTS  # noqa: E402
from specdemo.app.limits import Limits  # noqa: E402
from specdemo.models.loading import Preset  # noqa: E402
from specdemo.bench.measure.tables import ROUND_COLUMNS, SUMMARY_COLUMNS, TOKEN_COLUMNS  # noqa: E402
from tests.tiny import write_model, write_tokenizer  # noqa: E402
from tests.uiserver import TINY, counting_target_forwards, serve, tiny_loader, tiny_presets  # noqa: E402

# Gradio's queue trips pandas 3 deprecation warnings of its own; they are not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("ui-pair"), defaults={"max_new_tokens": 16}) as (url, demo):
        yield url, demo


@pytest.fixture(scope="module")
def client(server):
    return gradio_client.Client(server[0], verbose=False)


def compare(client, **kwargs):
    kwargs = {"prompt": "w3 w4 w5 w6 w7", "preset": TINY, "max_new_tokens": 16, **kwargs}
    return client.predict(**kwargs, api_name="/compare")


def test_compare_gives_a_row_per_method_and_the_cli_csvs(client):
    summary, summary_csv, rounds_csv, texts, tokens_csv = compare(client, methods=["ar", "sd", "nasd", "egag"])
    assert summary["headers"] == SUMMARY_COLUMNS
    rows = [dict(zip(summary["headers"], row)) for row in summary["data"]]
    assert [r["method"] for r in rows] == ["ar", "sd", "nasd", "egag"]
    assert all(r["new_tokens"] == 16 for r in rows)
    assert all(r["matches_ar"] is True for r in rows)  # greedy decoding is lossless
    assert rows[0]["speedup_vs_ar"] == pytest.approx(1.0)

    table = pd.read_csv(summary_csv)
    assert list(table.columns) == SUMMARY_COLUMNS
    assert list(table["method"]) == ["ar", "sd", "nasd", "egag"]
    trace = pd.read_csv(rounds_csv)
    assert list(trace.columns) == ROUND_COLUMNS
    assert set(trace["method"]) == {"ar", "sd", "nasd", "egag"}
    assert len(set(texts.values())) == 1 and texts["ar"].strip()
    tokens = pd.read_csv(tokens_csv)
    assert list(tokens.columns) == TOKEN_COLUMNS
    drafted = trace.groupby("method").n_drafted.sum()
    assert tokens.groupby("method").size().to_dict() == drafted[drafted > 0].to_dict()


def test_compare_takes_a_list_and_scores_sampled_runs(client):
    summary, *_ = compare(client, methods=["nasd", "ar"], temperature=0.8, seed=3)
    rows = [dict(zip(summary["headers"], row)) for row in summary["data"]]
    assert [r["method"] for r in rows] == ["ar", "nasd"]
    assert all(r["perplexity"] is not None and r["perplexity"] > 0 for r in rows)
    assert all(r["matches_ar"] is None for r in rows)


@pytest.mark.parametrize("kwargs, message", [
    ({"gamma": 0}, "gamma must be an integer from 1 to 64, got 0"),
    ({"prompt": "   "}, "prompt is empty"),
    ({"gamma_min": 5, "gamma_max": 2}, "gamma_min (5) must not exceed gamma_max (2)"),
    # methods is a list of the registry's names, and Gradio refuses any other name, listing them.
    ({"methods": ["ar", "warp"]}, "Value: 'warp' (type: <class 'str'>) is not in the list of choices: ['ar', 'sd'"),
    ({"methods": ""}, "choose at least one"),
    ({"target": "/nonexistent/model-folder"}, "/nonexistent/model-folder"),
    ({"target_dtype": "int3"}, "target_dtype must be auto or one of float32, bfloat16"),
])
def test_bad_input_reaches_the_client_as_a_readable_error(client, kwargs, message):
    with pytest.raises(AppError) as caught:
        compare(client, **kwargs)
    assert message in str(caught.value)
    assert "Traceback" not in str(caught.value)


def test_a_draft_with_another_tokenizer_is_refused(client, server, tmp_path_factory):
    root = tmp_path_factory.mktemp("other-vocab")
    write_model(root, seed=5, hidden=32, layers=1, vocab=40)
    write_tokenizer(root, vocab=40)
    tiny_target = server[1].specdemo_presets[TINY].target
    with pytest.raises(AppError, match="draft tokenizer differs"):
        compare(client, target=tiny_target, draft=str(root), methods=["sd"])


def test_run_sends_the_panels_and_the_charts_once_at_the_end(client):
    job = client.submit(prompt="w3 w4 w5", methods=["ar", "sd"], max_new_tokens=12, api_name="/run")
    final = job.result(timeout=120)
    outputs = job.outputs()
    assert final[0].startswith("Done in")
    ar_panel, sd_panel = latest(outputs, 1), latest(outputs, 2)
    assert "sd-tok sd-target" in ar_panel and 'data-method="ar"' in ar_panel
    assert 'data-method="sd"' in sd_panel and "sd-tok" in sd_panel
    assert final[-6] and final[-5]  # the summary and per-round CSV downloads
    # The panels, like the charts, come once, in the last update; before it, only the status line changes.
    panels = [n for n, o in enumerate(outputs) if 'data-method="sd"' in str(o[2])]
    charts = [k for k, value in enumerate(final) if isinstance(value, dict) and "plot" in value]
    # No tree method ran: every chart but the trees' comes, and the trees' stay hidden, not sent.
    assert len(charts) == len(CHART_NAMES) - len(TREE_CHARTS)
    drawn = [n for n, o in enumerate(outputs) if any(isinstance(o[k], dict) and "plot" in o[k] for k in charts)]
    assert panels == drawn == [len(outputs) - 1]


def test_a_run_like_the_last_sends_values_not_property_updates(client):
    """Gradio rebuilds a component for each property update, on the server's event loop beside the
    decoders: a run that shows what the last one showed changes no visibility or interactivity."""
    for _ in range(2):
        job = client.submit(prompt="w3 w4 w5", methods=["ar", "sd"], max_new_tokens=8, api_name="/run")
        final = job.result(timeout=120)
    assert final[0].startswith("Done in")
    assert 'data-method="sd"' in final[2] and final[-6] and final[-5]  # the panels and files still come
    assert [value for value in final if isinstance(value, dict) and {"visible", "interactive"} & set(value)] == []


def latest(outputs, index):
    """An output's last value (updates that leave it alone come back as update dicts without one)."""
    values = [o[index].get("value") if isinstance(o[index], dict) else o[index] for o in outputs]
    values = [value for value in values if isinstance(value, str)]
    return values[-1] if values else ""


def test_run_shows_bad_parameters_on_the_page(client):
    job = client.submit(prompt="w3 w4", gamma=0, api_name="/run")
    final = job.result(timeout=60)
    assert "gamma must be an integer" in final[0]


def test_run_shows_a_bad_precision_on_the_page(client):
    final = client.submit(prompt="w3 w4", draft_dtype="fp8", api_name="/run").result(timeout=60)
    assert "draft_dtype must be auto or one of" in final[0] and "'fp8'" in final[0]


def test_a_chosen_precision_loads_the_pair_at_it_and_greedy_sd_still_equals_ar(client, server):
    summary, *_ = compare(client, methods=["ar", "sd"], target_dtype="bfloat16")
    rows = [dict(zip(summary["headers"], row)) for row in summary["data"]]
    assert [(r["target_dtype"], r["draft_dtype"]) for r in rows] == [("bfloat16", "float64")] * 2
    assert rows[1]["matches_ar"] is True  # lossless against the target as loaded
    (pair,) = server[1].specdemo_cache._pairs.values()
    assert pair.target.dtype == torch.bfloat16 and pair.draft.dtype == torch.float64
    summary, *_ = compare(client, methods=["ar"])  # auto: the page's own precision again
    assert summary["data"][0][summary["headers"].index("target_dtype")] == "float64"


def test_the_default_precision_finds_the_preloaded_pair(tmp_path):
    loads = []

    def loader(target, draft=None, **options):
        loads.append(options)
        return tiny_loader(target, draft, **options)

    with serve(tmp_path, loader=loader, preload=True) as (url, demo):
        client = gradio_client.Client(url, verbose=False)
        for precisions in ({}, {"target_dtype": "auto", "draft_dtype": "auto"}):
            summary, *_ = compare(client, methods=["ar"], max_new_tokens=4, **precisions)
            assert summary["data"][0][0] == "ar"
    assert loads == [{"device": None, "dtype": None}]  # the preload only: every run was a cache hit


def test_stop_cancels_and_the_app_keeps_serving(client):
    job = client.submit(prompt="w3 w4 w5", max_new_tokens=400, api_name="/run")
    deadline = time.time() + 60
    while len(job.outputs()) < 3 and time.time() < deadline:
        time.sleep(0.05)
    job.cancel()
    started = time.time()
    summary, *_ = compare(client, methods=["ar"], max_new_tokens=4)
    assert summary["data"][0][0] == "ar"
    assert time.time() - started < 60


def test_pair_cache_keeps_one_pair_and_closes_the_previous():
    closed, loads = [], []

    class FakePair:
        def __init__(self, name):
            self.name = name

        def close(self):
            closed.append(self.name)

    def loader(target, draft, device=None, dtype=None):
        loads.append(target)
        return FakePair(target)

    cache = ui.PairCache(loader, limit=1, warm_up=False)
    a = cache.get("a", None)
    assert cache.get("a", None) is a and loads == ["a"]
    cache.get("b", "d")
    assert closed == ["a"] and len(cache) == 1
    big = ui.PairCache(loader, limit=2, warm_up=False)
    big.get("x", None), big.get("y", None), big.get("x", None), big.get("z", None)
    assert closed[-1] == "y"  # least recently used goes first
    big.clear()
    assert set(closed) >= {"x", "z"}


def test_a_serving_cache_freezes_what_stays_loaded_and_thaws_it_when_a_pair_goes(monkeypatch):
    from specdemo.app import page

    monkeypatch.setattr(page, "_warm_up", lambda pair, engine: None)
    pairs = {name: SimpleNamespace(name=name, close=lambda: None) for name in ("a", "b")}
    cache = ui.PairCache(lambda target, draft, **_: pairs[target], limit=1)
    try:
        gc.unfreeze()
        cache.get("a", None)
        frozen = gc.get_freeze_count()
        assert frozen > 0 and gc.isenabled()  # a full collection no longer walks the loaded pair
        thawed = []
        monkeypatch.setattr(gc, "unfreeze", lambda: thawed.append(gc.get_freeze_count()))
        cache.get("b", None)  # "a" is closed: the collector may reach what it leaves behind
        assert len(thawed) == 1 and thawed[0] > 0
    finally:
        monkeypatch.undo()
        gc.unfreeze()


def test_export_dirs_are_per_request_and_old_ones_are_removed(tmp_path):
    old = tmp_path / "run-old"
    old.mkdir()
    os.utime(old, (time.time() - 10_000, time.time() - 10_000))
    first = ui.export_dir(tmp_path, ttl_s=3600)
    second = ui.export_dir(tmp_path, ttl_s=3600)
    assert first != second and first.is_dir() and second.is_dir()
    assert not old.exists()


def test_app_arguments():
    import app

    args = app.build_parser().parse_args(["--host", "0.0.0.0", "--port", "7861", "--share", "--public"])
    assert (args.host, args.port, args.share, args.public) == ("0.0.0.0", 7861, True, True)
    defaults = app.build_parser().parse_args([])
    assert (defaults.host, defaults.port, defaults.share, defaults.public) == (None, None, False, False)


def test_threads_come_from_the_flag_then_the_environment_then_the_machine(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv(ui.THREADS_ENV, "2")
        assert ui.serving_threads(1) == ui.ThreadPlan(count=1) and torch.get_num_threads() == 1
        assert ui.serving_threads() == ui.ThreadPlan(count=2) and torch.get_num_threads() == 2
        monkeypatch.delenv(ui.THREADS_ENV)
        # A machine of two cores takes the measured default (docs/benchmark.md); a larger one, torch's.
        assert ui.serving_threads(cores=2) == ui.serving_threads(ui.SMALL_MACHINE_THREADS, cores=2)
        assert ui.serving_threads(cores=64) == ui.ThreadPlan(count=torch.get_num_threads())
        for bad in (0, "two"):
            with pytest.raises(ValueError, match="threads must be an integer ≥ 1 or auto"):
                ui.serving_threads(bad)
    finally:
        torch.set_num_threads(before)


def test_auto_threads_give_ar_one_thread_and_drafting_methods_every_core():
    plan = ui.serving_threads("auto", cores=2)
    try:
        assert [plan.for_method(m) for m in ("ar", "ar-nocache", "draft", "beam")] == [1, 1, 1, 1]
        assert [plan.for_method(m) for m in ("sd", "nasd", "egag", "sd-tree")] == [2, 2, 2, 2]
        assert plan.default == 1 and "auto" in plan.describe()  # the tabs' suites run on one thread
        assert ui.ThreadPlan(count=1).for_method("sd") == 1
    finally:
        torch.set_num_threads(plan.default)


def test_the_page_decodes_each_method_on_its_planned_threads(tiny_pair):
    from specdemo.app import handlers

    before = torch.get_num_threads()
    request = handlers.make_request("w3 w4 w5", "tiny", "", "", {"max_new_tokens": 6, "chat": False},
                                    {"tiny": Preset("tiny", "target", "draft", "")}, methods="ar,sd")
    try:
        last = list(handlers.decode_methods(tiny_pair, request, threads=ui.ThreadPlan(count=None, cores=2)))[-1]
        assert {r.method: r.threads for r in last.results} == {"ar": 1, "sd": 2}
        # The status line's words are the server log's (ThreadPlan.describe, after its "auto: ").
        assert "1 torch thread for AR, 2 for the drafting methods" in last.status
        assert ui.ThreadPlan(count=None, cores=2).describe() == "auto: 1 torch thread for AR, 2 for the drafting methods"
    finally:
        torch.set_num_threads(before)


def test_the_intro_says_what_the_page_does_and_names_the_registrys_default_methods():
    from specdemo.engine.methods import DEFAULT_METHODS, METHODS

    intro = ui.intro_text()
    assert intro == ui.INTRO
    body = intro.split("\n", 1)[1]
    assert body.count(". ") + body.endswith(".") == 2  # two sentences
    for name in DEFAULT_METHODS:
        assert f"**{METHODS[name].label}**: {METHODS[name].description}" in intro
    assert sum(f"**{m.label}**" in intro for m in METHODS.values()) == len(DEFAULT_METHODS)  # only the ticked ones
    assert f"{len(METHODS) - len(DEFAULT_METHODS)} more" in intro
    # From the registry it is given, not from a list of its own.
    fewer = ui.intro_text({name: METHODS[name] for name in ("ar", "sd", "beam")}, ticked=("ar", "sd"))
    assert "**AR**" in fewer and "**SD**" in fewer and "**NASD**" not in fewer and "1 more" in fewer


def test_the_log_says_in_one_line_when_the_preloaded_pair_is_ready(capsys):
    from types import SimpleNamespace

    pair = SimpleNamespace(draft=None, draft_kind=None, runtime="torch", target=torch.nn.Linear(2, 2),
                           close=lambda: None)
    cache = ui.PairCache(lambda target, draft, **_: pair, limit=1, warm_up=False)
    ready = ui.preload_pair(cache, Preset("p", "target", "draft", ""), threads=ui.ThreadPlan(count=None, cores=2))
    assert ready.wait(30)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ready:")]
    assert len(lines) == 1
    assert lines[0].startswith("ready: p on torch/cpu, loaded and warmed in ")
    assert "Runs decode on auto: 1 torch thread for AR, 2 for the drafting methods" in lines[0]


def test_app_applies_threads_and_preloads_the_default_pair(monkeypatch):
    import app

    before, built = torch.get_num_threads(), {}
    monkeypatch.setattr(ui, "build_demo", lambda **options: built.update(options) or "demo")
    monkeypatch.setattr(ui, "launch", lambda demo, **options: built.update(launched=demo))
    try:
        app.main(["--threads", "1"])
        assert torch.get_num_threads() == 1
        assert built["preload"] is True and built["launched"] == "demo"
    finally:
        torch.set_num_threads(before)


def test_the_warm_up_runs_every_default_method_before_the_first_run(tmp_path):
    from types import SimpleNamespace

    from specdemo.app import page

    ran, pair = [], SimpleNamespace(draft=object(), draft_kind="lm", close=lambda: None)
    cache = ui.PairCache(lambda target, draft, **_: pair, limit=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(page, "generate", lambda pair, prompt, method, **params: ran.append((pair, method)))
        ready = ui.preload_pair(cache, Preset("p", "target", "draft", ""))
        assert ready.wait(30)
    assert ran == [(pair, "ar"), (pair, "sd"), (pair, "nasd"), (pair, "egag")]
    assert cache.get("target", "draft") is pair and len(cache) == 1  # the first Run finds it loaded and warm


def test_zero_gpu_is_a_no_op_off_spaces(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)

    def work():
        return 1

    assert ui.gpu(work) is work


def test_stop_ends_the_decoding_loop_not_just_the_stream(client, server):
    compare(client, methods=["ar"], max_new_tokens=2)  # the pair is loaded and cached
    # 480 paused forwards last ≥ 4.8 s, longer than Stop may take: the loop meets Stop at its next
    # status line, at most STATUS_INTERVAL_S later, so an unpaused tiny model could finish first
    with counting_target_forwards(server[1], pause_s=0.01) as forwards:
        job = client.submit(prompt="w3 w4 w5", methods=["ar"], max_new_tokens=480, api_name="/run")
        deadline = time.time() + 60
        while forwards[0] < 5 and time.time() < deadline:
            time.sleep(0.02)
        job.cancel()
        time.sleep(handlers.STATUS_INTERVAL_S + 0.5)  # the loop reaches its next status line
        stopped_at, updates = forwards[0], len(job.outputs())
        time.sleep(1.5)
        assert forwards[0] == stopped_at, "the target kept decoding after Stop"
        assert len(job.outputs()) == updates, "the trace kept growing after Stop"
        assert stopped_at < 480
    summary, *_ = compare(client, methods=["ar", "sd"], max_new_tokens=6)
    assert [row[0] for row in summary["data"]] == ["ar", "sd"]


def test_an_out_of_memory_failure_reads_as_advice():
    message = ui.readable_failure(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert message.startswith("out of memory") and "fewer new tokens" in message
    assert ui.readable_failure(RuntimeError("boom")) == "RuntimeError: boom"


@pytest.fixture(scope="module")
def public_client(tmp_path_factory):
    root = tmp_path_factory.mktemp("public-pair")
    presets = tiny_presets(root)
    presets["other"] = Preset("other", presets[TINY].target, None, "served only in private mode")
    limits = Limits(public=True, allowed_presets=(TINY,), max_new_tokens=24, max_prompt_tokens=12, queue_size=4)
    with serve(root, presets=presets, limits=limits) as (url, demo):
        yield gradio_client.Client(url, verbose=False), demo


def test_public_mode_serves_allowed_presets_within_the_caps(public_client):
    client, demo = public_client
    assert list(demo.specdemo_presets) == [TINY]
    summary, *_ = compare(client, methods=["ar", "sd"], max_new_tokens=24)
    assert [row[0] for row in summary["data"]] == ["ar", "sd"]


@pytest.mark.parametrize("kwargs, message", [
    ({"target": "Qwen/Qwen2.5-7B-Instruct"}, "typed model ids and paths are refused"),
    ({"target": "/etc"}, "typed model ids and paths are refused"),
    ({"draft": "./weights"}, "typed model ids and paths are refused"),
    # The page's dropdown offers only the served presets, and Gradio refuses any other value.
    ({"preset": "other"}, "other is not in the list of choices: ['tiny']"),
    ({"preset": "gpt-5"}, "gpt-5 is not in the list of choices"),
    # The slider's maximum is the cap, so Gradio refuses larger values before the library sees them.
    ({"max_new_tokens": 25}, "Value 25 is greater than maximum value 24"),
    ({"prompt": " ".join(f"w{i}" for i in range(3, 30))}, "prompt is too long for this demo"),
])
def test_public_mode_refuses_what_it_does_not_serve(public_client, kwargs, message):
    client, demo = public_client
    loads_before = len(demo.specdemo_cache)
    with pytest.raises(AppError) as caught:
        compare(client, **kwargs)
    assert message in str(caught.value)
    assert len(demo.specdemo_cache) <= max(loads_before, 1)


def test_the_page_never_enables_remote_code(tmp_path):
    seen = []

    def loader(target, draft=None, **kwargs):
        seen.append(kwargs)
        raise ValueError("stop here")

    demo = ui.build_demo(pair_loader=loader, presets=tiny_presets(tmp_path))
    with pytest.raises(ValueError):
        demo.specdemo_cache.get("t", None)
    assert seen and all("trust_remote_code" not in kwargs for kwargs in seen)


def test_a_closed_tab_is_remembered_only_while_its_run_lasts():
    from specdemo.app.ui import RunningSessions

    runs = RunningSessions()
    runs.closed("idle")  # a tab without a run: nothing to stop, nothing kept
    assert runs.wanted("idle") and not runs._closed
    runs.started("a")
    runs.started("b")
    runs.closed("a")
    assert not runs.wanted("a") and runs.wanted("b")
    runs.finished("a")
    assert runs.wanted("a") and not runs._closed and set(runs._runs) == {"b"}


def test_a_run_followed_for_a_closed_tab_stops_and_is_closed_and_tidied():
    from types import SimpleNamespace

    from specdemo.app.ui import RunningSessions

    tidied, closed = [], []

    def updates():
        try:
            yield from range(100)
        finally:
            closed.append(True)

    runs = RunningSessions(tidy=tidied.append)
    request = SimpleNamespace(session_hash="a")
    relayed = []
    for update in runs.follow(request, updates()):
        relayed.append(update)
        if update == 2:
            runs.closed("a")  # the page's unload, from the session's heartbeat
    assert relayed == [0, 1, 2] and closed == [True] and tidied == [request]
    assert runs.wanted("a") and not runs._runs  # nothing kept once the run is over
