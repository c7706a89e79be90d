"""The Playground's updates: a property (visibility, interactivity) is sent only where it changes,
since Gradio rebuilds a component's whole configuration for each one; everything else goes as a value."""

from __future__ import annotations

import gradio as gr
import pytest
from gradio.utils import is_prop_update

from specdemo.app.handlers import RunUpdate
from specdemo.app.playgroundtab import Shown, _outputs
from specdemo.app.streams import BySession

INITIAL = {"methods": ["ar", "sd", "nasd", "egag"]}
FILES = ("summary.csv", "rounds.csv", "tokens.csv")


@pytest.fixture(scope="module")
def outputs():
    with gr.Blocks():
        return _outputs(INITIAL)


def final(shown: int = 4, trees: bool = False) -> RunUpdate:
    """A run's last update, as `handlers.final_update` makes it (figures left out)."""
    return RunUpdate(status="Done in 3.0 s", shown=shown, panels={k: f"<p>panel {k}</p>" for k in range(shown)},
                     charts_shown=True, trees_shown=trees, table=None, why="", files=FILES)


def property_updates(out: dict) -> set:
    return {component for component, value in out.items() if is_prop_update(value)}


def test_the_first_run_shows_the_charts_and_the_files_then_the_next_sends_values_alone(outputs):
    opened = Shown(panels=4)
    first, after = outputs.apply(final(), opened)
    assert property_updates(first) == {outputs.placeholder, *outputs.chart_groups, *outputs.files}
    assert after == Shown(panels=4, charts=True, trees=False, files=True)
    second, again = outputs.apply(final(), after)
    assert property_updates(second) == set() and again == after
    # The values still come: every shown panel and every file.
    assert [second[panel] for panel in outputs.panels[:4]] == [f"<p>panel {k}</p>" for k in range(4)]
    assert [second[button] for button in outputs.files] == list(FILES)


def test_fewer_methods_hide_only_the_slots_that_go_and_leave_hidden_ones_alone(outputs):
    shown = Shown(panels=4, charts=True, files=True)
    out, after = outputs.apply(final(shown=2), shown)
    assert property_updates(out) == set(outputs.panels[2:4])
    assert all(out[panel]["visible"] is False for panel in outputs.panels[2:4])
    assert [out[panel] for panel in outputs.panels[:2]] == ["<p>panel 0</p>", "<p>panel 1</p>"]
    assert not set(outputs.panels[4:]) & set(out)
    assert after.panels == 2
    more, _ = outputs.apply(final(shown=3), after)
    assert property_updates(more) == {outputs.panels[2]} and more[outputs.panels[2]]["visible"] is True


def test_the_trees_section_shows_and_hides_only_when_a_run_changes_it(outputs):
    shown = Shown(panels=4, charts=True, files=True)
    out, with_trees = outputs.apply(final(trees=True), shown)
    assert property_updates(out) == {outputs.trees} and with_trees.trees
    out, _ = outputs.apply(final(trees=True), with_trees)
    assert property_updates(out) == set()
    out, without = outputs.apply(final(trees=False), with_trees)
    assert property_updates(out) == {outputs.trees} and not without.trees


def test_cleared_files_turn_the_buttons_off_once(outputs):
    shown = Shown(panels=4, charts=True, files=True)
    out, cleared = outputs.apply(RunUpdate(files=(None, None, None)), shown)
    assert property_updates(out) == set(outputs.files) and all(not out[b]["interactive"] for b in outputs.files)
    out, _ = outputs.apply(RunUpdate(files=(None, None, None)), cleared)
    assert property_updates(out) == set()


def test_status_lines_change_nothing_else(outputs):
    shown = Shown(panels=4)
    out, after = outputs.apply(RunUpdate(status="SD: round 3"), shown)
    assert out == {outputs.status: "SD: round 3"} and after == shown


def test_each_visitor_has_their_own_page_until_their_tab_closes():
    sessions = BySession(Shown(panels=4))
    sessions.set("a", Shown(panels=2, charts=True))
    assert sessions.get("a") == Shown(panels=2, charts=True)
    assert sessions.get("b") == Shown(panels=4)  # as the page opened
    assert sessions.pop("a") == Shown(panels=2, charts=True)
    assert sessions.get("a") == Shown(panels=4)


def test_a_runs_table_goes_to_the_first_table_and_its_details_below_it(outputs):
    import pandas as pd

    from specdemo.app import viz

    table = pd.DataFrame([{column: f"{column} of AR" for column in viz.DISPLAY_COLUMNS}])
    table["first divergence"] = "–"
    out, _ = outputs.apply(RunUpdate(table=table), Shown(panels=4))
    assert list(out[outputs.table].columns) == viz.FIRST_COLUMNS
    assert list(out[outputs.details].columns)[0] == "method"
    assert set(out[outputs.table].columns) | set(out[outputs.details].columns) == set(viz.DISPLAY_COLUMNS)
    assert outputs.details in outputs.all()  # /run sends the details too
