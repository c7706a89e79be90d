"""Where an output leaves AR's, and whether AR's own choice there was a near-tie (`engine.divergence`):
the first differing index, AR's top-1 minus top-2 logit there, and how that reads to a person."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import specdemo
from specdemo.engine.decoding import top2_margins
from specdemo.engine.divergence import (NEAR_TIE_MARGIN, describe_margin, divergence, divergence_where_compared,
                                        first_divergence, is_near_tie, margin_at)
from tests.tiny import build_tiny_pair, verification_swaps_the_top_two


def test_the_first_divergence_is_the_first_index_that_differs_and_none_where_equal():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([9, 2, 3], [1, 2, 3]) == 0
    assert first_divergence([], []) is None


def test_an_output_that_runs_on_past_the_other_diverges_where_the_shorter_ends():
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([1, 2, 3, 4], [1, 2]) == 2


def test_the_margin_is_the_references_at_the_divergence_and_nan_without_one():
    margins = [4.0, 0.2, 3.5]
    assert divergence([1, 9, 3], [1, 2, 3], margins) == (1, 0.2)
    index, margin = divergence([1, 2, 3], [1, 2, 3], margins)
    assert index is None and math.isnan(margin)
    assert math.isnan(margin_at([4.0], 3))  # a reference that recorded fewer margins than tokens


def test_only_a_compared_row_that_differs_has_a_divergence():
    """A row that matched (a capped run that is AR's prefix included) or was not compared has none."""
    assert divergence_where_compared(False, [1, 9], [1, 2], [1.0, 0.3]) == (1, 0.3)
    for matches in (True, None, math.nan):
        index, margin = divergence_where_compared(matches, [1], [1, 2], [1.0, 0.3])
        assert index is None and math.isnan(margin)


def test_a_near_tie_is_a_margin_under_the_threshold():
    assert is_near_tie(NEAR_TIE_MARGIN - 1e-6) and not is_near_tie(NEAR_TIE_MARGIN) and not is_near_tie(math.nan)


@pytest.mark.parametrize("margin, words", [(0.12, "near-tie (margin 0.12)"), (3.4, "not a near-tie (margin 3.4)"),
                                           (math.nan, "margin unknown")])
def test_a_margin_reads_as_near_tie_or_not_with_its_value(margin, words):
    assert describe_margin(margin) == words


def test_a_rounds_margins_are_top1_minus_top2_of_each_row_that_chose_a_token():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.5], [5.0, 1.0, 0.0, 0.0], [9.0, 0.0, 0.0, 0.0]])
    assert top2_margins(logits, 2).tolist() == pytest.approx([0.5, 4.0])
    short = top2_margins(logits[:1], 2).tolist()
    assert short[0] == pytest.approx(0.5) and math.isnan(short[1])


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("divergence"))


def test_ar_records_its_top2_margin_at_every_token(tiny_pair):
    result = specdemo.generate(tiny_pair, [1, 5, 9, 13], method="ar", max_new_tokens=8, temperature=0.0)
    assert len(result.top2_margins) == len(result.token_ids) == 8
    assert all(m > 0 for m in result.top2_margins)  # a greedy choice is its row's top-1


def test_a_benchmark_fills_the_divergence_of_a_row_that_differs_and_leaves_equal_rows_empty(tiny_pair):
    """Greedy SD equals AR on this float64 pair: its columns stay empty. With a planted verification that
    swaps the top two, SD leaves AR's tokens at its first verified token (0), by AR's own margin there."""
    from specdemo.bench import run_benchmark
    from specdemo.bench.suite import SuitePrompt, encode_prompt

    suite = [SuitePrompt("p", "chat", "w5 w9 w13 w17")]
    settings = dict(repeats=1, warmup=False, max_new_tokens=8, temperature=0.0, chat=False)
    equal = run_benchmark(tiny_pair, suite, ["ar", "sd"], **settings).rows.set_index("method")
    assert equal.loc["sd", "matches_ar"]
    assert equal[["first_divergence", "divergence_margin"]].isna().all().all()
    with verification_swaps_the_top_two(tiny_pair):
        result = run_benchmark(tiny_pair, suite, ["ar", "sd"], **settings)
    rows = result.rows.set_index("method")
    assert not rows.loc["sd", "matches_ar"] and rows.loc["sd", "first_divergence"] == 0
    ar = specdemo.generate(tiny_pair, encode_prompt(tiny_pair, suite[0], False), method="ar", max_new_tokens=8,
                           temperature=0.0)
    assert rows.loc["sd", "divergence_margin"] == pytest.approx(ar.top2_margins[0])
    assert pd.isna(rows.loc["ar", "first_divergence"]) and pd.isna(rows.loc["ar", "divergence_margin"])
    summary = result.summary[result.summary.method == "sd"]
    assert (summary.first_divergence == 0).all()
    assert summary.divergence_margin.to_numpy() == pytest.approx([ar.top2_margins[0]] * len(summary))
