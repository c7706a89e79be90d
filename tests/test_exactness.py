"""What greedy output promises against AR on a target as loaded, decided by one rule
(`models.precision.verification_exactness`) and shown on every surface: the trace, the comparison
and benchmark tables, the compare printout, the report and the Playground."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

import specdemo
from specdemo.bench.measure.tables import summary_frame
from specdemo.engine.decoding import generate
from specdemo.models.loading import ModelPair
from specdemo.models.precision import (BIT_EXACT, exactness_sentence, is_exact, mismatch_reading,
                                       verification_exactness)
from tests.tiny import build_tiny_pair

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [1, 5, 9, 13, 17]
GREEDY = dict(max_new_tokens=6, temperature=0.0, seed=0)
NEAR_TIES = "up to near-ties at int8-weight-only"


@pytest.mark.parametrize("precision, device, attention, runtime, expected", [
    ("float32", "cpu", "sdpa", "torch", "exact at float32"),
    ("float32", "cuda", "sdpa", "torch", "exact at float32"),
    ("float64", "cpu", "eager", "torch", "exact at float64"),
    # Row-exact by construction: each verified row goes through the linears and sdpa alone.
    ("int8", "cpu", "sdpa", "torch", BIT_EXACT),
    ("int8-dynamic", "cpu", "sdpa", "torch", BIT_EXACT),
    ("bfloat16", "cpu", "sdpa", "torch", "up to near-ties at bfloat16"),  # unless SPECDEMO_ROW_EXACT_HALF=1
    ("float16", "cpu", "sdpa", "torch", "up to near-ties at float16"),
    # Half precision on a GPU: batched kernels, a near-tie can flip.
    ("bfloat16", "cuda", "sdpa", "torch", "up to near-ties at bfloat16"),
    ("float16", "cuda", "sdpa", "torch", "up to near-ties at float16"),
    # torchao keeps float activations and its own batched kernels, on any device.
    ("int8", "cuda", "sdpa", "torch", "up to near-ties at int8"),
    ("int8-weight-only", "cpu", "sdpa", "torch", "up to near-ties at int8-weight-only"),
    ("int8-dynamic-activation", "cpu", "sdpa", "torch", "up to near-ties at int8-dynamic-activation"),
    ("int4", "cpu", "sdpa", "torch", "up to near-ties at int4"),
    ("int4", "cuda", "sdpa", "torch", "up to near-ties at int4"),
    # Row-by-row attention wraps sdpa only.
    ("int8", "cpu", "eager", "torch", "up to near-ties at int8"),
    ("bfloat16", "cpu", "eager", "torch", "up to near-ties at bfloat16"),
    ("bfloat16", "cpu", "encoder-decoder", "torch", "up to near-ties at bfloat16"),
    # Another runtime's verification is its own.
    ("float32", "cpu", "sdpa", "onnx", "exact at float32"),
    ("int8", "cpu", "sdpa", "onnx", "up to near-ties at int8"),
])
def test_the_rule_says_which_targets_verify_their_rows_exactly(precision, device, attention, runtime, expected):
    assert verification_exactness(precision, device, attention, runtime) == expected
    assert is_exact(expected) is not expected.startswith("up to near-ties")


@pytest.mark.parametrize("precision, device, attention, expected", [
    ("bfloat16", "cpu", "sdpa", BIT_EXACT),
    ("float16", "cpu", "sdpa", BIT_EXACT),
    ("bfloat16", "cuda", "sdpa", "up to near-ties at bfloat16"),
    ("bfloat16", "cpu", "eager", "up to near-ties at bfloat16"),
    ("int4", "cpu", "sdpa", "up to near-ties at int4"),
])
def test_the_switch_makes_a_cpus_half_precision_targets_row_exact_and_nothing_else(monkeypatch, precision, device,
                                                                                    attention, expected):
    monkeypatch.setenv("SPECDEMO_ROW_EXACT_HALF", "1")
    assert verification_exactness(precision, device, attention) == expected


def test_a_mismatch_reads_as_a_fault_only_where_the_verification_is_exact():
    assert mismatch_reading(BIT_EXACT) == mismatch_reading("exact at float32") == "differs from AR"
    assert mismatch_reading("up to near-ties at bfloat16") == "differs from AR: not lossless at bfloat16"
    assert exactness_sentence("up to near-ties at bfloat16").startswith("not lossless at this precision")
    assert "bit for bit" in exactness_sentence(BIT_EXACT) and exactness_sentence("") == ""


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("exactness")
    build_tiny_pair(root, dtype="float32")
    return str(root / "target"), str(root / "draft")


@pytest.fixture(scope="module")
def weight_only_pair(folders):
    """A target whose verification is not row-exact on any device: torchao's int8 weight-only."""
    pytest.importorskip("torchao")
    return specdemo.load_pair(*folders, device="cpu", target_dtype="int8-weight-only", draft_dtype="float32")


