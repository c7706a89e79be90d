"""The one interleaved player the benchmark and the sweep share (bench.measure.schedule)."""

from specdemo.bench.measure.schedule import base_seed, play, schedule, turn_seed, warm_up_turn


def test_alone_each_prompt_rotates_the_order_and_asks_every_part_of_a_conversation_in_it():
    turns = list(schedule(2, "abc", 2, 10, indices=[5, 7], parts=lambda prompt: 2 if prompt == 1 else 1))
    assert [(t.repeat, t.index, t.prompts, t.places, t.part, "".join(t.order)) for t in turns] == [
        (0, 5, (0,), (5,), 1, "cab"), (0, 7, (1,), (7,), 1, "bca"), (0, 7, (1,), (7,), 2, "bca"),
        (1, 5, (0,), (5,), 1, "abc"), (1, 7, (1,), (7,), 1, "cab"), (1, 7, (1,), (7,), 2, "cab")]
    assert [t.seed for t in turns] == [turn_seed(10, t.repeat, t.index) for t in turns]


def test_a_batch_seeds_its_first_row_as_that_prompt_alone():
    turns = list(schedule(3, "ab", 1, base_seed(None), sizes=[2]))
    assert [(t.index, t.prompts, t.size, t.seed) for t in turns] == [(0, (0, 1), 2, 1234), (1, (2, 0), 2, 1236)]


def test_play_asks_a_stop_once_after_each_run_and_ends_after_the_run_it_was_asked_after():
    asked = []

    def should_stop():
        asked.append(True)
        return len(asked) == 4

    turns = [warm_up_turn("ab", 1), *schedule(2, "ab", 1, 1)]
    steps = [(step.turn.warm, step.contender, step.last, step.stopped)
             for step in play(turns, lambda turn, position, c: (c, position), should_stop)]
    assert steps == [(True, "a", False, False), (True, "b", True, False), (False, "a", False, False),
                     (False, "b", True, True)]
    assert len(asked) == 4


def test_a_step_read_after_it_is_passed_on_is_asked_then():
    order = []
    for step in play([warm_up_turn("ab", 1)], lambda *_: None, lambda: order.append("asked") or True):
        order.append(f"seen {step.contender}")
        assert step.stopped
    assert order == ["seen a", "asked"]
