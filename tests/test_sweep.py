"""Sweeps on the tiny random pair: the grid, AR interleaving, rows, stop, verdict and figures.

No timing thresholds: speedups on a shared CPU are noise, so only their bookkeeping is checked.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from specdemo.bench import sweep
from specdemo.bench.sweep import Setting, expand_grid, iter_sweep, run_sweep, summarize_sweep, verdict

PROMPTS = ["w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "w11 w12 w13 w14"]
REQUIRED = ["method", "gamma", "gamma_max", "ema", "ngram_n", "prompt_id", "repeat", "tokens_per_s",
            "speedup_vs_ar", "acceptance_rate", "mean_accepted_tokens", "mean_gamma", "wasted_drafts_per_token",
            "target_forwards_per_token", "draft_forwards_per_token", "draft_flops_per_token",
            "target_flops_per_token", "predicted_speedup", "matches_ar"]


# --------------------------------------------------------------------------- the grid

def test_grid_expands_every_method_and_leaves_other_settings_empty():
    settings = expand_grid(gamma=[1, 2, 3], gamma_max=[4, 6], ema=[0, 0.9], ngram_n=[2, 3])
    methods = [s.method for s in settings]
    assert methods == ["ar"] + ["sd"] * 3 + ["egag"] * 4 + ["nasd"] * 2
    assert [s.gamma for s in settings if s.method == "sd"] == [1, 2, 3]
    assert [(s.gamma_max, s.ema) for s in settings if s.method == "egag"] == [(4, 0.0), (4, 0.9), (6, 0.0), (6, 0.9)]
    ar, sd, egag, nasd = settings[0], settings[1], settings[4], settings[-1]
    empty = dict.fromkeys(sweep.SETTING_COLUMNS)
    assert ar.values() == empty and ar.params() == {}
    assert sd.values() == {**empty, "gamma": 1}
    assert sd.params() == {"gamma": 1}  # copy_n left at the parameter's default
    assert egag.values() == {**empty, "gamma_max": 4, "ema": 0.0}
    assert egag.params() == {"gamma_max": 4, "ema": 0.0, "gamma_min": 1}
    assert nasd.values() == {**empty, "gamma": 3, "ngram_n": 3}  # the default γ
    assert len({s.key for s in settings}) == len(settings)


def test_grid_takes_strings_picks_methods_and_drops_duplicates():
    settings = expand_grid(gamma="1,2,2", gamma_max="4", ema="0.5", ngram_n="3", methods="sd,nasd")
    assert [s.key for s in settings] == ["ar", "sd:gamma=1", "sd:gamma=2", "nasd:gamma=3,ngram_n=3"]
    # NASD runs only when asked for.
    assert {s.method for s in expand_grid()} == {"ar", "sd", "egag"}
    assert len(expand_grid()) == 1 + 6 + 4 * 3
    assert [s.method for s in expand_grid(gamma=[2], methods=["sd"])] == ["ar", "sd"]


def test_copy_n_values_repeat_sd_and_egag_settings_but_not_nasds():
    settings = expand_grid(gamma=[2, 3], gamma_max=[4], ema=[0.9], ngram_n=[3], copy_n="0,4")
    assert [s.label for s in settings] == [
        "AR", "SD γ=2, no copy", "SD γ=3, no copy", "SD γ=2, copy n=4", "SD γ=3, copy n=4",
        "EGAG γmax/EMA 4/0.9, no copy", "EGAG γmax/EMA 4/0.9, copy n=4", "NASD n=3 (γ=3)"]
    assert settings[1].params() == {"gamma": 2, "copy_n": 0} and settings[1].key == "sd:gamma=2,copy_n=0"
    assert "copy_n" not in settings[-1].params()
    with pytest.raises(ValueError, match=r"SD γ=2, copy n=1: copy_n must be 0 \(off\)"):
        expand_grid(gamma=[2], methods="sd", copy_n=[1])


def test_a_sweep_over_copy_n_draws_a_line_per_value_and_names_it_in_the_verdict():
    rows = []
    for copy_n, speeds in ((0, (1.0, 1.1)), (4, (1.3, 1.2))):
        for gamma, speed in zip((2, 3), speeds):
            setting = sweep.Setting("sd", gamma=gamma, copy_n=copy_n)
            rows.append({"method": "sd", **setting.values(), "setting": setting.key, "label": setting.label,
                         "prompt_id": "p", "repeat": 0, "speedup_vs_ar": speed, "new_tokens": 10, "seconds": 1.0,
                         "rounds": 5, "drafted": 8, "accepted": 4, "rejected_rounds": 3})
    summary = sweep.summarize_sweep(rows)
    figure = sweep.speedup_figure(summary)
    assert [trace.name for trace in figure.data] == ["SD (fixed γ, no copy)", "SD (fixed γ, copy n=4)"]
    assert list(figure.data[1].y) == pytest.approx([1.3, 1.2])
    assert sweep.verdict(summary).startswith("The best fixed γ (γ = 2, copy n=4) reached 1.30× AR")
    assert [t.name for t in sweep.acceptance_figure(summary).data][:2] == ["SD (fixed γ, no copy)",
                                                                           "SD (fixed γ, copy n=4)"]


@pytest.mark.parametrize("kwargs, message", [
    (dict(methods="sd,eagle"), "unknown"),
    (dict(methods="nasd"), "nasd needs ngram_n"),
    (dict(gamma_max=[1, 4], gamma_min=2), "gamma_min"),
    (dict(ema=[1.0]), "ema"),
    (dict(gamma=[0]), "gamma"),
])
def test_grid_rejects_bad_values_before_running(kwargs, message):
    with pytest.raises(ValueError, match=message):
        expand_grid(**kwargs)


# --------------------------------------------------------------------------- a small greedy sweep

@pytest.fixture(scope="module")
def events(tiny_pair):
    settings = expand_grid(gamma=[1, 3], gamma_max=[3], ema=[0, 0.9], ngram_n=[3])
    return settings, list(iter_sweep(tiny_pair, PROMPTS, settings, repeats=2, max_new_tokens=10))


@pytest.fixture(scope="module")
def result(tiny_pair, events):
    settings, streamed = events
    rows = sweep.rows_frame(streamed[-1].rows)
    return sweep.SweepResult(rows, settings, {"params": {"max_new_tokens": 10}})


def test_events_stream_every_run_and_rows_grow(events):
    settings, streamed = events
    runs = len(PROMPTS) * len(settings) * 2
    warmups = len({s.method for s in settings})
    assert [e.done for e in streamed[:-1]] == list(range(1, warmups + runs + 1))
    assert all(e.total == warmups + runs for e in streamed)
    final = streamed[-1]
    assert final.finished and not final.stopped and len(final.rows) == runs
    # Rows come a whole (prompt, repeat) at a time, once its last run (AR's included) finished.
    sizes = [len(e.new_rows) for e in streamed if e.new_rows]
    assert sizes == [len(settings)] * (len(PROMPTS) * 2)


def test_ar_is_interleaved_with_every_setting(result):
    rows = result.rows
    n = len(result.settings)
    for (repeat, prompt), group in rows.groupby(["repeat", "prompt_id"]):
        assert list(group.setting) == [s.key for s in result.settings]  # every setting, AR once
        assert sorted(group.order) == list(range(n))  # each in its own slot
    ar = rows[rows.method == "ar"]
    assert len(ar) == len(PROMPTS) * 2 and ar.order.nunique() > 1  # the order rotates
    assert (ar.speedup_vs_ar == 1.0).all()
    # Every speedup is the ratio to AR on the same prompt and repeat.
    for _, row in rows.iterrows():
        mate = ar[(ar.prompt_id == row.prompt_id) & (ar["repeat"] == row["repeat"])].iloc[0]
        expected = (mate.seconds / mate.new_tokens) / (row.seconds / row.new_tokens)
        assert row.speedup_vs_ar == pytest.approx(expected)


def test_every_csv_row_has_every_column(result, tmp_path):
    written = sweep.write_outputs(result, tmp_path / "rows.csv", tmp_path / "summary.csv",
                                  tmp_path / "report.html", plotlyjs="cdn")
    assert [p.name for p in written] == ["rows.csv", "summary.csv", "report.html"]
    rows = pd.read_csv(tmp_path / "rows.csv")
    assert list(rows.columns[: len(REQUIRED)]) == REQUIRED
    assert list(rows.columns) == sweep.ROW_COLUMNS
    measured = [c for c in REQUIRED if c not in sweep.SETTING_COLUMNS + ["acceptance_rate", "predicted_speedup"]]
    assert rows[measured].notna().all().all()
    # A setting that does not apply is an empty cell; one that does is filled, as a whole number.
    applies = {"ar": set(), "sd": {"gamma"}, "egag": {"gamma_max", "ema"}, "nasd": {"gamma", "ngram_n"}}
    for method, used in applies.items():
        part = rows[rows.method == method]
        for column in sweep.SETTING_COLUMNS:
            assert (part[column].notna() if column in used else part[column].isna()).all(), (method, column)
    text = (tmp_path / "rows.csv").read_text(encoding="utf-8").splitlines()
    assert text[1].startswith("ar,,,,,") and any(line.startswith("sd,3,,,,") for line in text)
    # Leviathan needs an α: every draft-model run has one; NASD only where its table drafted.
    assert rows[rows.method.isin(["sd", "egag"])].predicted_speedup.notna().all()
    nasd = rows[rows.method == "nasd"]
    assert (nasd.predicted_speedup.notna() == (nasd.drafted > 0)).all()
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary.columns) == sweep.SUMMARY_COLUMNS and len(summary) == len(result.settings)


def test_greedy_sweep_matches_ar(result):
    assert result.rows.matches_ar.astype(bool).all()
    assert (result.summary.exact_match_pct == 100).all()


def test_counts_and_flop_estimates_follow_the_trace(result, tiny_pair):
    rows = result.rows
    # One target forward per round, prefill excluded.
    forwards = rows.target_forwards_per_token * rows.new_tokens
    assert forwards.round().astype(int).tolist() == rows.rounds.tolist()
    assert (rows.wasted_drafts_per_token * rows.new_tokens).round().astype(int).tolist() == \
        (rows.drafted - rows.accepted).tolist()
    body, head = sweep.matmul_parameters(tiny_pair.target)
    ar = rows[rows.method == "ar"]
    assert ar.target_flops_per_token.tolist() == pytest.approx([2.0 * (body + head)] * len(ar))
    # AR drafts nothing; NASD drafts from a table: no draft-model FLOPs; SD and EGAG run the draft.
    assert (rows[rows.method.isin(["ar", "nasd"])].draft_flops_per_token == 0).all()
    assert (rows[rows.method.isin(["sd", "egag"])].draft_flops_per_token > 0).all()
    # SD at γ = 1: one draft forward a round the draft drafted, none a round copied from the context
    # (the drafter's prefill is not counted).
    sd1 = rows[rows.setting == "sd:gamma=1"]
    assert (sd1.draft_forwards_per_token * sd1.new_tokens).round().astype(int).tolist() == \
        (sd1.rounds - sd1.copied_rounds).tolist()
    assert (rows[rows.setting == "sd:gamma=3"].mean_gamma == 3).all()


def test_summary_is_mean_over_repeats_of_per_repeat_values(result):
    summary = result.summary.set_index("setting")
    assert summary.loc["ar", "speedup_vs_ar"] == pytest.approx(1.0)
    rows = result.rows
    sd = rows[rows.setting == "sd:gamma=1"]
    per_repeat = [math.exp(g.speedup_vs_ar.map(math.log).mean()) for _, g in sd.groupby("repeat")]
    assert summary.loc["sd:gamma=1", "speedup_vs_ar"] == pytest.approx(sum(per_repeat) / 2)
    assert summary.loc["sd:gamma=1", "speedup_vs_ar_std"] == pytest.approx(pd.Series(per_repeat).std())
    assert summary.loc["sd:gamma=1", "runs"] == 4 and summary.loc["sd:gamma=1", "repeats"] == 2
    assert summary.loc["sd:gamma=3", "gamma"] == 3 and pd.isna(summary.loc["sd:gamma=3", "ema"])


def test_report_holds_verdict_table_and_charts(result, tmp_path):
    page = sweep.report_html(result, tmp_path / "r.html", plotlyjs="cdn")
    assert result.verdict in page.replace("&#x27;", "'")
    for name in sweep.FIGURES:
        assert f'id="fig-{name}"' in page
    assert "estimate" in page.lower()


# --------------------------------------------------------------------------- stop

def test_should_stop_ends_the_sweep_after_the_current_run(tiny_pair):
    settings = expand_grid(gamma=[1, 2], gamma_max=[3], ema=[0.5])
    asked = []

    def should_stop():
        asked.append(True)
        return len(asked) >= 3

    streamed = list(iter_sweep(tiny_pair, PROMPTS, settings, repeats=2, max_new_tokens=6, warmup=False,
                               should_stop=should_stop))
    final = streamed[-1]
    assert final.finished and final.stopped
    assert final.done == 3 and len(asked) == 3  # three runs, no fourth
    # The finished runs of the interrupted prompt are kept; AR ran first on it, so speedups exist.
    assert [r["setting"] for r in final.rows] == [s.key for s in settings[:3]]
    assert final.rows[0]["speedup_vs_ar"] == 1.0

    blocking = run_sweep(tiny_pair, PROMPTS, settings, repeats=2, max_new_tokens=6, warmup=False,
                         should_stop=lambda: True)
    assert blocking.stopped and len(blocking.rows) == 1


def test_sweep_refuses_draft_methods_without_a_draft(tiny_pair):
    from dataclasses import replace

    bare = replace(tiny_pair, draft=None)
    with pytest.raises(ValueError, match="needs a draft"):
        iter_sweep(bare, PROMPTS, expand_grid(gamma=[2], methods="sd"), repeats=1)


# --------------------------------------------------------------------------- verdict and figures (no models)

def hand_summary(*rows: dict) -> pd.DataFrame:
    frame = pd.DataFrame([{c: math.nan for c in sweep.SUMMARY_COLUMNS} | r for r in rows],
                         columns=sweep.SUMMARY_COLUMNS)
    frame["label"] = [Setting(r["method"], **{k: r.get(k) for k in ("gamma", "gamma_max", "ema", "ngram_n")}).label
                      for r in rows]
    return frame


AR_ROW = dict(method="ar", speedup_vs_ar=1.0, mean_gamma=0.0, target_flops_per_token=2e9, draft_flops_per_token=0.0)
SD_ROWS = [dict(method="sd", gamma=g, speedup_vs_ar=s, mean_gamma=float(g), acceptance_rate=a,
                mean_accepted_tokens=t, predicted_speedup=p, target_flops_per_token=3e9, draft_flops_per_token=1e8)
           for g, s, a, t, p in ((1, 1.10, 0.8, 1.8, 1.2), (3, 1.28, 0.7, 2.6, 1.4), (6, 1.05, 0.6, 2.9, 1.1))]
EGAG_ROWS = [dict(method="egag", gamma_max=6, ema=0.9, speedup_vs_ar=1.314, mean_gamma=3.42, acceptance_rate=0.72,
                  mean_accepted_tokens=2.7, predicted_speedup=1.35, target_flops_per_token=3e9,
                  draft_flops_per_token=1e8),
             dict(method="egag", gamma_max=4, ema=0.0, speedup_vs_ar=1.2, mean_gamma=2.5, acceptance_rate=0.75,
                  mean_accepted_tokens=2.4, predicted_speedup=1.3, target_flops_per_token=3e9,
                  draft_flops_per_token=1e8)]


def test_verdict_is_computed_from_the_numbers():
    summary = hand_summary(AR_ROW, *SD_ROWS, *EGAG_ROWS)
    assert verdict(summary) == ("EGAG (γ_max 6, EMA 0.9) reached 1.31× AR against 1.28× for the best fixed γ "
                                "(γ = 3); its mean γ was 3.4.")
    slower = hand_summary(AR_ROW, *SD_ROWS, {**EGAG_ROWS[0], "speedup_vs_ar": 0.97})
    assert verdict(slower).startswith("EGAG (γ_max 6, EMA 0.9) reached 0.97× AR against 1.28×")


def test_verdict_without_egag_or_sd():
    assert verdict(hand_summary(AR_ROW, *SD_ROWS)) == (
        "The best fixed γ (γ = 3) reached 1.28× AR (no EGAG in this sweep).")
    assert verdict(hand_summary(AR_ROW, *EGAG_ROWS)) == (
        "EGAG (γ_max 6, EMA 0.9) reached 1.31× AR; its mean γ was 3.4 (no fixed-γ SD in this sweep).")
    nasd = dict(method="nasd", gamma=4, ngram_n=3, speedup_vs_ar=0.9, mean_gamma=4.0)
    assert verdict(hand_summary(AR_ROW, nasd)) == "The best NASD (n = 3) reached 0.90× AR."
    assert verdict(hand_summary(AR_ROW)).startswith("No SD, EGAG or NASD run has finished")
    assert verdict(summarize_sweep([])).startswith("No SD")


def test_figures_hold_the_expected_traces():
    summary = hand_summary(AR_ROW, *SD_ROWS, *EGAG_ROWS)
    figures = sweep.sweep_figures(summary)
    assert set(figures) == set(sweep.FIGURES)

    speed = {t.name: t for t in figures["speedup_vs_gamma"].data}
    assert set(speed) == {"SD (fixed γ)", "EGAG (γmax/EMA)"}
    assert list(speed["SD (fixed γ)"].x) == [1, 3, 6] and speed["SD (fixed γ)"].mode == "lines+markers"
    egag = speed["EGAG (γmax/EMA)"]
    assert list(egag.x) == [3.42, 2.5] and list(egag.text) == ["6/0.9", "4/0"]  # at their mean γ

    acceptance = figures["acceptance_vs_gamma"].data
    assert [t.name for t in acceptance] == ["SD (fixed γ)", "EGAG (γmax/EMA)"] * 2
    assert list(acceptance[0].y) == [0.8, 0.7, 0.6] and list(acceptance[2].y) == [1.8, 2.6, 2.9]

    predicted = {t.name: t for t in figures["predicted_vs_measured"].data}
    assert set(predicted) == {"SD", "EGAG", "measured = predicted"}
    assert list(predicted["SD"].x) == [1.2, 1.4, 1.1] and list(predicted["SD"].y) == [1.10, 1.28, 1.05]

    flops = {t.name: t for t in figures["flops_vs_speedup"].data}
    assert set(flops) == {"AR", "SD", "EGAG"}
    assert list(flops["AR"].y) == [2e9] and list(flops["SD"].y) == [3.1e9] * 3

    # Empty and partial summaries (a sweep that has just started) draw without error.
    sweep.sweep_figures(summarize_sweep([]))
    sweep.sweep_figures(hand_summary(AR_ROW))


def test_an_int8_models_packed_weights_count_as_its_float_ones_do(tiny_pair):
    # torch.ao's dynamic int8 Linear keeps its weight packed, outside parameters(), behind a method.
    from specdemo import load_pair

    quantized = load_pair(tiny_pair.target_ref, tiny_pair.draft_ref, device="cpu", dtype="float32",
                          draft_dtype="int8").draft
    assert sweep.matmul_parameters(quantized) == sweep.matmul_parameters(tiny_pair.draft)
