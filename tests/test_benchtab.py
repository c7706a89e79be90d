"""The page's Benchmark tab: the suite run from the browser's API, within a deployment's limits."""

from __future__ import annotations

import pandas as pd
import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client.exceptions import AppError  # noqa: E402

from specdemo import bench
from specdemo.app import benchtab, suite_runtime  # noqa: E402
from specdemo.app.limits import Limits  # noqa: E402
from specdemo.bench.measure.threads import ThreadPlan  # noqa: E402
from tests.uiserver import TINY, serve  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    limits = Limits(public=True, allowed_presets=(TINY,), max_new_tokens=32)
    # The page's auto plan on two cores: the tab runs its suite by the plan for suites, one thread.
    plan = ThreadPlan(count=None, cores=2)
    with serve(tmp_path_factory.mktemp("bench-pair"), limits=limits, threads=plan) as (url, _):
        yield gradio_client.Client(url, verbose=False)


def benchmark(client, **kwargs):
    kwargs = {"preset": TINY, "category": "math", "prompts_per_category": 1, "repeats": 1, "max_new_tokens": 8,
              "methods": ["ar", "sd", "nasd", "hf-generate", "hf-assisted"], **kwargs}
    return client.predict(**kwargs, api_name="/benchmark")


def file_of(download) -> str:
    """A download button's file (updates that also enable the button arrive as dicts)."""
    return download["value"] if isinstance(download, dict) else download


def test_the_tab_runs_the_suite_and_offers_the_cli_files(client):
    # The API returns the components' values, not the layout's: the placeholder, then no column.
    (status, table, *charts, runs_csv, summary_csv, report, tokens_csv, placeholder, batch_verdict, batch_ratio,
     batch_throughput) = benchmark(client)
    assert batch_verdict.startswith("Batch size 1 only") and batch_ratio and batch_throughput
    assert placeholder["visible"] is False  # it gives way to the results once a run has finished
    runs_csv, summary_csv, report = map(file_of, (runs_csv, summary_csv, report))
    assert status.startswith("Done: 5 runs on 1 prompts")
    rows = pd.read_csv(runs_csv)
    assert list(rows.columns) == bench.ROW_COLUMNS
    assert sorted(rows.method) == ["ar", "hf-assisted", "hf-generate", "nasd", "sd"]
    assert set(rows.threads) == {1}
    assert set(rows.category) == {"math"} and (rows.new_tokens == 8).all()
    assert rows.loc[rows.method != "ar", "matches_ar"].all()  # greedy: every decoder reproduces AR
    summary = pd.read_csv(summary_csv)
    assert list(summary.columns) == bench.SUMMARY_COLUMNS
    shown = pd.DataFrame(table["data"], columns=table["headers"])
    assert list(shown.columns) == ["category" if c == "category" else ("method" if c == "label" else c)
                                   for c in benchtab.TABLE_COLUMNS]
    assert set(shown.category) == {"math", "all"}
    assert len(charts) == len(benchtab.CHARTS) and all(charts)
    tokens = pd.read_csv(file_of(tokens_csv))
    assert set(tokens.method) <= {"sd", "nasd"} and len(tokens) == rows[rows.method.isin(["sd", "nasd"])].drafted.sum()
    with open(report, encoding="utf-8") as page:
        assert "Speculative decoding benchmark" in page.read()


@pytest.mark.parametrize("kwargs, message", [
    ({"prompts_per_category": 3}, "prompts per category must be at most 2 on this public demo"),
    ({"repeats": 2}, "repeats must be at most 1 on this public demo"),
    ({"max_new_tokens": 33}, "max_new_tokens must be at most 32"),
    ({"max_new_tokens": 0}, "max new tokens must be at least 1"),
    ({"methods": []}, "methods: choose at least one"),
    ({"methods": ["ar", "warp"]}, "is not in the list of choices"),
    ({"batch_sizes": "1,0"}, "batch sizes must be whole numbers ≥ 1"),
    ({"batch_sizes": "1,8"}, "batch sizes must be at most 4 on this public demo"),
])
def test_bad_benchmark_settings_read_as_messages(client, kwargs, message):
    with pytest.raises(AppError) as caught:
        benchmark(client, **kwargs)
    assert message in str(caught.value)


