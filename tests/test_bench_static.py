"""The bench's GPU-path plumbing on the tiny pair: engine options for our runs, the
hf-generate-static peer and the roofline. No timing thresholds."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
import torch

from specdemo import bench, cli
from specdemo.bench.measure.roofline import (
    ROOFLINE_COLUMNS, device_bandwidth, kv_bytes_per_token, mean_context_length, parameter_bytes, parse_bandwidth,
)
from specdemo.bench.measure.runners import HFRunner
from specdemo.engine.params import DecodeParams

pytestmark = pytest.mark.usefixtures("one_thread")

SUITE = [{"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "summarisation"},
         {"prompt": "w11 w12 w13", "category": "chat"}]


def model_args(pair):
    return ["--target", pair.target_ref, "--draft", pair.draft_ref, "--device", "cpu", "--dtype", "float64"]


def write_suite(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def test_run_benchmark_passes_the_cache_to_our_runs(tiny_pair):
    result = bench.run_benchmark(tiny_pair, SUITE, ["ar", "sd", "hf-generate"], repeats=1, warmup=False,
                                 max_new_tokens=6, cache="static")
    rows = result.rows
    assert (rows.error == "").all() and rows.matches_ar.astype(bool).all()
    assert set(rows[rows.method != "hf-generate"].cache) == {"static"}
    assert set(rows[rows.method == "hf-generate"].cache) == {"dynamic"}
    assert (rows[rows.method != "hf-generate"].compile_seconds == 0).all()
    assert result.meta["cache"] == "static" and result.meta["compile"] is False
    overall = result.summary[result.summary.category == bench.ALL].set_index("method")
    assert overall.loc["ar", "cache"] == "static" and overall.loc["ar", "compile_seconds"] == 0
    with pytest.raises(ValueError, match="compile"):
        bench.run_benchmark(tiny_pair, SUITE, ["ar"], repeats=1, warmup=False, cache="dynamic", compile=True)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hf_generate_static_eager_matches_hf_generate_and_our_ar(tiny_pair, temperature):
    """The static peer with its compile switched off: same tokens as hf-generate (greedy: as our AR too)."""
    params = DecodeParams(max_new_tokens=20, temperature=temperature, top_k=8)
    runner = HFRunner(tiny_pair, params, compile_static=False)
    config = runner._config_for("hf-generate-static", 20, prompt_length=10)
    assert config.cache_implementation == "static" and config.max_cache_len == 256 and config.disable_compile
    for prompt in ("w5 w6 w7", "w30 w31 w32 w33 w34 w35"):
        ids = tiny_pair.encode(prompt, chat=False)
        static = runner.run("hf-generate-static", ids, seed=3)
        dynamic = runner.run("hf-generate", ids, seed=3)
        assert static.token_ids == dynamic.token_ids and len(static.token_ids) > 0
        assert static.stats["cache"] == "static" and dynamic.stats["cache"] == "dynamic"
        assert static.rounds == [(0, 0)] * len(static.token_ids)
        if temperature == 0.0:
            from specdemo import generate

            assert static.token_ids == generate(tiny_pair, ids, "ar", max_new_tokens=20).token_ids


def test_hf_generate_static_asks_transformers_to_compile_on_any_device(tiny_pair):
    config = HFRunner(tiny_pair, DecodeParams(max_new_tokens=8))._config_for("hf-generate-static", 8, 300)
    assert config.max_cache_len == 512 and not config.disable_compile
    assert config.compile_config.mode == "default" and config.compile_config._compile_all_devices


@pytest.mark.slow
def test_hf_generate_static_compiled_in_the_bench(tmp_path_factory):
    """torch.compile on CPU (tens of seconds): compiled in the warm-up, same greedy tokens as our AR. On the
    one-layer float32 pair the other compiled tests run: transformers' one-token step has their steps' shapes,
    so most of its kernels are compiled once per run."""
    from tests.tiny import build_tiny_pair

    tiny_pair = build_tiny_pair(tmp_path_factory.mktemp("tiny32-one-layer"), dtype="float32", draft_noise=0.3,
                                layers=1)
    result = bench.run_benchmark(tiny_pair, SUITE, ["ar", "hf-generate", "hf-generate-static"], repeats=1,
                                 max_new_tokens=10)
    rows = result.rows
    assert (rows.error == "").all() and rows.matches_ar.astype(bool).all()
    assert hasattr(tiny_pair.target, "_compiled_call")  # transformers' compiled forward was used
    overall = result.summary[result.summary.category == bench.ALL].set_index("method")
    assert math.isfinite(overall.loc["ar", "speedup_vs_hf_static"])


def test_mean_context_and_bandwidth_parsing():
    # 2 tokens after 10 prompt positions read 10 and 11; 4 after 3 read 3..6.
    assert mean_context_length([10, 3], [2, 4]) == pytest.approx((10 + 11 + 3 + 4 + 5 + 6) / 6)
    assert math.isnan(mean_context_length([5], [0]))
    assert parse_bandwidth("1e9") == 1e9 and parse_bandwidth(2.0e12) == 2.0e12
    assert parse_bandwidth("H100 SXM") == 3.35e12 and parse_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    for bad in ("fast", "0", "-1e9", "inf"):
        with pytest.raises(ValueError, match="bandwidth"):
            parse_bandwidth(bad)
    assert device_bandwidth("cpu") == (None, "cpu")
    assert device_bandwidth("cpu", "1e9") == (1e9, "cpu")


def test_bench_roofline_with_a_given_bandwidth(tiny_pair, tmp_path, capsys):
    suite = write_suite(tmp_path / "suite.jsonl", SUITE)
    csv, report = tmp_path / "rows.csv", tmp_path / "report.html"
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--methods", "ar,sd",
                     "--max-new-tokens", "8", "--repeats", "1", "--no-warmup", "--quiet", "--roofline",
                     "--bandwidth", "1e9", "--csv", str(csv), "--report", str(report), "--plotlyjs", "cdn"])
    out = capsys.readouterr().out
    assert code == 0
    rows, summary = pd.read_csv(csv), pd.read_csv(tmp_path / "rows.summary.csv")
    assert all(c in summary for c in ROOFLINE_COLUMNS)
    # By hand: the target's bytes per token at the AR runs' mean context, 1e9 B/s.
    ar = rows[rows.method == "ar"]
    context = mean_context_length(ar.prompt_tokens, ar.new_tokens)
    weights = parameter_bytes(tiny_pair.target)
    per_token = weights + kv_bytes_per_token(tiny_pair.target.config, 8) * context  # float64: 8 bytes
    row = summary[(summary.category == "all") & (summary.method == "ar")].iloc[0]
    assert row.context_length == pytest.approx(context)
    assert row.bytes_per_token == pytest.approx(per_token)
    assert row.roofline_tokens_per_s == pytest.approx(1e9 / per_token)
    assert row.roofline_fraction == pytest.approx(row.tokens_per_s_mean / row.roofline_tokens_per_s)
    assert f"bound {1e9 / per_token:,.1f} tokens/s" in out and "ar: " in out and "% of the bound" in out
    assert "draft reads" in out
    meta = json.loads((tmp_path / "rows.meta.json").read_text())
    assert meta["roofline"]["bandwidth"] == 1e9 and meta["roofline"]["ar_fraction"] == pytest.approx(
        row.roofline_fraction)
    assert "Roofline" in report.read_text() and "roofline_fraction" in report.read_text()


def test_bench_roofline_on_cpu_says_no_bandwidth_is_known(tiny_pair, tmp_path, capsys):
    suite = write_suite(tmp_path / "suite.jsonl", SUITE[:1])
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--methods", "ar",
                     "--max-new-tokens", "4", "--repeats", "1", "--no-warmup", "--quiet", "--roofline"])
    out = capsys.readouterr().out
    assert code == 0
    assert "no memory bandwidth is known for this device (cpu)" in out and "MB per token" in out
    assert cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--bandwidth", "fast"]) == 2
    assert "bandwidth: no nominal figure for 'fast'" in capsys.readouterr().err


def test_synthetic_qwen_shapes(tmp_path):
    from specdemo import load_pair
    from specdemo.bench import synthetic

    assert synthetic.SIZES["qwen2.5-1.5b"] == ("qwen2", 1536, 28, 12, 2, 8960)
    assert synthetic.SIZES["qwen2.5-0.5b"] == ("qwen2", 896, 24, 14, 2, 4864)
    assert synthetic.main(["--out", str(tmp_path), "--target-size", "qwen2.5-tiny", "--draft-size", "qwen2.5-tiny",
                           "--vocab", "1024", "--dtype", "float32"]) == 0
    pair = load_pair(str(tmp_path / "target"), str(tmp_path / "draft"), device="cpu", runtime="torch")
    config = pair.target.config
    assert config.model_type == "llama" and config.num_key_value_heads == 2 and config.tie_word_embeddings
    result = bench.run_benchmark(pair, SUITE[:1], ["ar", "sd"], repeats=1, warmup=False, max_new_tokens=4,
                                 cache="static")
    assert (result.rows.error == "").all() and result.rows.matches_ar.astype(bool).all()