@pytest.mark.parametrize("target_dtype, switch, expected", [
    ("float32", "0", "exact at float32"), ("int8", "0", BIT_EXACT),
    ("bfloat16", "0", "up to near-ties at bfloat16"), ("bfloat16", "1", BIT_EXACT),
])
def test_the_trace_records_the_pairs_exactness(folders, monkeypatch, target_dtype, switch, expected):
    monkeypatch.setenv("SPECDEMO_ROW_EXACT_HALF", switch)
    pair = specdemo.load_pair(*folders, device="cpu", target_dtype=target_dtype)
    result = generate(pair, PROMPT, method="sd", **GREEDY)
    assert pair.exactness == result.exactness == result.stats["exactness"] == expected


def test_the_trace_of_a_near_tie_target_says_so(weight_only_pair):
    assert generate(weight_only_pair, PROMPT, method="ar", **GREEDY).exactness == NEAR_TIES


def test_a_bfloat16_target_on_a_gpu_is_labelled_up_to_near_ties(folders, monkeypatch):
    monkeypatch.setenv("SPECDEMO_ROW_EXACT_HALF", "1")
    pair = specdemo.load_pair(folders[0], device="cpu", target_dtype="bfloat16")
    assert pair.exactness == BIT_EXACT
    monkeypatch.setattr(ModelPair, "device", property(lambda self: torch.device("cuda")))
    assert pair.exactness == "up to near-ties at bfloat16"


def test_the_comparison_table_and_the_page_show_the_label_and_read_a_mismatch_by_it(weight_only_pair, folders):
    from specdemo.app import viz
    from specdemo.app.handlers import done_status

    results = [generate(weight_only_pair, PROMPT, method=m, **GREEDY) for m in ("ar", "sd")]
    summary = summary_frame(results, pair=weight_only_pair)
    assert summary.exactness.tolist() == [NEAR_TIES, NEAR_TIES]
    summary.loc[summary.method == "sd", "matches_ar"] = False  # as a near-tie flipped
    quality = viz.display_table(summary).set_index("method")["quality"]
    assert quality.tolist() == [f"reference ({NEAR_TIES})", "differs from AR: not lossless at int8-weight-only"]

    exact_pair = specdemo.load_pair(*folders, device="cpu")
    exact_results = [generate(exact_pair, PROMPT, method=m, **GREEDY) for m in ("ar", "sd")]
    exact = summary_frame(exact_results, pair=exact_pair)
    exact.loc[exact.method == "sd", "matches_ar"] = False
    assert viz.display_table(exact)["quality"].tolist() == ["reference (exact at float32)", "differs from AR"]

    request = type("Request", (), {"note": ""})()
    assert "Not lossless at this precision" in done_status(request, results, [], 1.0)
    assert "lossless" not in done_status(request, exact_results, [], 1.0)
    assert NEAR_TIES not in viz.legend_html() and "up to near-ties" in viz.legend_html()


def test_the_compare_command_prints_the_label_and_writes_its_column(folders, tmp_path, capsys):
    from specdemo import cli
    from specdemo.cli.compare import mismatch_lines

    pytest.importorskip("torchao")
    summary_csv = tmp_path / "summary.csv"
    assert cli.main(["compare", "--prompt", "w5 w6 w7 w8", "--target", folders[0], "--draft", folders[1], "--device",
                     "cpu", "--target-dtype", "int8-weight-only", "--draft-dtype", "float32", "--methods", "ar,sd",
                     "--max-new-tokens", "6", "--no-vs-fp32", "--csv", str(summary_csv)]) == 0
    out = capsys.readouterr().out
    assert f"exactness {NEAR_TIES}: not lossless at this precision" in out
    assert pd.read_csv(summary_csv).exactness.tolist() == [NEAR_TIES, NEAR_TIES]
    differing = pd.DataFrame({"label": ["SD", "EGAG"], "matches_ar": [False, False],
                              "exactness": [NEAR_TIES, BIT_EXACT]})
    assert mismatch_lines(differing) == [
        "SD: differs from AR: not lossless at int8-weight-only (its rounding, not a fault of the method)",
        "EGAG: differs from AR"]


def test_the_benchmark_rows_summary_and_report_carry_the_label(weight_only_pair):
    from specdemo.bench import run_benchmark
    from specdemo.bench.measure.report import _precisions

    result = run_benchmark(weight_only_pair, [{"prompt": "w5 w6 w7 w8", "category": "chat"}], ["ar", "sd"],
                           repeats=1, warmup=False, max_new_tokens=4, temperature=0.0, chat=False)
    assert result.rows.exactness.tolist() == [NEAR_TIES, NEAR_TIES]
    assert set(result.summary.exactness) == {NEAR_TIES}
    assert result.meta["exactness"] == NEAR_TIES
    assert "not lossless at this precision" in _precisions(result.meta)