def test_batch_sizes_run_each_size_and_draw_the_verdict_and_charts(client):
    """The endpoint's last parameter: the suite at each batch size, every row saying its batch, the verdict
    and the ratio chart (AR's line at 1) among the outputs."""
    outputs = benchmark(client, methods=["ar", "sd", "hf-generate"], prompts_per_category=2, batch_sizes="2,1")
    runs_csv, verdict, ratio, throughput = file_of(outputs[-8]), outputs[-3], outputs[-2], outputs[-1]
    rows = pd.read_csv(runs_csv)
    assert sorted(rows.batch.unique()) == [1, 2]
    assert set(rows[rows.batch == 2].method) == {"ar", "sd"}
    assert verdict.startswith("Drafting") and "HF generate: transformers' generate pads a batch" in verdict
    assert ratio and throughput


def test_run_sizes_must_be_whole_numbers():
    limits = Limits()
    assert benchtab.check_size(limits, 2, 3.0, 64) == (2, 3, 64)
    with pytest.raises(ValueError, match="repeats must be a whole number"):
        benchtab.check_size(limits, 2, 1.5, 64)
    with pytest.raises(ValueError, match="prompts per category must be a whole number"):
        benchtab.check_size(limits, "many", 1, 64)


def _bench_threads():
    import threading

    return [t for t in threading.enumerate() if t.name == "specdemo-bench" and t.is_alive()]


def test_measure_streams_progress_then_the_result_without_a_server(tiny_pair):
    items = list(benchtab.measure(tiny_pair, methods=["ar", "nasd"], repeats=1, categories="math", limit=1,
                                  max_new_tokens=4, warmup=False))
    assert all(isinstance(i, tuple) and len(i) == 3 for i in items[:-1])
    assert [i[0] for i in items[:-1]] == list(range(1, len(items)))
    assert isinstance(items[-1], bench.BenchResult)
    assert not _bench_threads()


def test_stop_returns_only_after_the_worker_has_stopped(tiny_pair):
    """Closing the stream (Stop, a closed tab) must not release the device queue while the
    worker still decodes on the shared pair."""
    stream = benchtab.measure(tiny_pair, methods=["ar", "sd", "nasd"], repeats=3, categories="math", limit=2,
                              max_new_tokens=16, warmup=False)
    done, total, _ = next(stream)
    assert done < total
    stream.close()
    assert not _bench_threads()


def test_the_methods_box_offers_a_pair_only_what_it_can_run(tmp_path):
    from specdemo.models.loading import EMBEDDED, EMBEDDED_LM, Preset

    value, note = benchtab.method_choices(Preset(EMBEDDED, EMBEDDED, EMBEDDED))  # the default pair: a feature head
    assert "hf-assisted" not in value and value == [m for m in bench.DEFAULT_BENCH_METHODS if m != "hf-assisted"]
    assert 'input[name="hf-assisted"]' in note and "drafts with a feature head" in note
    value, note = benchtab.method_choices(Preset(EMBEDDED_LM, EMBEDDED, EMBEDDED_LM))
    assert value == list(bench.DEFAULT_BENCH_METHODS) and "feature head" not in note
    value, note = benchtab.method_choices(Preset("alone", "some/target", None), ["ar", "sd", "nasd", "hf-assisted"])
    assert value == ["ar", "nasd"] and "needs a draft" in note


