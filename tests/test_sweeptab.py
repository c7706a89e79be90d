"""The page's Sweep tab: its handlers without a server, and /sweep through gradio_client."""

from __future__ import annotations

import threading

import gradio as gr
import pandas as pd
import pytest
import torch

from specdemo.app import sweeptab
from specdemo.app.limits import Limits
from specdemo.bench import sweep
from specdemo.bench.suite import SuitePrompt
from specdemo.models.loading import Preset

gradio_client = pytest.importorskip("gradio_client")
from gradio_client.exceptions import AppError  # noqa: E402

from tests.uiserver import TINY, serve  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")

PRESETS = {"tiny": Preset("tiny", "target-folder", "draft-folder", "")}
SUITE = [SuitePrompt("c1", "chat", "w5 w6 w7 w8 w9 w5 w6 w7"), SuitePrompt("c2", "chat", "w11 w12 w13"),
         SuitePrompt("k1", "code", "w30 w31 w32 w33")]


def form(**changes):
    values = {"preset": "tiny", "methods": ["sd", "egag"], "gamma": "1,3", "gamma_max": "4", "ema": "0,0.9",
              "ngram_n": "2,3", "categories": ["chat"], "prompts_per_category": 1, "repeats": 1,
              "max_new_tokens": 8, "chat": False, "seed": 0}
    return {**values, **changes}


def test_a_form_becomes_a_validated_request():
    req = sweeptab.make_sweep_request(form(), PRESETS, Limits(), SUITE)
    assert [s.key for s in req.settings] == ["ar", "sd:gamma=1", "sd:gamma=3", "egag:gamma_max=4,ema=0",
                                             "egag:gamma_max=4,ema=0.9"]
    assert [p.id for p in req.prompts] == ["c1"] and req.repeats == 1
    assert (req.params.max_new_tokens, req.target, req.draft) == (8, "target-folder", "draft-folder")
    # A grid of a method not chosen is not read; NASD takes the shared γ.
    req = sweeptab.make_sweep_request(form(methods=["nasd"], gamma="junk", gamma_max="", ema="x"), PRESETS,
                                      Limits(), SUITE)
    assert [s.key for s in req.settings] == ["ar", "nasd:gamma=3,ngram_n=2", "nasd:gamma=3,ngram_n=3"]
    # copy_n values repeat SD's and EGAG's points; empty leaves the default.
    req = sweeptab.make_sweep_request(form(methods=["sd"], gamma="3", copy_n="0, 4"), PRESETS, Limits(), SUITE)
    assert [s.key for s in req.settings] == ["ar", "sd:gamma=3,copy_n=0", "sd:gamma=3,copy_n=4"]
    # Trees take the node budgets; baselines run once each, beside AR.
    req = sweeptab.make_sweep_request(form(methods=["sd-tree", "beam", "ar-nocache"], node_budget="3,8"), PRESETS,
                                      Limits(), SUITE)
    assert [s.key for s in req.settings] == ["ar", "sd-tree:node_budget=3", "sd-tree:node_budget=8", "beam",
                                             "ar-nocache"]


@pytest.mark.parametrize("changes, message", [
    ({"methods": []}, "methods: choose at least one"),
    ({"gamma": "1,two"}, "gamma: 'two' is not a number"),
    ({"gamma": "0"}, "gamma must be an integer from 1 to 64"),
    ({"ema": "1.5"}, "ema must be a number in [0, 1)"),
    ({"copy_n": "1"}, "copy_n must be 0 (off) or an integer from 2 to 16"),
    ({"categories": []}, "categories: choose at least one"),
    ({"categories": ["poetry"]}, "no prompts in category 'poetry'"),
    ({"repeats": 1.5}, "repeats must be a whole number"),
    ({"prompts_per_category": 0}, "prompts per category must be at least 1"),
    ({"temperature": -1}, "temperature must be a number ≥ 0"),
    ({"preset": "huge"}, "unknown preset 'huge'"),
    ({"kv_budget_axis": "64,0"}, "kv_budget must be whole numbers of positions ≥ 1, e.g. 128,256; got '0'"),
    ({"kv_budget_axis": "64.5"}, "kv_budget must be whole numbers of positions ≥ 1, e.g. 128,256; got '64.5'"),
    ({"draft_kv_axis": "full,window"}, "draft_kv must be one of full, streaming, l2, head, got 'window'"),
    ({"target_dtype_axis": "float32,fp8"}, "target_dtype: dtype must be one of"),
    ({"draft_kv_axis": "head", "kv_budget_axis": "5"},
     "draft_kv=head, kv_budget=5: draft_kv=head: kv_budget (5) must be at least kv_sinks (4) + the 8 newest"),
])
def test_bad_forms_read_as_messages(changes, message):
    with pytest.raises(ValueError) as caught:
        sweeptab.make_sweep_request(form(**changes), PRESETS, Limits(), SUITE)
    assert message in str(caught.value)


