"""The bench command end to end on the tiny random pair; no timing thresholds."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from specdemo import bench, cli

pytestmark = pytest.mark.usefixtures("one_thread")

# Two prompts: one repeats itself (prompt lookup finds matches), one is a multi-turn chat.
SUITE = [
    {"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "summarisation"},
    {"prompt": "w11 w12 w13", "category": "chat",
     "messages": [{"role": "user", "content": "w20 w21"}, {"role": "assistant", "content": "w22 w23"},
                  {"role": "user", "content": "w11 w12 w13"}]},
]
METHODS = "ar,sd,nasd,hf-generate,hf-assisted,hf-prompt-lookup"


def write_suite(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def model_args(pair):
    return ["--target", pair.target_ref, "--draft", pair.draft_ref, "--device", "cpu", "--dtype", "float64"]


def test_bench_command_end_to_end(tiny_pair, tmp_path, capsys):
    suite = write_suite(tmp_path / "suite.jsonl", SUITE)
    csv, report = tmp_path / "out" / "rows.csv", tmp_path / "out" / "report.html"
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--methods", METHODS,
                     "--max-new-tokens", "12", "--repeats", "2", "--chat", "--csv", str(csv),
                     "--report", str(report), "--plotlyjs", "cdn", "--quiet"])
    assert code == 0, capsys.readouterr().err

    rows = pd.read_csv(csv)
    assert list(rows.columns) == bench.ROW_COLUMNS
    methods = METHODS.split(",")
    assert len(rows) == len(SUITE) * len(methods) * 2
    assert set(rows.method) == set(methods)
    assert (rows.error.isna()).all()
    assert (rows.new_tokens > 0).all() and (rows.new_tokens <= 12).all()
    # Greedy in float64: every method, transformers' included, reproduces our AR exactly.
    assert rows.matches_ar.astype(bool).all()
    # Interleaving: within a (repeat, prompt) every method has its own slot, and the order rotates.
    slots = rows.groupby(["repeat", "prompt_index"]).order.apply(sorted)
    assert all(s == list(range(len(methods))) for s in slots)
    assert rows[rows.method == "ar"].order.nunique() > 1

    assisted = rows[rows.method == "hf-assisted"]
    assert (assisted.mean_gamma == 3).all()  # the default γ, constant
    assert (assisted.drafted <= 3 * assisted.rounds).all() and (assisted.drafted > 0).all()
    assert assisted.acceptance_rate.between(0, 1).all()

    summary = pd.read_csv(tmp_path / "out" / "rows.summary.csv")
    assert list(summary.columns) == bench.SUMMARY_COLUMNS
    assert set(summary.category) == {"summarisation", "chat", "all"}
    everything = summary[summary.category == "all"].set_index("method")
    assert everything.loc["ar", "speedup_vs_ar"] == pytest.approx(1.0)
    assert everything.loc["hf-generate", "speedup_vs_hf"] == pytest.approx(1.0)
    assert everything.exact_match_pct.eq(100).all()
    assert math.isfinite(everything.loc["sd", "predicted_speedup"])
    assert math.isfinite(everything.loc["sd", "cost_ratio"])
    # SD copies the rounds where the repeating prompt continues itself; the peers never count as copying.
    sd = rows[rows.method == "sd"]
    assert (sd.copied_rounds <= sd.rounds).all() and sd.copied_rounds.sum() > 0
    assert everything.loc["sd", "copied_share"] == pytest.approx(sd.copied_rounds.sum() / sd.rounds.sum())
    assert everything.loc["ar", "copied_share"] == 0 and math.isnan(everything.loc["hf-generate", "copied_share"])

    page = report.read_text(encoding="utf-8")
    for name in ("speedup_vs_ar", "speedup_vs_hf", "tokens_per_s", "acceptance", "predicted_vs_measured"):
        assert f'id="fig-{name}"' in page
    assert "Plotly.newPlot" in page and "cdn.plot.ly" in page
    assert "speedup vs R" in page  # the definitions travel with the numbers


def test_api_sampled_run_scores_perplexity_and_restores_draft_config(tiny_pair):
    before = tiny_pair.draft.generation_config.to_dict()
    progress = []
    result = bench.run_benchmark(
        tiny_pair, SUITE, ["ar", "sd", "hf-generate", "hf-assisted", "hf-assisted-default"], repeats=1,
        warmup=False, progress=lambda done, total, message: progress.append((done, total)),
        max_new_tokens=8, temperature=1.0, seed=3, chat=True,
    )
    assert progress[-1] == (10, 10)
    rows = result.rows
    assert rows.matches_ar.isna().all()  # exact match is a greedy notion
    assert rows.perplexity.gt(1).all() and rows.perplexity.map(math.isfinite).all()
    assert tiny_pair.draft.generation_config.to_dict() == before
    assert set(bench.make_figures(result)) >= {"speedup_vs_ar", "acceptance", "predicted_vs_measured"}
    assert "<html" in bench.report_html(result, plotlyjs="cdn")


@pytest.mark.parametrize("content, message", [
    (None, "suite file not found"),
    ("", "the suite is empty"),
    ('{"prompt": "w5 w6"}\n', "missing 'category'"),
    ('{"prompt": "w5", "category": "chat"}\nnot json\n', "suite.jsonl:2: not valid JSON"),
    ('{"prompt": "  ", "category": "chat"}\n', "'prompt' must be a non-empty string"),
    ('["w5", "chat"]\n', "expected a JSON object"),
])
def test_invalid_suite_fails_clearly(tiny_pair, tmp_path, capsys, content, message):
    suite = tmp_path / "suite.jsonl"
    if content is not None:
        suite.write_text(content, encoding="utf-8")
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--quiet"])
    assert code == 2
    assert message in capsys.readouterr().err


def test_unknown_category_and_method_fail_clearly(tiny_pair, tmp_path, capsys):
    suite = write_suite(tmp_path / "suite.jsonl", SUITE)
    assert cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--categories", "poetry"]) == 2
    assert "no prompts in category 'poetry'; the suite has summarisation, chat" in capsys.readouterr().err
    assert cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--methods", "ar,hf-magic"]) == 2
    assert "unknown method(s) 'hf-magic'" in capsys.readouterr().err


def test_select_prompts_limits_per_category():
    items = bench.load_suite([{"prompt": f"w{i}", "category": "ab"[i % 2]} for i in range(6)])
    chosen = bench.select_prompts(items, "b,a", limit=2)
    assert [p.category for p in chosen] == ["b", "b", "a", "a"]


def test_leviathan_formula():
    assert bench.leviathan_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    assert bench.leviathan_speedup(1.0, 4, 0.0) == pytest.approx(5.0)
    assert bench.leviathan_speedup(0.5, 2, 0.0) == pytest.approx(1.75)
    assert math.isnan(bench.leviathan_speedup(math.nan, 4, 0.1))
    assert bench.leviathan_speedup(0.5, 2, 0.0, 2.0) == pytest.approx(0.875)


def test_load_result_rebuilds_the_report(tiny_pair, tmp_path):
    result = bench.run_benchmark(tiny_pair, SUITE[:1], ["ar", "sd"], repeats=1, warmup=False, max_new_tokens=6)
    csv = tmp_path / "rows.csv"
    bench.write_outputs(result, csv=csv)
    again = bench.load_result(csv)
    pd.testing.assert_frame_equal(again.summary.reset_index(drop=True), result.summary.reset_index(drop=True),
                                  check_dtype=False)
    assert "fig-acceptance" in bench.report_html(again, plotlyjs="cdn")


def test_synthetic_pair_builds_and_benchmarks(tmp_path):
    from specdemo import load_pair
    from specdemo.bench import synthetic as bench_synthetic

    assert bench_synthetic.main(["--out", str(tmp_path), "--target-size", "tiny", "--draft-size", "tiny",
                                 "--vocab", "1024", "--dtype", "float32"]) == 0
    pair = load_pair(str(tmp_path / "target"), str(tmp_path / "draft"), device="cpu", runtime="torch")
    assert pair.target.config.model_type == "gpt_neox" and pair.eos_ids == frozenset({0})
    # Suite words have their own ids, so real text does not collapse into <unk>.
    assert 1 not in pair.encode("Summarise the following passage")
    result = bench.run_benchmark(pair, SUITE[:1], ["ar", "sd", "hf-assisted"], repeats=1, warmup=False,
                                 max_new_tokens=4)
    assert (result.rows.error == "").all()