def test_the_methods_box_offers_the_runtimes_own_decoders_beside_a_runtime_target_only():
    from specdemo.bench.measure.runners import HF_METHODS, RUNTIME_PEERS
    from specdemo.models.loading import EMBEDDED, EMBEDDED_LM, Preset

    lm_pair, both = Preset(EMBEDDED_LM, EMBEDDED, EMBEDDED_LM), ("torch", "onnx")
    on_torch = benchtab.unavailable_methods(lm_pair.draft_kind, "torch", both)
    assert {name: on_torch[name] for name in RUNTIME_PEERS} == {name: suite_runtime.BESIDE_RUNTIME for name in RUNTIME_PEERS}
    assert "choose the onnx target runtime" in benchtab.method_choices(lm_pair, runtime="torch", runtimes=both)[1]
    # Where the page runs the pair's target on torch alone, the note does not send the visitor to a runtime it lacks.
    assert set(benchtab.unavailable_methods(lm_pair.draft_kind, "torch").values()) == {suite_runtime.NOT_OFFERED}

    value, note = benchtab.method_choices(lm_pair, runtime="onnx", runtimes=both)
    assert value == ["ar", "sd", "nasd", "egag", "onnx-generate"]  # the runtime's own search, not transformers'
    on_onnx = benchtab.unavailable_methods(lm_pair.draft_kind, "onnx", both)
    assert not set(RUNTIME_PEERS) & set(on_onnx), "offered beside the runtime, torch-ar and onnx-ngram unchecked"
    assert {"sd-tree", "egag-tree", "beam", "ar-nocache", *HF_METHODS} <= set(on_onnx)
    assert "verifies a chain only" in on_onnx["sd-tree"] and "torch's own loop" in on_onnx["beam"]
    assert "torch copy of the target" in on_onnx["hf-generate"]
    assert not {"ar", "sd", "egag", "nasd", "draft"} & set(on_onnx)
    # The Benchmark tab runs transformers' peers on the torch copy (unchecked at first), so it greys out neither.
    assert 'input[name="hf-generate"]' not in note and 'input[name="onnx-generate"]' not in note
    # A feature head still cannot run assisted generation, and the note keeps that reason first.
    head = benchtab.unavailable_methods(Preset(EMBEDDED, EMBEDDED, EMBEDDED).draft_kind, "onnx", both)
    assert "drafts with a feature head" in head["hf-assisted"]


def test_the_tab_runs_what_the_runtime_cannot_on_the_torch_copy_as_the_benchmark_does_and_a_sweep_refuses_it():
    from specdemo.bench.measure.runners import HF_METHODS
    from specdemo.models.loading import EMBEDDED, EMBEDDED_LM, Preset

    lm_pair, both = Preset(EMBEDDED_LM, EMBEDDED, EMBEDDED_LM), ("torch", "onnx")
    on_copy = benchtab.unavailable_methods(lm_pair.draft_kind, "onnx", both, torch_copy=True)
    assert not {"sd-tree", "egag-tree", "beam", "ar-nocache"} & set(on_copy)
    assert not set(HF_METHODS) & set(on_copy)  # transformers' peers run there too, beside the torch copy's AR
    value, note = benchtab.method_choices(lm_pair, ["ar", "sd-tree", "beam"], runtime="onnx", runtimes=both)
    assert value == ["ar", "sd-tree", "beam"] and 'input[name="sd-tree"]' not in note
    benchtab.refuse_unavailable(["ar", "sd-tree", "beam"], on_copy)  # nothing to refuse
    refused = benchtab.unavailable_methods(lm_pair.draft_kind, "onnx", both)  # a sweep's: one AR for every setting
    with pytest.raises(ValueError, match="sd-tree"):
        benchtab.refuse_unavailable(["ar", "sd-tree"], refused)


def test_the_tab_checks_the_runtime_against_the_pair_before_loading_it():
    from types import SimpleNamespace

    from specdemo.models.loading import EMBEDDED, Preset

    presets = {"local": Preset("local", EMBEDDED, EMBEDDED), "hub": Preset("hub", "someone/model", None),
               "gguf": Preset("gguf", "/nowhere/model.gguf", None)}
    ctx = SimpleNamespace(presets=presets, runtimes=("torch", "onnx"))
    assert benchtab.pair_runtimes(ctx, "local") == ("torch", "onnx") == benchtab.pair_runtimes(ctx, "hub")
    assert benchtab.pair_runtimes(ctx, "gguf") == ("torch",)
    assert benchtab.chosen_runtime(ctx, "local", "") == "torch" and benchtab.chosen_runtime(ctx, "local", "onnx") == "onnx"
    with pytest.raises(ValueError, match="cannot be exported for it: choose torch"):
        benchtab.chosen_runtime(ctx, "gguf", "onnx")
    # On a page whose default is auto, a tab's default is what auto gives the pair (onnx for the embedded one).
    auto = SimpleNamespace(presets=presets, runtimes=("auto", "torch", "onnx"), auto_runtime="onnx")
    assert benchtab.pair_runtimes(auto, "local") == ("onnx", "torch") and benchtab.chosen_runtime(auto, "local", "auto") == "onnx"
    with pytest.raises(ValueError, match="runtime must be one of torch, onnx here, got 'tensorrt'"):
        benchtab.chosen_runtime(ctx, "local", "tensorrt")
    with pytest.raises(ValueError, match="onnx-generate: run beside a target on another runtime: choose the onnx"):
        benchtab.refuse_unavailable(["ar", "onnx-generate"], benchtab.unavailable_methods("model", "torch", ctx.runtimes))


