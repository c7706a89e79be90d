"""The page's drawing functions, without a browser."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

import specdemo
from specdemo.app import viz
from specdemo.bench.measure.compare import tabulate
from specdemo.engine.trace import COPIED, DraftDecision, GenerationResult, Round, TokenRecord


def synthetic() -> GenerationResult:
    """Two SD rounds: one rejects after a kept draft (correction), one keeps all (bonus)."""
    result = GenerationResult("sd", {"temperature": 0.0}, [1, 2])
    rounds = [
        Round(0, 3, None, [5, 6, 7], 1, 9, [0.2, 0.7, 0.9], 0.01, 0.02, 0.05, [5, 9]),
        Round(1, 2, None, [10, 11], 2, 12, [0.1, 0.3], 0.01, 0.02, 0.09, [10, 11, 12]),
    ]
    texts = ["<b>bold</b>", " & co", "\n", " \"q\"", " end"]
    origins = ["accepted", "corrected", "accepted", "accepted", "bonus"]
    ids = [5, 9, 10, 11, 12]
    rounds_of = [0, 0, 1, 1, 1]
    result.rounds = rounds
    result.tokens = [TokenRecord(i, t, o, r) for i, t, o, r in zip(ids, texts, origins, rounds_of)]
    result.seconds = 0.09
    result.target_forwards = 2
    return result


@pytest.fixture(scope="module")
def results(tiny_pair):
    return [specdemo.generate(tiny_pair, "w3 w4 w5 w6 w7", m, max_new_tokens=24, seed=0)
            for m in ("ar", "sd", "nasd", "egag")]


def test_spans_carry_each_origin_class_in_order():
    html = viz.render_tokens(synthetic())
    for origin in ("accepted", "corrected", "bonus", "rejected"):
        assert f'class="sd-tok sd-{origin}"' in html
    # The rejected drafts (6, 7) sit after the kept draft and before the correction.
    order = [html.index(s) for s in ("sd-accepted", "#6", "#7", "sd-corrected")]
    assert order == sorted(order)
    assert html.count("sd-rejected") == 2


def test_token_text_is_escaped_and_newlines_shown():
    html = viz.render_tokens(synthetic())
    assert "<b>bold" not in html and "&lt;b&gt;bold&lt;/b&gt;" in html
    assert "&amp; co" in html and "&quot;q&quot;" in html
    assert '<span class="sd-nl">↵</span>\n' in html


def test_hover_title_names_round_gamma_entropy_and_accepted():
    html = viz.render_tokens(synthetic())
    assert 'title="round 0 · γ=3 · drafter entropy 0.20 · 1/3 drafts accepted · accepted draft 1"' in html
    assert "round 0 · γ=3 · drafter entropy 0.70 · 1/3 drafts accepted · rejected draft 2" in html
    assert "round 1 · γ=2" in html and "2/2 drafts accepted" in html


def test_hover_title_says_when_a_round_was_copied_from_the_context():
    result = synthetic()
    result.rounds[1].source = "copy"
    html = viz.render_tokens(result)
    assert "round 1 · γ=2 · drafter entropy 0.10 · 2/2 drafts accepted (copied from the context) · accepted draft 1" in html
    assert "round 0 · γ=3 · drafter entropy 0.20 · 1/3 drafts accepted · accepted draft 1" in html


def test_rejected_drafts_are_struck_by_the_css():
    rules = [rule for rule in viz.TOKEN_CSS.split("}") if rule.strip().startswith(".sd-tok.sd-rejected{")]
    assert any("line-through" in rule for rule in rules)


def test_legend_has_a_chip_per_origin():
    legend = viz.legend_html()
    for origin, style in viz.ORIGIN_STYLES.items():
        assert f"sd-{origin}" in legend and style.label in legend


def test_real_traces_render_with_decoded_rejected_drafts(results, tiny_pair):
    sd = results[1]
    assert any(r.rejected for r in sd.rounds), "the tiny draft should miss sometimes"
    html = viz.render_panel("sd", sd, tiny_pair.tokenizer)
    assert 'data-method="sd"' in html and "done" in html
    assert "sd-rejected" in html and not re.search(r"#\d", html.split("sd-text")[1])  # decoded, not ids
    ar_html = viz.render_tokens(results[0], tiny_pair.tokenizer)
    assert "sd-target" in ar_html and "sd-accepted" not in ar_html and "sd-rejected" not in ar_html
    # The cache gives the same text as decoding afresh, and a second render from it the same again.
    cache: dict = {}
    cached = viz.render_tokens(sd, tiny_pair.tokenizer, cache)
    assert cache
    assert cached == viz.render_tokens(sd, tiny_pair.tokenizer)
    assert viz.render_tokens(sd, tiny_pair.tokenizer, cache) == cached


def test_panel_states():
    assert "waiting" in viz.render_panel("egag")
    error = viz.render_panel("sd", state="error", message="needs a <draft>")
    assert "sd-error" in error and "&lt;draft&gt;" in error


@pytest.mark.parametrize("name", ["gamma", "accepted", "race"])
def test_figures_have_one_trace_per_method(results, name):
    figure = viz.FIGURES[name](results)
    assert [t.name for t in figure.data] == ["AR", "SD", "NASD", "EGAG"]
    assert all(len(t.x) == len(t.y) > 0 for t in figure.data)


def test_entropy_figure_covers_model_drafters(results):
    figure = viz.entropy_figure(results)
    shown = [t.name for t in figure.data if t.showlegend is not False]
    assert shown == ["SD", "EGAG"]  # AR and NASD have no draft distribution
    per_token = [t for t in figure.data if t.showlegend is False]
    assert sum(len(t.y) for t in per_token) == sum(len(r.draft_entropies) for res in results for r in res.rounds)


def test_charts_share_round_axis_and_race_uses_time(results):
    figures = viz.all_figures(results)
    for name in ("gamma", "entropy", "accepted"):
        assert figures[name].layout.xaxis.title.text == "round"
    assert "seconds" in figures["race"].layout.xaxis.title.text
    race = figures["race"].data[1]
    assert list(race.y)[-1] == results[1].stats["new_tokens"]
    # Its time axis is the engine's own clock (the trace's timestamps), never the page's.
    assert list(race.x) == [0.0, results[1].prefill_seconds, *(r.end_seconds for r in results[1].rounds)]
    assert list(race.x) == sorted(race.x)


def test_table_puts_ar_first_and_spells_out_quality(results, tiny_pair):
    summary = tabulate(tiny_pair, list(reversed(results))).summary
    table = viz.display_table(summary)
    assert list(table.columns) == viz.DISPLAY_COLUMNS
    assert list(table["method"]) == ["AR", "EGAG", "NASD", "SD"]
    assert table["speedup vs AR"].iloc[0] == "1.00×"
    assert table["quality"].iloc[0] == "reference (exact at float64)"  # what "identical to AR" promises here
    assert set(table["quality"].iloc[1:]) == {"identical to AR"}  # greedy is lossless
    why = viz.explain(summary)
    for label in ("AR", "SD", "NASD", "EGAG"):
        assert f"**{label}**" in why


def test_the_explanation_counts_copied_rounds(tiny_pair):
    prompt = "w10 w20 w30 w10 w20 w30 w10 w20"
    runs = [specdemo.generate(tiny_pair, prompt, m, max_new_tokens=24, copy_n=3) for m in ("ar", "sd")]
    copied, rounds = runs[1].stats["copied_rounds"], len(runs[1].rounds)
    assert copied > 0
    why = viz.explain(tabulate(tiny_pair, runs).summary)
    assert f"{copied} of its {rounds} rounds were copied from the context" in why
    assert why.count("copied") == 1  # AR copies nothing and says nothing about it


def test_sampled_quality_is_perplexity(tiny_pair):
    runs = [specdemo.generate(tiny_pair, "w3 w4", m, max_new_tokens=8, temperature=0.8, seed=1) for m in ("ar", "sd")]
    table = viz.display_table(tabulate(tiny_pair, runs).summary)
    assert all(q.startswith("target perplexity ") for q in table["quality"])


def test_empty_inputs_draw_something():
    assert viz.display_table(pd.DataFrame(columns=["method"])).empty
    assert all(len(f.data) == 0 for f in viz.all_figures([]).values())


def test_records_and_method_order():
    frame = viz.records(pd.DataFrame({"a": [1.0, math.nan]}))
    assert frame["a"].tolist() == [1.0, None]
    assert viz.method_order(["egag", "nasd", "ar", "sd"]) == ["ar", "sd", "nasd", "egag"]
    assert viz.method_color("ar") != viz.method_color("sd")
    assert viz.method_color("someone-elses") in viz.FALLBACK_COLORS


def test_a_drafts_tooltip_says_what_decided_it():
    kept = DraftDecision(5, q=0.81, p=0.64, accept_prob=0.79, accepted=True)
    assert viz.decision_text(kept, greedy=False) == "q 0.81 → p 0.64, kept with probability 0.79"
    refused = DraftDecision(6, q=0.55, p=0.02, accept_prob=0.04, accepted=False, correction=9, correction_p=0.71)
    assert (viz.decision_text(refused, greedy=False, correction_text="the")
            == "q 0.55, p 0.02 → kept with probability 0.04; the target chose 'the' (p 0.71)")
    copied = DraftDecision(7, q=1.0, p=0.3, accept_prob=0.3, accepted=True, point_mass=True)
    assert viz.decision_text(copied, greedy=False, source=COPIED).startswith(
        "q 1 (a point mass: copied from the context) → p 0.30")
    assert "n-gram" in viz.decision_text(copied, greedy=False)
    greedy_refused = DraftDecision(6, q=0.55, p=0.02, accept_prob=0.0, accepted=False, correction=9, correction_p=0.71)
    assert viz.decision_text(greedy_refused, greedy=True, correction_text="the") == (
        "q 0.55, p 0.02 → not the target's top token; the target chose 'the' (p 0.71)")
    later = DraftDecision(8, q=0.4, p=0.1, accept_prob=0.25, accepted=False, decided=False)
    assert "not judged" in viz.decision_text(later, greedy=False)


def test_rejected_tokens_of_a_sampled_run_show_p_q_and_the_targets_choice(tiny_pair):
    result = specdemo.generate(tiny_pair, "w3 w4 w5 w6 w7", "sd", max_new_tokens=24, seed=1, temperature=1.0,
                               copy_n=0)
    html = viz.render_tokens(result, tiny_pair.tokenizer)
    titles = re.findall(r'class="sd-tok sd-rejected" title="([^"]*)"', html)
    assert titles and any(re.search(r"q [\d.e-]+, p [\d.e-]+ → kept with probability [\d.e-]+; the target chose "
                                    r"&#x27; ?w\d+&#x27; \(p [\d.e-]+\)", t) for t in titles)
    kept = re.findall(r'class="sd-tok sd-accepted" title="([^"]*)"', html)
    assert kept and all(re.search(r"q [\d.e-]+ → p [\d.e-]+, kept with probability", t) for t in kept)


def test_the_reading_under_the_table_gives_auc_and_break_even(results, tiny_pair):
    sd = results[1]
    assert 0 < sd.stats["accepted"] < sd.stats["drafted"], "SD's drafts were kept and refused"
    summary = tabulate(tiny_pair, results).summary
    reading = viz.explain(summary)
    sd_line = _line_of("SD", reading)
    assert "entropy ranks acceptances with AUC" in sd_line
    assert "tokens per round" in sd_line and "to match AR; it got" in sd_line
    assert "break-even" not in _line_of("AR", reading)
    evens = viz.acceptance.comparison_break_evens(summary)
    assert set(evens) == {"sd", "nasd", "egag"}
    figure = viz.break_even_figure(results)
    assert {"SD predicted", "SD this run", "AR"} <= {t.name for t in figure.data}


def test_the_reading_says_when_entropy_cannot_rank_the_drafts(results, tiny_pair):
    summary = tabulate(tiny_pair, results).summary
    # As when every judged draft of SD was kept (or every one refused): no AUC to give.
    summary.loc[summary.method == "sd", "entropy_auc"] = math.nan
    sd_line = _line_of("SD", viz.explain(summary))
    assert "entropy cannot rank acceptances" in sd_line and "AUC" not in sd_line


def _line_of(label: str, reading: str) -> str:
    return next(line for line in reading.splitlines() if line.startswith(f"- **{label}**"))


def test_acceptance_figures_have_a_line_per_drafting_method(results):
    positions = viz.position_acceptance_figure(results)
    assert [t.name for t in positions.data] == ["SD", "NASD", "EGAG"]
    entropy = viz.entropy_acceptance_figure(results)
    lines = [t for t in entropy.data if t.mode == "lines+markers"]
    # NASD drafts point masses: no entropy of its own to plot.
    assert [t.name.split(" (")[0] for t in lines] == ["SD", "EGAG"] and "AUC" in lines[0].name


def test_the_charts_placeholder_is_a_chart_without_axes_that_says_what_comes():
    fig = viz.placeholder_figure(["The charts appear here.", "Drawn <after> the run."])
    assert fig.data == ()  # nothing plotted
    assert not fig.layout.xaxis.visible and not fig.layout.yaxis.visible
    (note,) = fig.layout.annotations
    assert note.text == "<i>The charts appear here.</i><br><i>Drawn &lt;after&gt; the run.</i>"


def test_byte_counts_read_in_decimal_units():
    assert [viz.byte_size(n) for n in (950, 73_728, 12_300_000, 1_400_000_000, float("nan"))] == [
        "950 B", "73.7 kB", "12.3 MB", "1.4 GB", "–"]


def test_the_table_shows_speed_and_verdict_first_and_every_other_column_in_its_details(results, tiny_pair):
    table = viz.display_table(tabulate(tiny_pair, results).summary)
    table.loc[1, ["quality", "first divergence"]] = ["differs from AR", "token 3: near-tie (margin 0.01)"]
    first, details = viz.split_table(table)
    assert list(first.columns) == viz.FIRST_COLUMNS
    assert list(details.columns) == ["method", *(c for c in viz.DISPLAY_COLUMNS if c not in viz.FIRST_COLUMNS)]
    assert list(first["method"]) == list(details["method"]) == ["AR", "SD", "NASD", "EGAG"]
    # The verdict says where the output left AR's; a row equal to AR's keeps its plain verdict.
    assert first["quality"].tolist() == ["reference (exact at float64)", "differs from AR at token 3: near-tie "
                                         "(margin 0.01)", "identical to AR", "identical to AR"]
    assert details.loc[1, "first divergence"] == "token 3: near-tie (margin 0.01)"


def test_the_details_carry_the_float32_columns_and_the_first_table_the_renamed_speedup():
    table = pd.DataFrame([["AR", "1.00×", "0.95×", "–"]],
                         columns=["method", "speedup vs bfloat16 AR", "speedup vs fp32 AR", "first divergence"])
    first, details = viz.split_table(table)
    assert list(first.columns) == ["method", "speedup vs bfloat16 AR"]
    assert list(details.columns) == ["method", "speedup vs fp32 AR", "first divergence"]


def test_special_tokens_show_as_markers_in_kept_and_rejected_spans(tiny_pair):
    """The tiny tokenizer's specials are <unk>, <s> and </s>: a rejected draft of <s> and an output </s> read
    as ⟨s⟩ and ⟨/s⟩ chips, never as raw markup, while text that only looks like a tag stays escaped text."""
    assert viz.special_tokens(tiny_pair.tokenizer) == ("<unk>", "</s>", "<s>")
    assert viz.special_marker("<|im_start|>") == "⟨im_start⟩" and viz.special_marker("</s>") == "⟨/s⟩"
    result = GenerationResult("sd", {"temperature": 0.0}, [3, 4])
    result.rounds = [Round(0, 3, None, [5, 1, 7], 1, 2, [0.2, 0.7, 0.9], 0.01, 0.02, 0.05, [5, 2])]
    result.tokens = [TokenRecord(5, "<b>w5</b>", "accepted", 0), TokenRecord(2, " </s>", "corrected", 0)]
    html = viz.render_tokens(result, tiny_pair.tokenizer)
    spans = re.findall(r'<span class="sd-tok sd-(\w+)"[^>]*>(.*?)</span>(?=<span class="sd-tok|$)', html)
    assert [origin for origin, _ in spans] == ["accepted", "rejected", "rejected", "corrected"]
    marker = '<span class="sd-special">{}</span>'
    assert spans[1][1].strip() == marker.format("⟨s⟩")  # the rejected draft <s>
    assert spans[3][1] == " " + marker.format("⟨/s⟩")
    assert spans[0][1] == "&lt;b&gt;w5&lt;/b&gt;"  # not a special token: escaped as it is
    assert "&lt;s&gt;" not in html and "&lt;/s&gt;" not in html
    assert ".sd-special{" in viz.TOKEN_CSS


def test_a_refused_drafts_tooltip_names_a_special_correction_by_its_marker(tiny_pair):
    """The target's choice in place of a refused draft reads "the target chose ' ⟨/s⟩'", not its raw markup."""
    from specdemo.engine.trace import DraftDecision

    result = GenerationResult("sd", {"temperature": 0.0}, [3, 4])
    result.rounds = [Round(0, 2, None, [5, 7], 1, 2, [0.2, 0.7], 0.01, 0.02, 0.05, [5, 2])]
    result.rounds[0].decisions = [DraftDecision(5, 0.9, 0.8, 1.0, True),
                                  DraftDecision(7, 0.6, 0.1, 0.0, False, correction=2, correction_p=0.7)]
    result.tokens = [TokenRecord(5, "w5", "accepted", 0), TokenRecord(2, " </s>", "corrected", 0)]
    html = viz.render_tokens(result, tiny_pair.tokenizer)
    assert "the target chose &#x27; ⟨/s⟩&#x27;" in html or "the target chose ' ⟨/s⟩'" in html
    assert "&lt;/s&gt;" not in html


