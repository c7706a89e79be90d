"""The baseline methods: beam search, the draft alone and AR without a KV cache."""

import dataclasses

import pytest

import specdemo
from specdemo.bench.measure.tables import summary_frame
from specdemo.engine.methods import BASELINES, METHODS, NOCACHE_MAX_NEW_TOKENS
from specdemo.engine.runtimes import available_methods
from specdemo.engine.trace import TARGET
from tests.test_feature_drafter import with_head

PROMPT = "w5 w6 w7 w8"


def test_ar_without_a_cache_writes_ars_tokens_with_one_full_forward_per_token(tiny_pair):
    ar = specdemo.generate(tiny_pair, PROMPT, "ar", max_new_tokens=30)
    nocache = specdemo.generate(tiny_pair, PROMPT, "ar-nocache", max_new_tokens=30)
    assert nocache.token_ids == ar.token_ids
    assert nocache.cache == "none" and nocache.note == ""
    assert nocache.target_forwards == len(nocache.tokens)
    assert {t.origin for t in nocache.tokens} == {TARGET}


def test_ar_without_a_cache_is_capped_and_says_so(tiny_pair):
    asked = NOCACHE_MAX_NEW_TOKENS + 50
    result = specdemo.generate(tiny_pair, [1, 40, 41], "ar-nocache", max_new_tokens=asked)
    assert len(result.tokens) <= NOCACHE_MAX_NEW_TOKENS
    assert result.params["max_new_tokens"] == NOCACHE_MAX_NEW_TOKENS
    assert f"stops at {NOCACHE_MAX_NEW_TOKENS} new tokens (asked for {asked})" in result.note


def test_ar_without_a_cache_samples_what_ar_samples(tiny_pair):
    ar = specdemo.generate(tiny_pair, PROMPT, "ar", max_new_tokens=30, temperature=1.0, seed=7)
    nocache = specdemo.generate(tiny_pair, PROMPT, "ar-nocache", max_new_tokens=30, temperature=1.0, seed=7)
    assert nocache.token_ids == ar.token_ids


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 20, "seed": 3}], ids=["greedy", "sampled"])
def test_the_draft_alone_writes_what_the_draft_model_writes_as_a_target(tiny_pair, sampling):
    draft_as_target = dataclasses.replace(tiny_pair, target=tiny_pair.draft, draft=None)
    expected = specdemo.generate(draft_as_target, PROMPT, "ar", max_new_tokens=30, **sampling)
    alone = specdemo.generate(tiny_pair, PROMPT, "draft", max_new_tokens=30, **sampling)
    assert alone.token_ids == expected.token_ids
    target_ar = specdemo.generate(tiny_pair, PROMPT, "ar", max_new_tokens=30, **sampling)
    assert alone.token_ids != target_ar.token_ids, "the draft is its own model, not the target"
    assert alone.target_forwards == 0 and alone.draft_forwards == len(alone.tokens)


def test_the_draft_alone_is_refused_for_a_feature_head_and_for_no_draft(tiny_pair):
    head = with_head(tiny_pair, list(range(0, 64, 2)))
    with pytest.raises(ValueError, match="feature head, which cannot write without the target's hidden states"):
        specdemo.generate(head, PROMPT, "draft", max_new_tokens=4)
    assert "draft" not in available_methods(head) and "sd" in available_methods(head)
    bare = dataclasses.replace(tiny_pair, draft=None)
    with pytest.raises(ValueError, match="needs a draft model"):
        specdemo.generate(bare, PROMPT, "draft", max_new_tokens=4)
    assert "draft" in available_methods(tiny_pair)


def test_beam_search_with_one_beam_is_greedy_decoding(tiny_pair):
    ar = specdemo.generate(tiny_pair, PROMPT, "ar", max_new_tokens=30)
    beam = specdemo.generate(tiny_pair, PROMPT, "beam", max_new_tokens=30, num_beams=1)
    assert beam.token_ids == ar.token_ids


def test_beam_search_keeps_several_beams_and_traces_one_round_per_token(tiny_pair):
    ar = specdemo.generate(tiny_pair, PROMPT, "ar", max_new_tokens=30)
    beam = specdemo.generate(tiny_pair, PROMPT, "beam", max_new_tokens=30, num_beams=4)
    assert beam.token_ids != ar.token_ids, "four beams find a likelier sequence than greedy here"
    assert beam.done and beam.params["num_beams"] == 4
    assert len(beam.rounds) == len(beam.tokens) and {t.origin for t in beam.tokens} == {TARGET}
    ends = [r.end_seconds for r in beam.rounds]
    assert ends == sorted(ends) and ends[-1] <= beam.seconds
    assert beam.text == tiny_pair.tokenizer.decode(beam.token_ids, skip_special_tokens=True)


