"""Where and why a per-token policy stopped a round early: in the trace, the rounds CSV and the panel."""

from __future__ import annotations

import dataclasses
import html
import io
import re

import pandas as pd
import pytest

import specdemo
from specdemo.app import viz
from specdemo.bench.measure.tables import ROUND_COLUMNS, rounds_frame
from specdemo.engine import methods
from specdemo.engine.trace import StopNote

# The tiny draft's normalised entropy sits near 0.8, so at these thresholds some rounds stop after
# one or two drafts and others run to γ_max = 3 (and the last one to the room left in the output).
STOPPING = [
    ("egag-token", dict(entropy_stop=0.8)),
    ("adaedl", dict(adaedl_lambda=0.42)),
]
STOP_FIELDS = ["stop_rule", "stop_value", "stop_threshold", "stop_position"]
# A drafted token's tooltip that says why its round stopped: the round's last draft n, stopped before n + 1.
STOP_TOOLTIP = re.compile(r'title="round \d+ [^"]*?(?:accepted|rejected) draft (\d+)[^"]*?stopped before draft (\d+):')


def run_keeping_policy(pair, method: str, params: dict, monkeypatch):
    """A greedy run of `method` and the policy that drafted it."""
    spec = methods.METHODS[method]
    built = []

    def build(pair_, decode):
        drafter, policy = spec.build(pair_, decode)
        built.append(policy)
        return drafter, policy

    monkeypatch.setitem(methods.METHODS, method, dataclasses.replace(spec, build=build))
    result = specdemo.generate(pair, "w5 w6 w7 w8", method=method, max_new_tokens=40, gamma_max=3, copy_n=0,
                               **params)
    (policy,) = built
    return result, policy


@pytest.fixture(scope="module", params=STOPPING, ids=[m for m, _ in STOPPING])
def stopped_run(request, tiny_pair):
    method, params = request.param
    with pytest.MonkeyPatch.context() as monkeypatch:
        return run_keeping_policy(tiny_pair, method, params, monkeypatch)


def test_each_round_records_the_note_its_policy_kept(stopped_run):
    result, policy = stopped_run
    assert [r.early_stop for r in result.rounds] == policy.stops
    stopped = [r for r in result.rounds if r.early_stop is not None]
    assert stopped and len(stopped) < len(result.rounds), "some rounds stopped early and some did not"
    for r in stopped:
        note = r.early_stop
        assert isinstance(note, StopNote) and note.rule == policy.rule and note.threshold == policy.threshold
        assert note.position == len(r.drafted) < r.gamma, "it stopped before the draft it did not make"


def test_a_round_without_a_note_ran_to_its_cap(stopped_run):
    result, _ = stopped_run
    for r in result.rounds:
        if r.early_stop is None:
            room = 40 - sum(len(x.new_tokens) for x in result.rounds[: r.index]) - 1
            assert len(r.drafted) == min(r.gamma, room), r


@pytest.mark.parametrize("method", ["sd", "egag", "nasd"])
def test_policies_without_a_per_token_stop_record_none(tiny_pair, method):
    result = specdemo.generate(tiny_pair, "w5 w6 w7 w8", method=method, max_new_tokens=16)
    assert result.rounds and all(r.early_stop is None for r in result.rounds)


def test_the_rounds_csv_says_where_and_why_each_round_stopped(stopped_run):
    result, policy = stopped_run
    frame = rounds_frame([result])
    assert list(frame.columns) == ROUND_COLUMNS and ROUND_COLUMNS[-4:] == STOP_FIELDS
    written = pd.read_csv(io.StringIO(frame.to_csv(index=False)), keep_default_na=False)
    assert len(written) == len(policy.stops)
    for note, row in zip(policy.stops, written.to_dict("records")):
        if note is None:
            assert [row[name] for name in STOP_FIELDS] == ["", "", "", ""], "empty cells for a round without a stop"
        else:
            assert row["stop_rule"] == note.rule
            assert float(row["stop_value"]) == pytest.approx(note.value)
            assert float(row["stop_threshold"]) == pytest.approx(note.threshold)
            # Counted as the tokens CSV counts positions (1 = the round's first draft), and written as an integer.
            assert row["stop_position"] == str(note.position + 1) == str(row["n_drafted"] + 1)


def test_the_panel_says_why_a_round_stopped_on_its_last_draft(stopped_run, tiny_pair):
    result, policy = stopped_run
    panel = viz.render_panel(result.method, result, tiny_pair.tokenizer)
    notes = [note for note in policy.stops if note is not None]
    for note in notes:
        assert html.escape(viz.stop_text(note), quote=True) in panel
    assert panel.count("stopped before draft") == len(notes), "once per stopped round, nowhere else"
    last_drafts = STOP_TOOLTIP.findall(panel)
    assert len(last_drafts) == len(notes) and all(int(stop) == int(last) + 1 for last, stop in last_drafts)


@pytest.mark.parametrize("note, text", [
    (StopNote("entropy", 0.6234, 0.25, 2), "stopped before draft 3: entropy 0.62 > 0.25"),
    (StopNote("acceptance bound", 0.41, 0.5, 1), "stopped before draft 2: acceptance bound 0.41 < 0.50"),
    (StopNote("acceptance bound", 0.4198, 0.42, 1), "stopped before draft 2: acceptance bound 0.4198 < 0.4200"),
])
def test_the_stop_reads_as_the_rule_the_value_and_the_threshold_it_crossed(note, text):
    assert viz.stop_text(note) == text


def test_the_confidence_threshold_says_which_top_probability_stopped_a_round(tiny_pair):
    # The tiny draft is never confident: every round stops after its first draft, below 0.4.
    result = specdemo.generate(tiny_pair, "w5 w6 w7 w8", method="sd-confidence", max_new_tokens=16, gamma_max=3)
    notes = []
    for r in result.rounds:
        room = 16 - sum(len(x.new_tokens) for x in result.rounds[: r.index]) - 1
        if len(r.drafted) < min(r.gamma, room):  # stopped before its cap and the output's end
            notes.append(r.early_stop)
    assert notes and all(note is not None for note in notes)
    assert {(note.rule, note.threshold) for note in notes} == {("top probability", 0.4)}
    assert all(note.value < note.threshold for note in notes)
    assert "top probability" in viz.stop_text(notes[0]) and " < 0.40" in viz.stop_text(notes[0])
