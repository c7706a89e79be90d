"""A tab's run on the page: progress lines into the status line alone, the finished run drawn by
the event after it (Gradio rebuilds every output an update leaves alone), the API's endpoint
streaming the same run as one event with every output."""

from __future__ import annotations

import pytest
from gradio.utils import is_prop_update

from specdemo.app.streams import BySession, StatusThenDraw

FINISHED = ("Done: 3 runs", "table", "chart", "file")


def run(*progress: str, outputs: tuple = FINISHED):
    yield from progress
    yield outputs


def is_skip(value) -> bool:
    """gr.skip(): a property update without properties, which leaves its output as it is."""
    return is_prop_update(value) and set(value) == {"__type__"}


def test_the_page_gets_the_progress_lines_alone_and_the_finished_run_waits_for_the_draw():
    streams = StatusThenDraw(len(FINISHED))
    lines = list(streams.status_lines(run("Loading …", "Running: 1/3"), session="visitor"))
    assert lines == ["Loading …", "Running: 1/3"]
    assert streams.draw("visitor") == FINISHED


def test_a_run_is_drawn_once_and_only_for_its_visitor():
    streams = StatusThenDraw(len(FINISHED))
    list(streams.status_lines(run("Running: 1/1"), session="visitor"))
    assert all(is_skip(value) for value in streams.draw("someone else"))
    assert streams.draw("visitor") == FINISHED
    again = streams.draw("visitor")
    assert len(again) == len(FINISHED) and all(is_skip(value) for value in again)


def test_a_run_that_failed_or_was_stopped_leaves_every_output_as_it_was():
    streams = StatusThenDraw(len(FINISHED))

    def failing():
        yield "Running: 1/3"
        raise ValueError("the pair could not be loaded")

    with pytest.raises(ValueError):
        list(streams.status_lines(failing(), session="visitor"))
    stopped = streams.status_lines(run("Running: 1/3", "Running: 2/3"), session="visitor")
    next(stopped)
    stopped.close()
    assert all(is_skip(value) for value in streams.draw("visitor"))


def test_a_closed_tab_drops_the_run_it_kept():
    streams = StatusThenDraw(len(FINISHED))
    list(streams.status_lines(run(), session="visitor"))
    streams.forget("visitor")
    assert all(is_skip(value) for value in streams.draw("visitor"))


def test_the_api_streams_every_output_each_progress_line_leaving_the_others_alone():
    streams = StatusThenDraw(len(FINISHED))
    updates = list(streams.every_output(run("Loading …", "Running: 1/3")))
    assert [update[0] for update in updates] == ["Loading …", "Running: 1/3", "Done: 3 runs"]
    for update in updates[:2]:
        assert len(update) == len(FINISHED) and all(is_skip(value) for value in update[1:])
    assert updates[-1] == FINISHED


def test_a_value_per_visitor_falls_back_to_the_default_and_goes_with_the_tab():
    values = BySession(default=0)
    values.set("a", 3)
    assert (values.get("a"), values.get("b")) == (3, 0)
    assert values.pop("a") == 3 and values.get("a") == 0


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from specdemo.app import ui
    from tests.uiserver import tiny_loader, tiny_presets

    root = tmp_path_factory.mktemp("streams-demo")
    return ui.build_demo(pair_loader=tiny_loader, presets=tiny_presets(root))


@pytest.mark.parametrize("tab", ["sd", "bench", "sweep"])
def test_each_tabs_run_button_streams_into_its_status_line_alone_and_the_next_event_draws(demo, tab):
    button = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == f"{tab}-run")
    run_event = next(f for f in demo.fns.values() if (button._id, "click") in f.targets)
    assert [getattr(o, "elem_id", None) for o in run_event.outputs] == [f"{tab}-status"]
    draw = next(f for f in demo.fns.values() if f.trigger_after == run_event._id)
    assert len(draw.outputs) > 5 and run_event.outputs[0] in draw.outputs
    # Progress on the status line alone: a drawn chart given a loading status would be copied in the
    # browser at every progress line of every later run.
    assert draw.show_progress_on == run_event.outputs


def test_the_benchmark_endpoint_still_streams_every_output(demo):
    endpoint = next(f for f in demo.fns.values() if f.api_name == "benchmark")
    ids = [getattr(o, "elem_id", None) for o in endpoint.outputs]
    assert ids[0] == "bench-status" and "bench-table" in ids and "bench-summary-csv" in ids