@pytest.fixture
def runtime_presets(tmp_path):
    """A pair whose target runtime onnx can export (a local folder) and one it cannot (a .gguf file)."""
    return {"local": Preset("local", str(tmp_path), "draft-folder"),
            "gguf": Preset("gguf", "/nowhere/model.gguf", "draft-folder")}


def runtime_request(presets, runtimes=("torch", "onnx"), **changes):
    return sweeptab.make_sweep_request(form(**{"preset": "local", **changes}), presets, Limits(), SUITE,
                                       runtimes=runtimes)


def test_the_runtime_comes_from_the_form_or_the_pages_default_and_is_checked_against_the_pair(runtime_presets):
    assert runtime_request(runtime_presets).runtime == "torch"  # omitted: the page's default, its first
    assert runtime_request(runtime_presets, runtimes=("onnx", "torch")).runtime == "onnx"
    assert runtime_request(runtime_presets, runtime="onnx").runtime == "onnx"
    with pytest.raises(ValueError, match="runtime onnx cannot run the gguf pair's target, which cannot be exported"):
        runtime_request(runtime_presets, runtime="onnx", preset="gguf")
    with pytest.raises(ValueError, match="runtime must be one of torch here, got 'onnx'"):
        runtime_request(runtime_presets, runtimes=("torch",), runtime="onnx")  # a page that serves torch alone
    # What the runtime refuses runs on torch, and the draft takes any precision beside a runtime target.
    assert runtime_request(runtime_presets, methods=["sd-tree", "beam"], node_budget="3", target_kv="streaming",
                           kv_budget=64, target_dtype_axis="bfloat16").runtime == "torch"
    planned = runtime_request(runtime_presets, runtime="onnx", target_dtype_axis="int4,float32",
                              draft_dtype_axis="bfloat16").combinations
    assert [c for c, _ in planned] == [{"target_dtype": d, "draft_dtype": "bfloat16"} for d in ("int4", "float32")]


def test_trees_and_torchs_own_loops_on_the_runtime_are_taken_for_its_torch_copy(runtime_presets):
    """As on the Benchmark tab, a method the runtime cannot run is no refusal: it runs on the pair's torch copy,
    set against AR on that copy (`bench.sweep.sweep_runs`)."""
    request = runtime_request(runtime_presets, runtime="onnx", methods=["sd", "sd-tree", "beam", "ar-nocache"],
                              node_budget="3")
    assert request.runtime == "onnx"
    assert {s.method for s in request.settings} == {"ar", "sd", "sd-tree", "beam", "ar-nocache"}


@pytest.mark.parametrize("changes, message", [
    ({"target_kv_axis": "full,streaming", "kv_budget_axis": "64"},
     "target_kv=streaming: the onnx runtime keeps its own full cache, so target_kv=streaming cannot compress it: use "
     "full, or choose the torch target runtime (runtime=torch)"),
    ({"target_kv": "head", "kv_budget": 64}, "target_kv=head: the onnx runtime keeps its own full cache"),
    ({"target_dtype_axis": "int8,bfloat16"},
     "target_dtype=bfloat16: the onnx runtime runs the target at float32, int8, int4, not bfloat16: choose one of "
     "those"),
])
def test_what_the_runtime_refuses_reads_as_its_reason_before_loading(runtime_presets, changes, message):
    with pytest.raises(ValueError) as caught:
        runtime_request(runtime_presets, runtime="onnx", **changes)
    assert message in str(caught.value)


