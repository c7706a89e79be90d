"""Trees on the page and in the CSVs: the tree figure, the per-round tree chart, the nodes table."""

import dataclasses

import pytest

import specdemo
from specdemo.app import viz
from specdemo.app.charts import all_charts
from specdemo.app.tree_view import _round_traces, node_states, tree_figure, tree_layout, tree_rounds_figure
from specdemo.bench.measure.tables import NODE_COLUMNS, ROUND_COLUMNS, nodes_frame, rounds_frame, summary_frame
from specdemo.engine.trace import ACCEPTED, REJECTED, StopNote, TreeRecord

PROMPT = "w5 w6 w7 w8"
# root ─ 1 ─ 3 ─ 5        kept: 1, 3; refused at 3: 5; refused at the root: 2; 4 under 2 never reached
#      └ 2 ─ 4
TREE = TreeRecord(tokens=[10, 11, 12, 13, 14], parents=[0, 0, 1, 2, 3], depths=[1, 1, 2, 2, 3],
                  q=[0.6, 0.3, 0.9, None, 0.5], p=[0.7, 0.1, 0.8, 0.2, 0.1], path=[1, 3])


@pytest.fixture(scope="module")
def runs(tiny_pair):
    return [specdemo.generate(tiny_pair, PROMPT, method=m, max_new_tokens=20, node_budget=6)
            for m in ("ar", "sd", "sd-tree")]


def test_node_states_mark_the_kept_path_the_refused_and_the_unreached():
    assert node_states(TREE) == [ACCEPTED, REJECTED, ACCEPTED, "", REJECTED]


def test_the_layout_puts_depth_on_x_and_parents_between_their_children():
    xs, ys = tree_layout(TREE)
    assert xs == [0, 1, 1, 2, 2, 3]
    assert ys[1] == ys[3] == ys[5]  # a single child sits level with its parent
    assert ys[0] == (ys[1] + ys[2]) / 2 and ys[1] != ys[2]


def test_the_tree_figure_has_one_slider_step_per_tree_round_and_shows_one_round(runs):
    tree_run = runs[2]
    figure = tree_figure(tree_run)
    steps = figure.layout.sliders[0].steps
    assert [int(s.label) for s in steps] == [r.index for r in tree_run.rounds if r.tree.nodes]
    visible = [t for t in figure.data if t.visible]
    first = tree_run.rounds[0]
    nodes = next(t for t in visible if t.mode == "markers+text" and t.marker.symbol != "star")
    assert len(nodes.x) == first.tree.nodes + 1  # the root and every node
    star = [t for t in visible if t.marker.symbol == "star"]
    assert len(star) == 1 and star[0].text[0] == str(first.next_token)
    # Each step shows exactly its own round's traces: every trace is shown by one step, the first
    # step's being those the figure opens with.
    shown_by_step = [step.args[0]["visible"] for step in steps]
    assert len(steps) > 1, "the run has several tree rounds to step through"
    assert all(sum(shown) == 1 for shown in zip(*shown_by_step))
    assert shown_by_step[0] == [bool(t.visible) for t in figure.data]


def test_without_tree_rounds_the_figure_says_what_to_run(runs):
    assert "sd-tree" in tree_figure(runs[1]).layout.title.text


def test_the_per_round_chart_draws_nodes_depth_and_kept_drafts_of_tree_methods_only(runs):
    figure = tree_rounds_figure(runs)
    assert [t.name for t in figure.data] == ["SD-tree nodes drafted", "SD-tree depth reached", "SD-tree accepted"]
    rounds = runs[2].rounds
    assert list(figure.data[0].y) == [r.tree.nodes for r in rounds]
    assert list(figure.data[2].y) == [r.accepted for r in rounds]


def test_the_page_gets_both_tree_charts(runs):
    figures = all_charts(runs)
    assert {"tree", "tree_rounds"} <= set(figures)
    assert figures["tree"].layout.sliders


def test_rounds_csv_has_tree_columns_and_the_nodes_csv_one_row_per_node(runs):
    rounds = rounds_frame(runs)
    assert list(rounds.columns) == ROUND_COLUMNS
    tree_rows = rounds[rounds.method == "sd-tree"]
    assert list(tree_rows.tree_nodes) == [r.tree.nodes for r in runs[2].rounds]
    assert list(tree_rows.accepted_depth) == [r.accepted for r in runs[2].rounds]
    sd_rows = rounds[rounds.method == "sd"]
    assert list(sd_rows.tree_nodes) == list(sd_rows.n_drafted) == list(sd_rows.tree_depth)
    nodes = nodes_frame(runs)
    assert list(nodes.columns) == NODE_COLUMNS and set(nodes.method) == {"sd-tree"}
    assert len(nodes) == sum(r.tree.nodes for r in runs[2].rounds)
    kept = nodes[nodes.state == "kept"].groupby("round").size()
    assert all(kept.get(r.index, 0) == r.accepted for r in runs[2].rounds)


def test_the_comparison_table_shows_nodes_per_round(runs):
    table = viz.display_table(summary_frame(runs))
    row = table[table.method == "SD-tree"].iloc[0]
    assert float(row["nodes / round"]) == pytest.approx(
        sum(r.tree.nodes for r in runs[2].rounds) / len(runs[2].rounds), abs=0.01)


def test_a_node_a_stop_rule_cut_says_why_in_its_hover_and_in_the_nodes_csv(runs):
    note = StopNote("entropy", 0.62, 0.25, 2)
    tree = dataclasses.replace(TREE, path=[1, 3], stops={3: note})
    assert tree.stop_at_path_end() == note and TREE.stop_at_path_end() is None
    r = dataclasses.replace(runs[2].rounds[0], tree=tree, early_stop=note)
    nodes = next(t for t in _round_traces(r, str) if t.get("mode") == "markers+text" and t.get("customdata"))
    assert "no children: stopped before draft 3: entropy 0.62 > 0.25" in nodes["customdata"][3]
    assert not any("no children" in text for i, text in enumerate(nodes["customdata"]) if i != 3)
    run = dataclasses.replace(runs[2], rounds=[r])
    frame = nodes_frame([run]).set_index("node")
    assert frame.at[3, "stop_rule"] == "entropy" and frame.at[3, "stop_position"] == 3
    assert frame.at[1, "stop_rule"] == "" and frame.stop_position.isna().sum() == 4