def test_only_lossless_methods_are_compared_with_ar(tiny_pair):
    results = [specdemo.generate(tiny_pair, PROMPT, m, max_new_tokens=12) for m in ("ar", "sd", *BASELINES)]
    table = summary_frame(results).set_index("method")
    assert table.loc["sd", "matches_ar"] is True and table.loc["ar-nocache", "matches_ar"] is True
    assert table.loc["beam", "matches_ar"] is None and table.loc["draft", "matches_ar"] is None
    assert not METHODS["beam"].lossless and not METHODS["draft"].lossless and METHODS["ar-nocache"].lossless


def test_capped_ar_without_a_cache_matches_ars_first_tokens(tiny_pair):
    longer = NOCACHE_MAX_NEW_TOKENS + 20
    ar = specdemo.generate(tiny_pair, [1, 40, 41], "ar", max_new_tokens=longer)
    capped = specdemo.generate(tiny_pair, [1, 40, 41], "ar-nocache", max_new_tokens=longer)
    assert len(ar.tokens) > len(capped.tokens) == NOCACHE_MAX_NEW_TOKENS
    assert summary_frame([ar, capped]).set_index("method").loc["ar-nocache", "matches_ar"]


def test_the_page_reads_each_baseline_in_one_line_and_shows_the_cap(tiny_pair):
    from specdemo.app import viz

    results = [specdemo.generate(tiny_pair, PROMPT, m, max_new_tokens=NOCACHE_MAX_NEW_TOKENS + 5)
               for m in ("ar", "sd", *BASELINES)]
    summary = summary_frame(results)
    reading = viz.explain(summary).splitlines()
    assert len(reading) == 5
    by_label = {line.split("**")[1]: line for line in reading}
    assert "beam search's most likely sequence" in by_label["Beam search"]
    assert "the draft model writing by itself" in by_label["Draft alone"]
    assert "what the KV cache buys (AR (no cache) stops at 128 new tokens" in by_label["AR (no cache)"]
    table = viz.display_table(summary).set_index("method")
    assert table.loc["Beam search", "quality"] == "its own text (not meant to match AR)"
    assert table.loc["AR (no cache)", "quality"] == "identical to AR"
    panel = viz.render_panel("ar-nocache", results[-1], tiny_pair.tokenizer)
    assert f"capped at {NOCACHE_MAX_NEW_TOKENS} tokens" in panel and "at most 128 new tokens" in panel
    # Plain text: the baselines' tokens are all the target's own colour, no draft colours.
    beam_panel = viz.render_panel("beam", results[2], tiny_pair.tokenizer)
    assert "sd-target" in beam_panel and "sd-accepted" not in beam_panel and "sd-rejected" not in beam_panel


def test_engine_options_leave_the_baselines_tokens_alone(tiny_pair):
    for method in BASELINES:
        dynamic = specdemo.generate(tiny_pair, PROMPT, method, max_new_tokens=20, cache="dynamic")
        static = specdemo.generate(tiny_pair, PROMPT, method, max_new_tokens=20, cache="static")
        assert static.token_ids == dynamic.token_ids, method
    assert specdemo.generate(tiny_pair, PROMPT, "draft", max_new_tokens=4, cache="static").cache == "static"
    assert specdemo.generate(tiny_pair, PROMPT, "ar-nocache", max_new_tokens=4, cache="static").cache == "none"


def test_the_baselines_stop_at_eos(tiny_pair):
    for method in BASELINES:
        free = specdemo.generate(tiny_pair, PROMPT, method, max_new_tokens=30).token_ids
        eos = free[5]
        pair = dataclasses.replace(tiny_pair, eos_ids=frozenset({eos}))
        stopped = specdemo.generate(pair, PROMPT, method, max_new_tokens=30)
        assert stopped.stop_reason == "eos" and stopped.token_ids[-1] == eos, method
        assert eos not in stopped.token_ids[:-1]


def test_a_sweep_runs_the_baselines_once_each_beside_ar(tiny_pair):
    from specdemo.bench.sweep import expand_grid, run_sweep

    settings = expand_grid(gamma="2,3", methods="sd,beam,draft,ar-nocache")
    assert [s.key for s in settings] == ["ar", "sd:gamma=2", "sd:gamma=3", "beam", "draft", "ar-nocache"]
    result = run_sweep(tiny_pair, ["w5 w6 w7 w8", "w9 w10"], settings, repeats=1, warmup=False,
                       max_new_tokens=12)
    rows = result.rows
    assert set(rows.method) == {"ar", "sd", "beam", "draft", "ar-nocache"}
    assert rows[rows.method.isin(["sd", "ar-nocache"])].matches_ar.astype(bool).all()
    assert rows[rows.method.isin(["beam", "draft"])].matches_ar.isna().all()
    assert rows[rows.method != "ar"].speedup_vs_ar.notna().all()
    with pytest.raises(ValueError, match="baselines beam, draft, ar-nocache"):
        expand_grid(gamma="2", methods="sd,medusa")


def test_sampled_beam_search_follows_the_runs_seed(tiny_pair):
    runs = [specdemo.generate(tiny_pair, PROMPT, "beam", max_new_tokens=20, temperature=1.0, seed=s).token_ids
            for s in (1, 1, 2, 3)]
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs}) > 1