def test_a_suite_on_the_runtime_takes_the_playgrounds_plan_for_it():
    from types import SimpleNamespace

    auto = SimpleNamespace(threads=ThreadPlan(count=None, cores=2))
    assert [benchtab.suite_threads(auto, "torch").for_method(m) for m in ("ar", "sd")] == [1, 1]
    assert [benchtab.suite_threads(auto, "onnx").for_method(m) for m in ("ar", "sd")] == [2, 2]
    assert benchtab.suite_threads(SimpleNamespace(threads=ThreadPlan(count=1)), "onnx").for_method("ar") == 1
    assert benchtab.suite_threads(SimpleNamespace(threads=None), "onnx") is None


def test_the_runtime_and_the_batch_sizes_end_the_endpoints_parameters_and_the_runtimes_peers_need_it(client):
    parameters = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/benchmark"]["parameters"]
    names = [p["parameter_name"] for p in parameters]
    assert names[-4:] == ["suite_file", "group_mt_bench", "runtime", "batch_sizes"] and names[0] == "preset"
    assert parameters[-2]["parameter_default"] == "torch"  # the page's default runtime
    assert parameters[-1]["parameter_default"] == "1"  # one request at a time, as before the setting existed
    with pytest.raises(AppError, match="onnx-generate: run beside a target on another runtime"):
        benchmark(client, methods=["ar", "onnx-generate"], runtime="torch")


def test_the_server_refuses_assisted_generation_on_a_feature_head_pair_clearly(tiny_pair):
    head_pair = type("HeadPair", (), {"draft": object(), "draft_kind": "feature-head", "runtime": "torch",
                                      "target_runtime": None})()
    with pytest.raises(ValueError, match="need a draft language model, and this pair drafts with a feature head"):
        bench.parse_bench_methods(["ar", "hf-assisted"], head_pair)


def test_an_uploaded_question_file_runs_turn_by_turn_with_its_references(client, tmp_path):
    import json

    from gradio_client import handle_file

    questions = [{"question_id": 7, "category": "writing", "turns": ["w5 w6", "w7 w8"]},
                 {"question_id": 8, "category": "translation", "turns": ["w9 w10"], "reference": "w29 w29 w43"}]
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    (status, table, *charts, runs_csv, summary_csv, report, tokens_csv, placeholder, batch_verdict, batch_ratio,
     batch_throughput) = benchmark(client, category="all", methods=["ar", "sd", "beam"],
                                   suite_file=handle_file(str(path)), group_mt_bench=True)
    rows = pd.read_csv(file_of(runs_csv))
    assert set(rows.category) == {"multi_turn", "translation"}
    assert sorted(rows[rows.prompt_id == 7].turn.unique()) == [1, 2]
    assert rows[rows.method == "sd"].matches_ar.all() and rows[rows.method == "beam"].matches_ar.isna().all()
    shown = pd.DataFrame(table["data"], columns=table["headers"])
    assert {"bleu", "chrf", "rougeL"} <= set(shown.columns)
    with pytest.raises(AppError, match="the uploaded suite has no category 'math'"):
        benchmark(client, suite_file=handle_file(str(path)))


def test_grouping_mt_bench_needs_an_uploaded_suite():
    form = benchtab.BenchForm("tiny", "all", 1, 1, 8, ["ar"], 0.0, 3, 3, 0, None, True)
    with pytest.raises(ValueError, match="needs an uploaded question.jsonl"):
        benchtab.read_suite(form)