def test_public_mode_caps_grid_prompts_and_repeats():
    public = Limits(public=True, allowed_presets=("tiny",))
    assert public.sweep_caps() == {"settings": 8, "prompts": 2, "repeats": 1}
    assert Limits().sweep_caps() == {"settings": None, "prompts": None, "repeats": None}
    sweeptab.make_sweep_request(form(gamma="1,2,3,4", gamma_max="4,6,8", ema="0.9"), PRESETS, public, SUITE)  # 7 points
    with pytest.raises(ValueError, match="sweep: 9 grid points, at most 8 here"):
        sweeptab.make_sweep_request(form(gamma="1,2,3,4,6", gamma_max="4,6", ema="0,0.9"), PRESETS, public, SUITE)
    with pytest.raises(ValueError, match="sweep: 3 prompts, at most 2 here"):
        sweeptab.make_sweep_request(form(categories=["chat", "code"], prompts_per_category=2), PRESETS, public, SUITE)
    with pytest.raises(ValueError, match="sweep: 2 repeats, at most 1 here"):
        sweeptab.make_sweep_request(form(repeats=2), PRESETS, public, SUITE)
    own = Limits(public=True, allowed_presets=("tiny",), max_sweep_settings=2, max_sweep_prompts=5, max_sweep_repeats=3)
    with pytest.raises(ValueError, match="4 grid points, at most 2"):
        sweeptab.make_sweep_request(form(), PRESETS, own, SUITE)
    # The public tab starts within its caps.
    initial = sweeptab.default_form(public)
    sweeptab.make_sweep_request({**form(), **initial, "preset": "tiny", "max_new_tokens": 8}, PRESETS, public)


def test_public_sweep_caps_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPECDEMO_PUBLIC", "1")
    monkeypatch.setenv("SPECDEMO_MAX_SWEEP_SETTINGS", "3")
    monkeypatch.delenv("SPECDEMO_MAX_SWEEP_PROMPTS", raising=False)
    assert Limits.from_env().sweep_caps() == {"settings": 3, "prompts": 2, "repeats": 1}


def test_stream_sweep_reports_progress_then_draws_once_at_the_end(tiny_pair, tmp_path):
    req = sweeptab.make_sweep_request(form(categories=["chat"], prompts_per_category=2), PRESETS, Limits(), SUITE)
    folder = tmp_path / "export"
    folder.mkdir()
    updates = list(sweeptab.stream_sweep(req, lambda t, d, **loading: tiny_pair, lambda: folder, warmup=False))
    assert updates[0].message.startswith("Loading")
    running, last = updates[1:-1], updates[-1]
    # 5 settings × 2 prompts: an event per run, then the sweep's own "done".
    assert [u.done for u in running] == [*range(1, 2 * 5 + 1), 10] and running[-1].message == "done"
    # Nothing is drawn while runs are timed: the charts and the table come once, with the last update.
    assert all(u.figures is None and u.table is None and u.verdict is None for u in running)
    assert set(last.figures) == set(sweep.FIGURES)
    assert list(last.table.columns)[0] == "setting" and len(last.table) == 5
    assert last.finished and last.verdict.startswith("EGAG (γ_max 4")
    rows = pd.read_csv(last.files.rows_csv)
    assert list(rows.columns) == sweep.ROW_COLUMNS and len(rows) == 10
    assert rows.loc[rows.method != "ar", "matches_ar"].all()
    assert len(pd.read_csv(last.files.summary_csv)) == 5
    assert "Speculative decoding sweep" in open(last.files.report, encoding="utf-8").read()


def test_axes_run_the_grid_once_per_combination_and_set_them_side_by_side(tiny_pair, tmp_path):
    # No copying from the context: every round drafts, so the draft's cache outgrows the budget.
    req = sweeptab.make_sweep_request(form(methods=["sd"], gamma="2", copy_n="0", draft_kv_axis="full, head",
                                           target_dtype_axis="float64", kv_budget_axis="10", kv_sinks=2),
                                      PRESETS, Limits(), SUITE)
    assert [c for c, _ in req.combinations] == [{"target_dtype": "float64", "draft_kv": d, "kv_budget": 10}
                                                for d in ("full", "head")]
    loads = []
    updates = list(sweeptab.stream_sweep(req, lambda t, d, **precisions: loads.append(precisions) or tiny_pair,
                                         lambda: tmp_path, warmup=False))
    assert loads == [{"target_dtype": "float64", "runtime": "torch"}] * 2  # each combination loads its precisions
    assert updates[0].message == "target_dtype=float64, draft_kv=full, kv_budget=10: Loading the model pair …"
    running, last = [u for u in updates[1:-1] if "Loading" not in u.message], updates[-1]
    assert [u.done for u in running] == [1, 2, 2, 3, 4, 4] and {u.total for u in running} == {4}
    shown = last.table.set_index("draft_kv")
    assert list(shown.columns[:2]) == ["target_dtype", "kv_budget"] and shown.best.tolist() == ["SD γ=2, no copy"] * 2
    for column in ("best_tokens_per_s", "best_speedup_vs_ar", "best_acceptance_rate", "draft_kv_bytes_peak"):
        assert (shown[column] > 0).all(), column
    assert shown.best_vs_ar.str.startswith("under 3 prompts").all()  # one prompt: no interval
    assert shown.draft_kv_bytes_peak["head"] < shown.draft_kv_bytes_peak["full"]
    assert shown.exact_match_pct.tolist() == [100.0, 100.0]  # the draft's cache is lossless
    assert last.verdict.startswith("**target_dtype=float64, draft_kv=full, kv_budget=10**: ")
    rows = pd.read_csv(last.files.rows_csv)
    assert len(rows) == 4 and list(rows.columns[:3]) == ["target_dtype", "draft_kv", "kv_budget"]
    assert "draft_kv_bytes_peak" in open(last.files.report, encoding="utf-8").read()


