"""Replayed greedy rounds of an n-gram table filled with a corpus's answers."""

from specdemo.training.evaluate import corpus_table, replay_greedy, replay_table_rounds, table_acceptance

PROMPT = [1, 2, 3]
ANSWER = [10, 11, 12, 13, 14, 15, 16, 17, 18]


def test_a_corpus_that_holds_the_answer_drafts_it_whole():
    table = corpus_table([([7, 7], ANSWER)], n=3)
    replay = replay_table_rounds(table, PROMPT, ANSWER, gamma=4)
    # The first token has no context in the table; from then on every draft is right.
    assert replay.new_tokens == len(ANSWER)
    assert replay.acceptance == 1.0
    assert replay.rounds == 3  # 1 + (4 + 1) + the last 3 tokens (2 drafts + 1)


def test_an_empty_corpus_drafts_only_what_the_prompt_and_output_repeat():
    replay = replay_table_rounds(corpus_table([], n=3), PROMPT, ANSWER, gamma=4)
    assert (replay.drafted, replay.accepted, replay.rounds) == (0, 0, len(ANSWER))


def test_the_request_and_the_verified_output_come_before_the_corpus():
    # The corpus says 3 -> 99, the request itself says ... 2, 3 -> 4: the request wins.
    table = corpus_table([([0], [2, 3, 99])], n=3)
    report = table_acceptance(table, [([2, 3, 4, 2, 3], [4, 5])], gamma=1)
    assert report["acceptance"] == 1.0 and report["tokens_per_round"] == 2.0


def _replay_a_perfect_drafter(gamma: int, leave_room: bool):
    def propose(sequence, limit):
        done = len(sequence) - len(PROMPT)
        return ANSWER[done : done + min(gamma, limit)]

    return replay_greedy(PROMPT, ANSWER, propose, observe=lambda *_: None, leave_room=leave_room)


def test_a_round_leaves_room_for_the_targets_token_unless_told_not_to():
    # 9 answer tokens at γ = 4: (4 + 1) then the last 4 as 3 drafts + the target's own token ...
    kept_short = _replay_a_perfect_drafter(4, leave_room=True)
    assert (kept_short.rounds, kept_short.drafted, kept_short.accepted) == (2, 7, 7)
    # ... or drafted to the end, where a round accepted whole adds no token of the target's.
    to_the_end = _replay_a_perfect_drafter(4, leave_room=False)
    assert (to_the_end.rounds, to_the_end.drafted, to_the_end.accepted) == (2, 8, 8)
    assert kept_short.new_tokens == to_the_end.new_tokens == len(ANSWER)


def test_verification_and_draft_lm_costs_are_measured_relative_to_one_target_forward(tiny_pair):
    from specdemo.training.curve import lm_draft_cost
    from specdemo.training.evaluate import verification_cost

    ratio = verification_cost(tiny_pair.target, tokens=5, context=16, calls=5)
    assert ratio > 0 and ratio == round(ratio, 3)
    assert lm_draft_cost(tiny_pair, calls=5, context=16) > 0


def test_suite_requests_are_evaluated_as_the_benchmark_feeds_them_and_their_answers_are_greedy_ar(tiny_pair, tmp_path):
    import json

    from specdemo import generate
    from specdemo.training.evaluate import greedy_answers, suite_requests

    questions = tmp_path / "question.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in [
        {"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Now make it rhyme."]},
        {"question_id": 2, "category": "math", "turns": ["What is two plus two?"]},
    ]))
    ids, categories = suite_requests(tiny_pair, questions)
    assert categories == ["writing", "math"]
    # A question of several turns is asked by its first turn alone, through the chat template.
    assert ids == [tiny_pair.encode("Write a haiku.", chat=True), tiny_pair.encode("What is two plus two?", chat=True)]
    answers = greedy_answers(tiny_pair, ids, max_new_tokens=5)
    assert [prompt for prompt, _ in answers] == ids
    expected = generate(tiny_pair, ids[1], method="ar", max_new_tokens=5, temperature=0.0).token_ids
    assert answers[1][1] == list(expected) and len(expected) > 0


def test_the_share_of_answer_tokens_outside_the_subset_counts_answers_not_prompts():
    from types import SimpleNamespace

    import torch

    from specdemo.training.evaluate import outside_subset_share

    head = SimpleNamespace(subset=torch.tensor([1, 2, 3]))
    answers = [([9, 9, 9], [1, 2, 7]), ([8], [3, 5, 3, 1, 2])]
    assert outside_subset_share(head, answers) == round(2 / 8, 4)
    assert outside_subset_share(head, []) == 0.0
