"""The Playground's What-if panel: each setting's replayed figures are a real run's, and a sampled Run is
refused in the engine's words."""

from __future__ import annotations

import math

import pytest

import specdemo
from specdemo.app import whatif
from specdemo.bench.measure.costs import calibrate
from specdemo.engine.methods import METHODS, REFERENCE
from specdemo.engine.params import DecodeParams

PROMPT = [3, 17, 29, 5, 41, 8]
LENGTH = 24


@pytest.fixture(scope="module")
def runs(tiny_pair):
    """The Run's greedy AR, SD and EGAG on the tiny pair, as the page would hand them over."""
    params = DecodeParams.resolve(None, max_new_tokens=LENGTH, chat=False)
    return params, [specdemo.generate(tiny_pair, PROMPT, name, max_new_tokens=LENGTH)
                    for name in (REFERENCE, whatif.FIXED.name, whatif.ADAPTIVE.name)]


@pytest.fixture(scope="module")
def prepared(tiny_pair, runs):
    params, results = runs
    return whatif.prepare(tiny_pair, PROMPT, params, results, costs=calibrate(tiny_pair, PROMPT, max_new_tokens=12))


def test_the_panel_replays_the_registrys_fixed_and_adaptive_default_methods():
    assert not whatif.FIXED.adapts and whatif.ADAPTIVE.adapts
    assert {k.method for k in whatif.KNOBS} == {whatif.FIXED.name, whatif.ADAPTIVE.name}
    assert all(k.high <= whatif.MAX_GAMMA for k in whatif.KNOBS if k.name.startswith("gamma"))
    assert {k.name for k in whatif.KNOBS if k.method == whatif.ADAPTIVE.name} >= {"gamma_max", "ema"}


@pytest.mark.parametrize("method, params", [("sd", dict(gamma=1)), ("sd", dict(gamma=5)),
                                            ("egag", dict(gamma_max=6, ema=0.5)), ("egag", dict(gamma_max=3, ema=0.0))])
def test_a_settings_figures_are_a_real_runs(tiny_pair, prepared, method, params):
    figures = whatif.figures(prepared, method, **params)
    real = specdemo.generate(tiny_pair, PROMPT, method, max_new_tokens=LENGTH, **params).stats
    assert figures.tau == real["mean_accepted_tokens"]
    assert figures.rounds == real["rounds"]
    assert figures.acceptance == pytest.approx(real["acceptance_rate"], nan_ok=True)
    assert figures.tokens_per_s > 0 and figures.speedup > 0


def test_gamma_min_above_gamma_max_is_lowered_to_it(prepared):
    figures = whatif.figures(prepared, "egag", gamma_min=5, gamma_max=2)
    assert figures.params["gamma_min"] == figures.params["gamma_max"] == 2


def test_the_curve_covers_every_gamma_and_the_chart_marks_the_runs_measured_settings(prepared, runs):
    curve = whatif.gamma_curve(prepared)
    assert [f.params["gamma"] for f in curve] == list(range(1, whatif.MAX_GAMMA + 1))
    marked = whatif.measured_speedups(prepared)
    assert [x for _, x, _, _ in marked] == [3, 4]  # SD at its γ, EGAG at its γ_max: the schema's defaults
    _, results = runs
    assert marked[0][2] == results[1].stats["tokens_per_s"] / results[0].stats["tokens_per_s"]
    assert marked[0][3] == whatif.figures(prepared, "sd", gamma=3).speedup  # predicted by that setting's replay
    assert "The prediction at the Run's own settings" in whatif.figures_markdown(prepared, curve[:1])
    figure = whatif.curve_figure(prepared, curve)
    names = [trace.name for trace in figure.data]
    assert any("measured" in name for name in names)


def test_the_sliders_read_every_knob_in_order(prepared):
    values = [2 if k.name == "gamma" else 5 if k.name == "gamma_max" else 1 if k.name == "gamma_min" else 0.5
              for k in whatif.KNOBS]
    shown = whatif.slider_figures(prepared, values)
    assert [f.method for f in shown] == [whatif.FIXED.name, whatif.ADAPTIVE.name]
    assert shown[0].params["gamma"] == 2 and shown[1].params["gamma_max"] == 5 and shown[1].params["ema"] == 0.5
    text = whatif.figures_markdown(prepared, shown)
    assert METHODS["sd"].label in text and "τ" in text and "acceptance" in text


def test_a_sampled_run_is_refused_in_the_engines_words(tiny_pair, runs):
    sampled = DecodeParams.resolve(None, max_new_tokens=LENGTH, temperature=0.7)
    reason = whatif.sampling_refusal(sampled)
    assert "temperature 0.7 samples" in reason and "greedy AR's path" in reason
    assert whatif.sampling_refusal(runs[0]) == ""
    with pytest.raises(ValueError, match="temperature 0.7 samples"):
        whatif.prepare(tiny_pair, PROMPT, sampled, runs[1], costs=None)


def test_without_a_cost_table_the_figures_are_exact_and_no_speed_is_predicted(tiny_pair, runs):
    params, results = runs
    bare = whatif.prepare(tiny_pair, PROMPT, params, results, costs=None)
    figures = whatif.figures(bare, "sd", gamma=2)
    assert math.isnan(figures.speedup) and figures.tau >= 1
    assert "no prediction" in whatif.figures_markdown(bare, [figures])