def test_a_temperature_axis_runs_the_grid_at_each_temperature_and_draws_against_it(tiny_pair, tmp_path):
    """AR runs at each temperature as its reference; the page adds acceptance and speedup against temperature."""
    req = sweeptab.make_sweep_request(form(methods=["sd"], gamma="2", temperature_axis="0, 1.0"), PRESETS, Limits(),
                                      SUITE)
    assert [(c, p.temperature) for c, p in req.combinations] == [({"temperature": 0.0}, 0.0),
                                                                 ({"temperature": 1.0}, 1.0)]
    last = list(sweeptab.stream_sweep(req, lambda t, d, **loading: tiny_pair, lambda: tmp_path, warmup=False))[-1]
    rows = pd.read_csv(last.files.rows_csv)
    assert sorted(rows.temperature.unique()) == [0.0, 1.0]
    assert rows[rows.method == "ar"].groupby("temperature").size().tolist() == [1, 1]
    chart = sweeptab.page_values(last)[-1]
    assert [t.name for t in chart.data] == ["SD γ=2", "SD γ=2"] and list(chart.data[0].x) == [0.0, 1.0]
    with pytest.raises(ValueError, match="temperature"):
        sweeptab.make_sweep_request(form(temperature_axis="0,-2"), PRESETS, Limits(), SUITE)


def _sweep_threads():
    return [t for t in threading.enumerate() if t.name == "specdemo-sweep" and t.is_alive()]


def test_stop_ends_the_sweep_after_the_current_run(tiny_pair):
    req = sweeptab.make_sweep_request(form(categories=["chat", "code"], prompts_per_category=2, repeats=2,
                                           max_new_tokens=16), PRESETS, Limits(), SUITE)
    stream = sweeptab.sweep_events(tiny_pair, req, warmup=False)
    event, rows = next(stream)
    assert event.done == 1 and event.done < event.total
    stream.close()  # Stop or a closed tab
    assert not _sweep_threads()  # the worker has finished: the device queue may go to the next visitor


def test_the_sweep_decodes_on_the_threads_it_is_given_whatever_its_worker_starts_with(tiny_pair):
    req = sweeptab.make_sweep_request(form(), PRESETS, Limits(), SUITE)
    seen, before = set(), torch.get_num_threads()
    hook = tiny_pair.target.register_forward_hook(lambda *_: seen.add(torch.get_num_threads()))
    try:
        torch.set_num_threads(3)  # a new thread starts with the count last set anywhere
        list(sweeptab.sweep_events(tiny_pair, req, warmup=False, threads=1))
    finally:
        hook.remove()
        torch.set_num_threads(before)
    assert seen == {1}


def test_a_sweep_decodes_on_the_pages_plan_for_a_suite_on_its_runtime():
    from types import SimpleNamespace

    from specdemo.bench.measure.threads import ThreadPlan

    auto = SimpleNamespace(threads=ThreadPlan(count=None, cores=2))
    assert (sweeptab.sweep_threads(auto, "torch"), sweeptab.sweep_threads(auto, "onnx")) == (1, 2)
    assert sweeptab.sweep_threads(SimpleNamespace(threads=ThreadPlan(count=3)), "onnx") == 3
    assert sweeptab.sweep_threads(SimpleNamespace(threads=None), "onnx") is None


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("sweep-pair")) as (url, _):
        yield gradio_client.Client(url, verbose=False)


