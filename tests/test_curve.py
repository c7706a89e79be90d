"""The learning curve's reading: gain per doubling of the data and the data a goal needs."""

from specdemo.training.curve import extrapolate


def point(tokens, acceptance):
    return {"train_answer_tokens": tokens, "acceptance": acceptance}


def test_a_line_in_log_tokens_names_the_tokens_that_reach_the_goal():
    reading = extrapolate([point(1000, 0.10), point(2000, 0.20), point(4000, 0.30)], "acceptance", 0.40)
    assert reading["gain_per_doubling"] == 0.1
    assert abs(reading["tokens_needed"] - 8000) <= 1


def test_no_reading_without_two_sizes_or_without_a_rise():
    assert extrapolate([point(1000, 0.1)], "acceptance", 0.4) is None
    assert extrapolate([point(1000, 0.1), point(1000, 0.2)], "acceptance", 0.4) is None
    assert extrapolate([point(1000, 0.2), point(4000, 0.1)], "acceptance", 0.4) is None


def test_a_round_pays_for_its_drafts_and_a_verification_that_costs_more_than_one_forward():
    from specdemo.training.evaluate import round_speedup

    assert round_speedup(2.0, 0.0, 4, 1.0) == 2.0
    assert round_speedup(2.6, 0.1, 4, 1.766) == round(2.6 / 2.166, 3)
    assert round_speedup(1.55, 0.073, 4, 1.66) < 1  # the embedded pair's head on a CPU: SD loses