def test_the_tables_acceptance_and_the_charts_alpha_are_two_named_figures(results, tiny_pair):
    from specdemo.engine.trace import ACCEPTANCE_LABEL, ALPHA_LABEL

    sd = results[1].stats
    assert sd["alpha"] != pytest.approx(sd["acceptance_rate"]), "SD's run tells the two apart"
    summary = tabulate(tiny_pair, results).summary
    table = viz.display_table(summary).set_index("method")
    assert table.loc["SD", ACCEPTANCE_LABEL] == f"{sd['acceptance_rate']:.0%}"
    assert table.loc["SD", ALPHA_LABEL] == f"{sd['alpha']:.2f}"
    figure = viz.break_even_figure(results)
    marker = next(t for t in figure.data if t.name == "SD this run")
    assert list(marker.x) == [pytest.approx(sd["alpha"])]  # the chart's α is the trace's alpha, not acceptance
    assert figure.layout.xaxis.title.text == ALPHA_LABEL and "α (Leviathan)" in marker.hovertemplate


def test_chart_labels_write_special_tokens_as_their_markers_too(tiny_pair):
    specials = viz.special_tokens(tiny_pair.tokenizer)
    assert viz.marked_text("w5 </s><s> w6", specials) == "w5 ⟨/s⟩⟨s⟩ w6"
    assert viz.marked_text("<b>", specials) == "<b>"