def call_sweep(client, **kwargs):
    kwargs = {"preset": TINY, "methods": ["sd", "egag"], "gamma": "1,2", "gamma_max": "3", "ema": "0.9",
              "categories": ["math"], "prompts_per_category": 1, "repeats": 1, "max_new_tokens": 8, **kwargs}
    return client.predict(**kwargs, api_name="/sweep")


def test_sweep_endpoint_returns_the_summary_csv_and_verdict(client):
    summary, csv, verdict = call_sweep(client)
    rows = [dict(zip(summary["headers"], row)) for row in summary["data"]]
    assert summary["headers"] == sweep.SUMMARY_COLUMNS
    assert [r["setting"] for r in rows] == ["ar", "sd:gamma=1", "sd:gamma=2", "egag:gamma_max=3,ema=0.9"]
    assert all(r["exact_match_pct"] == 100 for r in rows[1:])  # greedy: every setting reproduces AR
    table = pd.read_csv(csv)
    assert list(table.columns) == sweep.ROW_COLUMNS and len(table) == 4
    assert verdict.startswith("EGAG (γ_max 3, EMA 0.9) reached") and "best fixed γ" in verdict


def test_the_sweep_tab_runs_trees_and_baselines_beside_ar(client):
    summary, csv, verdict = call_sweep(client, methods=["sd-tree", "beam", "draft", "ar-nocache"], node_budget="3")
    rows = {row[summary["headers"].index("setting")]: dict(zip(summary["headers"], row)) for row in summary["data"]}
    assert list(rows) == ["ar", "sd-tree:node_budget=3", "beam", "draft", "ar-nocache"]
    assert rows["sd-tree:node_budget=3"]["exact_match_pct"] == 100 and rows["ar-nocache"]["exact_match_pct"] == 100
    assert len(pd.read_csv(csv)) == 5


def test_the_runtime_and_the_temperature_axis_end_the_endpoints_parameters(client):
    parameters = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/sweep"]["parameters"]
    names = [p["parameter_name"] for p in parameters]
    assert names[0] == "preset" and names[-2:] == ["runtime", "temperature_axis"]
    assert parameters[-2]["parameter_default"] == "torch"  # the page's default runtime
    assert parameters[-1]["parameter_default"] == ""  # no temperature axis: the shared temperature
    summary, csv, _ = call_sweep(client, methods=["sd"], gamma="2")  # omitted: the page's default
    assert {row[summary["headers"].index("runtime")] for row in summary["data"]} == {"torch"}
    assert set(pd.read_csv(csv)["runtime"]) == {"torch"}


def test_sweep_endpoint_reports_bad_grids(client):
    with pytest.raises(AppError) as caught:
        call_sweep(client, gamma="1,x")
    assert "gamma: 'x' is not a number" in str(caught.value)
    with pytest.raises(AppError) as caught:
        call_sweep(client, draft_kv_axis="full,H2O")
    assert "draft_kv must be one of full, streaming, l2, head, got 'H2O'" in str(caught.value)


def test_while_a_sweep_runs_the_page_changes_its_status_line_alone(tiny_pair, tmp_path):
    req = sweeptab.make_sweep_request(form(), PRESETS, Limits(), SUITE)
    updates = [sweeptab.page_values(u) for u in sweeptab.stream_sweep(req, lambda t, d, **loading: tiny_pair, lambda: tmp_path,
                                                                       warmup=False)]
    running, last = updates[:-1], updates[-1]
    assert all(isinstance(line, str) for line in running) and running[1].startswith("Running: 1/")
    # The last one fills every output, the placeholder giving way to the results.
    status, verdict, table, *rest = last
    charts, files = rest[:len(sweeptab.CHARTS)], rest[len(sweeptab.CHARTS):-3]
    placeholder, results, temperature_chart = rest[-3:]
    assert temperature_chart is None  # no temperature axis
    assert status.startswith("Done: 5 runs") and verdict.startswith("EGAG") and len(table) == 5
    assert all(chart is not None for chart in charts)
    assert [f["interactive"] for f in files] == [True] * 3
    assert (placeholder["visible"], results["visible"]) == (False, True)
    with gr.Blocks():
        assert len(last) == len(sweeptab._outputs())  # one value per output
