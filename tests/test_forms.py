"""The page's API as a client meets it: endpoint docstrings and parameter descriptions written from the
schema, and the served page's view_api(): four described endpoints, plainly named and typed parameters,
named outputs, docs/api.md in agreement, /compare and /benchmark driven through gradio_client."""

from __future__ import annotations

import re

import pandas as pd
import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client.utils import sanitize_parameter_names  # noqa: E402

import gradio as gr  # noqa: E402
import gradio.utils  # noqa: E402

from specdemo.app import forms  # noqa: E402
from specdemo.engine.methods import METHODS  # noqa: E402
from specdemo.engine.params import PARAMS  # noqa: E402
from tests import api_doc  # noqa: E402
from tests.uiserver import TINY, serve  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")


def handler(form, request):
    """Echo the form.

    Anything after the first paragraph is not the endpoint's description."""
    return form


def test_an_endpoints_docstring_gives_gradio_its_description_and_every_parameters_meaning():
    fn = forms.endpoint(handler, ("prompt",), params=("gamma", "entropy_stop", "gamma_min"),
                        helps={"prompt": "the text to continue"})
    description, meanings, _ = gradio.utils.get_function_description(fn)
    assert description == "Echo the form."
    assert meanings["prompt"] == "the text to continue"
    assert meanings["gamma"] == f"SD / NASD: {PARAMS['gamma'].help}"  # the schema's help, led by its methods
    assert meanings["entropy_stop"] == PARAMS["entropy_stop"].help  # which names its methods itself
    assert meanings["gamma_min"] == f"EGAG: {PARAMS['gamma_min'].help}"
    assert fn("p", gamma=2) == {"prompt": "p", "gamma": 2, "entropy_stop": None, "gamma_min": None}


def test_an_endpoint_parameter_without_a_meaning_is_refused():
    with pytest.raises(KeyError, match="'colour' has no description"):
        forms.endpoint(handler, ("colour",), params=())


def test_view_api_shows_each_inputs_meaning_beside_it():
    fn = forms.endpoint(handler, ("prompt",), params=("gamma",), helps={"prompt": "the text to continue"})
    with gr.Blocks():
        prompt, gamma = gr.Textbox(), gr.Number()
        forms.describe_inputs(fn, [prompt, gamma])
        assert prompt.api_info_as_input()["additional_description"] == "the text to continue"
        assert gamma.api_info_as_input() == {**gr.Number().api_info_as_input(),
                                             "additional_description": f"SD / NASD: {PARAMS['gamma'].help}"}
        with pytest.raises(ValueError, match="1 inputs for the 2 parameters"):
            forms.describe_inputs(fn, [prompt])


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve(tmp_path_factory.mktemp("api-pair")) as (url, demo):
        client = gradio_client.Client(url, verbose=False)
        yield client, client.view_api(return_format="dict", print_info=False), demo


def test_the_page_exposes_four_endpoints_each_described(served):
    _, api, demo = served
    assert list(api["named_endpoints"]) == ["/run", "/compare", "/benchmark", "/sweep"]
    assert api["unnamed_endpoints"] == {}
    # Nor is any of the page's own events callable unlisted (Gradio's "undocumented", e.g. the examples').
    assert [fn.api_name for fn in demo.fns.values() if fn.api_visibility != "private"] == [
        "run", "compare", "benchmark", "sweep"]
    for path, endpoint in api["named_endpoints"].items():
        assert len(endpoint["description"].split()) >= 8, path


def test_every_parameter_is_named_plainly_and_says_what_it_means(served):
    _, api, _ = served
    for path, endpoint in api["named_endpoints"].items():
        for p in endpoint["parameters"]:
            name = p["parameter_name"]
            assert re.fullmatch(r"[a-z][a-z0-9_]*[a-z0-9]", name), (path, name)
            assert len(p["python_type"]["description"].split()) >= 3, (path, name)


def test_every_output_is_named(served):
    client, api, _ = served
    for path, endpoint in api["named_endpoints"].items():
        labels = [sanitize_parameter_names(r["label"]) for r in endpoint["returns"]]
        assert labels and all(label and not re.fullmatch(r"value_\d+", label) for label in labels), path
        assert len(set(labels)) == len(labels), path
    assert not re.search(r"value_\d+", client.view_api(print_info=False, return_format="str"))


def test_methods_is_a_list_of_method_names(served):
    _, api, _ = served
    for path, endpoint in api["named_endpoints"].items():
        (methods,) = [p for p in endpoint["parameters"] if p["parameter_name"] == "methods"]
        assert methods["component"] == "Checkboxgroup", path
        assert methods["python_type"]["type"].startswith("list[Literal['"), path
        assert set(methods["type"]["items"]["enum"]) >= {"sd", "egag"}, path
    compare = api["named_endpoints"]["/compare"]["parameters"]
    assert next(p for p in compare if p["parameter_name"] == "methods")["type"]["items"]["enum"] == list(METHODS)


def test_docs_api_md_says_what_view_api_says(served):
    _, api, _ = served
    assert api_doc.written() == api_doc.section(api), "docs/api.md is out of date: python -m tests.api_doc"


def test_the_reference_names_the_runtimes_default_as_view_api_does(served):
    _, api, _ = served
    for path, default in (("/run", "auto"), ("/compare", "auto"), ("/benchmark", "torch"), ("/sweep", "torch")):
        (runtime,) = [p for p in api["named_endpoints"][path]["parameters"] if p["parameter_name"] == "runtime"]
        assert runtime["parameter_default"] == default, path
    assert '| `runtime` | `str` | `"auto"` |' in api_doc.written()
    assert '| `runtime` | `str` | `"torch"` |' not in api_doc.written().split("### `/benchmark`")[0]


def test_compare_and_benchmark_run_through_gradio_client_with_the_documented_names(served):
    client, _, _ = served
    summary, summary_csv, _, texts, _ = client.predict(prompt="w3 w4 w5 w6", preset=TINY, methods=["ar", "sd"],
                                                      max_new_tokens=4, api_name="/compare")
    assert [row[0] for row in summary["data"]] == ["ar", "sd"]
    assert list(pd.read_csv(summary_csv)["method"]) == ["ar", "sd"] and set(texts) == {"ar", "sd"}

    job = client.submit(preset=TINY, category="math", prompts_per_category=1, repeats=1, max_new_tokens=4,
                        methods=["ar", "sd"], api_name="/benchmark")
    status, table, *_ = job.result(timeout=300)
    rows = [dict(zip(table["headers"], row)) for row in table["data"]]
    assert [row["method"] for row in rows if row["category"] == "math"] == ["AR", "SD"], rows
    assert all(not row["errors"] for row in rows)
