"""`python -m specdemo sweep` end to end on the tiny random pair; no timing thresholds."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from specdemo import cli
from specdemo.bench import sweep

pytestmark = pytest.mark.usefixtures("one_thread")

SUITE = [
    {"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "summarisation"},
    {"prompt": "w11 w12 w13 w14", "category": "chat"},
    {"prompt": "w30 w31 w32", "category": "code"},
]


@pytest.fixture
def suite(tmp_path):
    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in SUITE), encoding="utf-8")
    return path


def model_args(pair):
    return ["--target", pair.target_ref, "--draft", pair.draft_ref, "--device", "cpu", "--dtype", "float64"]


def test_sweep_is_a_registered_subcommand():
    assert "sweep" in cli.SUBCOMMANDS


def test_sweep_command_end_to_end(tiny_pair, suite, tmp_path, capsys):
    csv, report = tmp_path / "out" / "sweep.csv", tmp_path / "out" / "sweep.html"
    code = cli.main(["sweep", *model_args(tiny_pair), "--suite", str(suite), "--categories", "summarisation,chat",
                     "--gamma", "1,3", "--gamma-max", "4", "--ema", "0,0.9", "--ngram-n", "2",
                     "--max-new-tokens", "10", "--repeats", "2", "--no-warmup", "--threads", "1",
                     "--csv", str(csv), "--report", str(report), "--plotlyjs", "cdn", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = pd.read_csv(csv)
    assert list(rows.columns) == sweep.ROW_COLUMNS
    # AR + 2 SD + 2 EGAG + 1 NASD settings, on 2 prompts, twice.
    assert len(rows) == 6 * 2 * 2
    assert sorted(rows.setting.unique()) == sorted(["ar", "sd:gamma=1", "sd:gamma=3", "egag:gamma_max=4,ema=0",
                                                    "egag:gamma_max=4,ema=0.9", "nasd:gamma=3,ngram_n=2"])
    assert set(rows.category) == {"summarisation", "chat"}
    assert rows.loc[rows.method != "ar", "matches_ar"].astype(bool).all()  # greedy is lossless
    assert rows.loc[rows.method == "sd", "gamma_max"].isna().all()  # settings that do not apply are empty
    summary = pd.read_csv(tmp_path / "out" / "sweep.summary.csv")  # next to --csv by default
    assert list(summary.columns) == sweep.SUMMARY_COLUMNS and len(summary) == 6
    assert "EGAG (γ_max 4, EMA" in out and "best fixed γ" in out and "best NASD" in out
    assert "SD γ=3" in out and f"wrote {csv}" in out and f"wrote {report}" in out
    assert "Speculative decoding sweep" in report.read_text(encoding="utf-8")


@pytest.mark.parametrize("extra, message", [
    (["--gamma", "0"], "gamma must be an integer from 1 to 64"),
    (["--methods", "sd,eagle"], "unknown 'eagle'"),
    (["--ema", "1"], "ema must be a number in [0, 1)"),
    (["--copy-n", "0,1"], "copy_n must be 0 (off) or an integer from 2 to 16"),
    (["--repeats", "0"], "repeats must be an integer ≥ 1"),
    (["--categories", "poetry"], "no prompts in category 'poetry'"),
    (["--temperature", "-1"], "temperature must be a number ≥ 0"),
])
def test_bad_arguments_fail_with_a_message_and_status_2(tiny_pair, suite, capsys, extra, message):
    assert cli.main(["sweep", *model_args(tiny_pair), "--suite", str(suite), "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_sampled_sweep_leaves_matches_ar_empty(tiny_pair, suite, tmp_path, capsys):
    csv = tmp_path / "sampled.csv"
    code = cli.main(["sweep", *model_args(tiny_pair), "--suite", str(suite), "--limit", "1", "--categories", "code",
                     "--methods", "sd", "--gamma", "2", "--temperature", "0.8", "--seed", "5", "--repeats", "1",
                     "--max-new-tokens", "6", "--no-warmup", "--csv", str(csv), "--quiet"])
    assert code == 0, capsys.readouterr().err
    rows = pd.read_csv(csv)
    assert list(rows.method) == ["ar", "sd"] and rows.matches_ar.isna().all()


def test_chart_png_without_playwright_says_what_to_install(monkeypatch, tmp_path):
    import sys

    import plotly.graph_objects as go

    from specdemo.bench.measure.chartpng import ChartPngError, save_chart_png

    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)
    with pytest.raises(ChartPngError, match="pip install playwright"):
        save_chart_png(go.Figure(), tmp_path / "chart.png")


@pytest.mark.slow
def test_chart_png_renders_a_sweep_chart(tmp_path):
    pytest.importorskip("playwright.sync_api")
    from specdemo.bench.measure.chartpng import save_chart_png
    from tests.test_browser import CHROMIUM, NO_CHROMIUM

    if CHROMIUM is None:
        pytest.skip(NO_CHROMIUM)
    rows = [{"method": "sd", "setting": "sd:gamma=2", "label": "SD γ=2", "gamma": 2, "prompt_id": "p", "repeat": 0,
             "speedup_vs_ar": 1.2, "new_tokens": 10, "seconds": 1.0, "rounds": 5, "drafted": 10, "accepted": 5,
             "rejected_rounds": 3, "mean_gamma": 2.0}]
    figure = sweep.sweep_figures(sweep.summarize_sweep(rows))["speedup_vs_gamma"]
    path = save_chart_png(figure, tmp_path / "chart.png", width=640, height=360)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000


def test_precision_and_cache_axes_run_the_grid_once_per_combination(tiny_pair, suite, tmp_path, capsys):
    csv, report = tmp_path / "axes" / "sweep.csv", tmp_path / "axes" / "sweep.html"
    code = cli.main(["sweep", *model_args(tiny_pair), "--suite", str(suite), "--limit", "1", "--categories", "chat",
                     "--methods", "sd", "--gamma", "2", "--max-new-tokens", "8", "--repeats", "1", "--no-warmup",
                     "--target-dtype", "float64,float32", "--draft-kv", "full,streaming", "--kv-budget", "6",
                     "--kv-sinks", "2", "--csv", str(csv), "--report", str(report), "--plotlyjs", "cdn", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = pd.read_csv(csv)
    # 2 precisions × 2 draft caches, each with AR and SD on one prompt.
    assert list(rows.columns[:3]) == ["target_dtype", "draft_kv", "kv_budget"]
    assert len(rows) == 8 and rows.groupby(["target_dtype", "draft_kv"]).size().eq(2).all()
    assert rows.loc[rows.method == "sd", "matches_ar"].astype(bool).all()  # the draft's cache is lossless
    summary = pd.read_csv(tmp_path / "axes" / "sweep.summary.csv")
    assert len(summary) == 8 and set(summary.target_dtype) == {"float64", "float32"}
    axes = pd.read_csv(tmp_path / "axes" / "sweep.axes.csv")
    assert list(axes[["target_dtype", "draft_kv"]].itertuples(index=False, name=None)) == [
        ("float64", "full"), ("float64", "streaming"), ("float32", "full"), ("float32", "streaming")]
    assert axes.ar_vs_first.iloc[0] == pytest.approx(1.0) and (axes.best == "SD γ=2").all()
    peaks = axes.set_index(["target_dtype", "draft_kv"]).draft_kv_bytes_peak
    for dtype in ("float64", "float32"):
        assert 0 < peaks[dtype, "streaming"] <= peaks[dtype, "full"]  # a short prompt: budget ≈ its length
    sd = summary[summary.method == "sd"].set_index(["target_dtype", "draft_kv"])
    assert peaks.to_dict() == sd.draft_kv_bytes_peak.to_dict()  # the best setting's, from the summary
    assert (axes.best_tokens_per_s > 0).all() and axes.best_vs_ar.str.startswith("under 3 prompts").all()
    assert "== target_dtype=float32, draft_kv=streaming, kv_budget=6" in out
    assert (tmp_path / "axes" / "sweep.target_dtype-float32.draft_kv-streaming.kv_budget-6.html").exists()


@pytest.mark.parametrize("extra, message", [
    (["--kv-budget", "2,x"], "kv_budget must be whole numbers"),
    (["--draft-kv", "full,window"], "draft_kv"),
    (["--kv-budget", "2", "--kv-sinks", "4", "--draft-kv", "streaming"], "kv_budget"),
    (["--kv-budget", "64,0"], "kv_budget must be whole numbers of positions ≥ 1, e.g. 128,256; got '0'"),
    (["--draft-kv", "full,H2O"], "draft_kv must be one of full, streaming, l2, head, got 'H2O'"),
    (["--target-dtype", "float32,fp8"], "target_dtype: dtype must be one of"),
    (["--draft-kv", "head", "--kv-budget", "9"], "kv_budget (9) must be at least kv_sinks (4) + the 8 newest"),
    (["--long", "1024"], "--long and --suite name two suites: give one"),
])
def test_bad_axes_fail_before_any_pair_loads(tiny_pair, suite, capsys, extra, message):
    assert cli.main(["sweep", *model_args(tiny_pair), "--suite", str(suite), "--quiet", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err


def test_long_sweeps_the_long_suite_cut_in_the_targets_tokens(tiny_pair, tmp_path, capsys):
    assert cli.main(["sweep", *model_args(tiny_pair), "--long", "1024,x", "--quiet"]) == 2
    assert "--long takes prompt lengths in tokens, each ≥ 64" in capsys.readouterr().err
    csv = tmp_path / "long.csv"
    code = cli.main(["sweep", *model_args(tiny_pair), "--long", "64,96", "--long-per-length", "2", "--methods", "sd",
                     "--gamma", "2", "--max-new-tokens", "4", "--repeats", "1", "--no-warmup", "--draft-kv", "head",
                     "--kv-budget", "32", "--csv", str(csv), "--quiet"])
    assert code == 0, capsys.readouterr().err
    rows = pd.read_csv(csv)
    sd = rows[rows.method == "sd"].set_index("prompt_id")
    assert sorted(sd.index) == ["long-64-0", "long-64-1", "long-96-0", "long-96-1"]
    assert sd.prompt_tokens["long-96-0"] - sd.prompt_tokens["long-64-0"] == 32  # cut to the lengths asked
    assert sd.matches_ar.astype(bool).all()  # a head draft cache stays lossless
