"""A recorded target: every chain method's rounds replayed from one greedy AR run equal a real run's.

Equal means round by round: the policy's γ, the drafted tokens, how many the target kept, its own token,
the round's source (drafted or copied), and what each model was fed; a round that differs fails the test.
"""

from __future__ import annotations

import math

import pytest

import specdemo
from specdemo.engine.replay import Recording, chain_book, replay_grid
from tests.test_feature_drafter import with_head

PROMPTS = [[1, 5, 9, 13, 5, 9, 13, 5], [1, 7]]
LENGTH = 30

# (method, its settings): fixed γ 1, 3, 6, the adaptive rules, copying from the context, the tables.
SETTINGS = [
    ("sd", dict(gamma=1)), ("sd", dict(gamma=3)), ("sd", dict(gamma=6)), ("sd", dict(gamma=3, copy_n=2)),
    ("egag", dict(gamma_max=4, ema=0.5)), ("egag", dict(gamma_max=8, ema=0.9)),
    ("sd-heuristic", dict(gamma=3)), ("sd-confidence", dict(gamma_max=6)),
    ("adaedl", dict(gamma_max=6)), ("egag-token", dict(gamma_max=6, entropy_stop=0.5)),
    ("nasd", dict(gamma=3)), ("nasd", dict(gamma=3, top_k_filler=0)), ("rest", dict(gamma=4)),
]


def rounds_of(result) -> list[tuple]:
    return [(r.gamma, r.drafted, r.accepted, r.next_token, r.source, r.new_tokens) for r in result.rounds]


def assert_replays_the_run(pair, recording, prompt, method, settings, length=LENGTH):
    real = specdemo.generate(pair, prompt, method, max_new_tokens=length, **settings)
    replayed = specdemo.replay(recording, method, max_new_tokens=length, **settings)
    assert rounds_of(replayed) == rounds_of(real), (method, settings, prompt)
    assert replayed.token_ids == real.token_ids
    assert (replayed.target_forwards, replayed.draft_forwards) == (real.target_forwards, real.draft_forwards)
    assert replayed.fed == real.fed
    assert replayed.stop_reason == real.stop_reason
    return real, replayed


@pytest.fixture(scope="module")
def head_pair(tiny_pair):
    return with_head(tiny_pair, list(range(0, 64, 2)) + [3, 5, 7, 9])


@pytest.fixture(scope="module")
def recordings(tiny_pair, head_pair):
    return {(name, tuple(prompt)): specdemo.record(pair, prompt, max_new_tokens=LENGTH)
            for name, pair in (("lm", tiny_pair), ("head", head_pair)) for prompt in PROMPTS}


def test_the_recording_is_ars_run(tiny_pair, recordings):
    for prompt in PROMPTS:
        recording = recordings["lm", tuple(prompt)]
        ar = specdemo.generate(tiny_pair, prompt, "ar", max_new_tokens=LENGTH)
        assert recording.tokens == ar.token_ids
        assert recording.margins == pytest.approx(ar.top2_margins)
        assert recording.features is None  # a draft LM reads no states of the target


def test_a_head_pairs_recording_keeps_the_states_at_every_fed_position(recordings):
    recording = recordings["head", tuple(PROMPTS[0])]
    assert recording.features.shape[0] == len(PROMPTS[0]) + len(recording.tokens) - 1


@pytest.mark.parametrize("method,settings", SETTINGS, ids=lambda v: str(v))
@pytest.mark.parametrize("kind", ["lm", "head"])
def test_replayed_rounds_equal_a_real_runs(tiny_pair, head_pair, recordings, kind, method, settings):
    pair = tiny_pair if kind == "lm" else head_pair
    drafted = 0
    for prompt in PROMPTS:
        _, replayed = assert_replays_the_run(pair, recordings[kind, tuple(prompt)], prompt, method, settings)
        drafted += replayed.stats["drafted"]
    assert drafted > 0


def test_specdecpps_stop_replays_too(head_pair, recordings):
    for prompt in PROMPTS:
        assert_replays_the_run(head_pair, recordings["head", tuple(prompt)], prompt, "specdecpp",
                               dict(gamma_max=6, specdecpp_threshold=0.5))


def test_a_shorter_run_replays_from_a_longer_recording(tiny_pair, recordings):
    assert_replays_the_run(tiny_pair, recordings["lm", tuple(PROMPTS[0])], PROMPTS[0], "sd", dict(gamma=3),
                           length=11)


def test_a_replay_says_it_was_replayed_and_measures_no_time(recordings):
    replayed = specdemo.replay(recordings["lm", tuple(PROMPTS[0])], "sd", gamma=3)
    assert "replayed" in replayed.note and replayed.replayed
    assert not replayed.estimate  # the tiny float64 target verifies as AR steps
    assert math.isnan(replayed.seconds) and math.isnan(replayed.prefill_seconds)
    assert all(math.isnan(r.draft_seconds) and math.isnan(r.verify_seconds) for r in replayed.rounds)
    assert math.isnan(replayed.stats["tokens_per_s"])


def test_a_saved_recording_loads_back_and_replays_the_same(tmp_path, head_pair, recordings):
    recording = recordings["head", tuple(PROMPTS[0])]
    recording.save(tmp_path / "run.pt")
    loaded = Recording.load(tmp_path / "run.pt", head_pair)
    assert loaded.tokens == recording.tokens and loaded.margins == recording.margins
    assert (loaded.features == recording.features).all() and (loaded.top_ids == recording.top_ids).all()
    assert rounds_of(specdemo.replay(loaded, "egag", gamma_max=6)) == rounds_of(
        specdemo.replay(recording, "egag", gamma_max=6))
    with pytest.raises(ValueError, match="without its pair"):
        specdemo.replay(Recording.load(tmp_path / "run.pt"), "sd")


@pytest.mark.parametrize("method,settings,reason", [
    ("sd", dict(temperature=0.8), "samples"),
    ("sd-tree", {}, "tree"),
    ("beam", {}, "not made of the decode loop's rounds"),
    ("nasd", dict(top_k_filler=9), "9 best ids"),
    ("sd", dict(max_new_tokens=LENGTH + 1), "runs past the recording"),
    ("sd", dict(chat=True), "chat"),
])
def test_a_replay_that_would_not_be_exact_is_refused_with_its_reason(recordings, method, settings, reason):
    with pytest.raises(ValueError, match=reason):
        specdemo.replay(recordings["head", tuple(PROMPTS[0])], method, **settings)


def test_osd_is_refused_since_it_would_teach_the_shared_head(recordings):
    with pytest.raises(ValueError, match="teaches its drafter"):
        specdemo.replay(recordings["head", tuple(PROMPTS[0])], "osd")


def test_a_recording_replays_only_on_its_own_pair(tiny_pair, recordings):
    with pytest.raises(ValueError, match="recording was made on"):
        specdemo.replay(recordings["head", tuple(PROMPTS[0])], "sd", pair=tiny_pair)


def test_sampling_is_not_recorded(tiny_pair):
    with pytest.raises(ValueError, match="temperature"):
        specdemo.record(tiny_pair, PROMPTS[1], max_new_tokens=4, temperature=0.7)


GRID = [("sd", dict(gamma=g)) for g in range(1, 7)] + [
    ("egag", dict(gamma_max=m, ema=e)) for m in (4, 6, 8) for e in (0.5, 0.9)] + [("sd", dict(gamma=3, copy_n=2))]


@pytest.mark.parametrize("kind", ["lm", "head"])
def test_a_grid_replayed_on_shared_chains_equals_each_settings_own_replay(recordings, kind):
    for prompt in PROMPTS:
        recording = recordings[kind, tuple(prompt)]
        grid = replay_grid(recording, GRID)
        assert len(grid) == len(GRID)
        for (method, settings), shared in zip(GRID, grid):
            own = specdemo.replay(recording, method, **settings)
            assert rounds_of(shared) == rounds_of(own), (method, settings, prompt)
            assert shared.token_ids == own.token_ids


# Every chain method whose drafter is the pair's draft (a model or a head), with the settings that exercise
# its rule: these read the book's shared chains.
SHARED = [(m, s) for m, s in SETTINGS if m not in ("nasd", "rest")] + [
    ("egag", dict(gamma_max=6, ema=0.0, copy_n=3)), ("sd-confidence", dict(gamma_max=4)),
    ("adaedl", dict(gamma_max=8, adaedl_lambda=0.8)),
    ("egag-token", dict(gamma_max=8, entropy_stop=0.3, token_ema=0.5)), ("sd", dict(gamma=8))]


def counts_of(result) -> tuple:
    return (result.target_forwards, result.draft_forwards, result.fed, result.stop_reason, result.drafter)


@pytest.fixture(scope="module")
def books(recordings):
    return {key: chain_book(recording, methods=("sd", "egag"), max_gamma=8) for key, recording in recordings.items()}


@pytest.mark.parametrize("method,settings", SHARED, ids=lambda v: str(v))
@pytest.mark.parametrize("kind", ["lm", "head"])
def test_a_books_replay_equals_the_settings_own_replay_and_its_real_run(
        tiny_pair, head_pair, recordings, books, kind, method, settings):
    pair = tiny_pair if kind == "lm" else head_pair
    for prompt in PROMPTS:
        book = books[kind, tuple(prompt)]
        assert book.shares(method, **settings)
        shared = book.replay(method, **settings)  # bookkeeping alone
        looped = book.replay(method, full=True, **settings)  # the decode loop over the chains
        own = specdemo.replay(recordings[kind, tuple(prompt)], method, **settings)
        real = specdemo.generate(pair, prompt, method, max_new_tokens=LENGTH, **settings)
        assert rounds_of(shared) == rounds_of(looped) == rounds_of(own) == rounds_of(real), (method, settings, prompt)
        assert counts_of(shared) == counts_of(looped) == counts_of(own) == counts_of(real)
        assert [r.early_stop for r in shared.rounds] == [r.early_stop for r in own.rounds]
        assert shared.stats["mean_accepted_tokens"] == real.stats["mean_accepted_tokens"]
        assert shared.text == real.text and shared.parameters == real.parameters


def test_specdecpps_stop_reads_the_shared_chains_too(head_pair, recordings, books):
    settings = dict(gamma_max=6, specdecpp_threshold=0.5)
    for prompt in PROMPTS:
        shared = books["head", tuple(prompt)].replay("specdecpp", **settings)
        assert rounds_of(shared) == rounds_of(specdemo.replay(recordings["head", tuple(prompt)], "specdecpp",
                                                              **settings))


def test_a_book_replays_what_it_cannot_share_setting_by_setting(recordings, books):
    book, recording = books["lm", tuple(PROMPTS[0])], recordings["lm", tuple(PROMPTS[0])]
    assert not book.shares("nasd", gamma=3)
    assert rounds_of(book.replay("nasd", gamma=3)) == rounds_of(specdemo.replay(recording, "nasd", gamma=3))
    longer = book.replay("sd", gamma=12)  # past the book's longest chain: drafted again
    assert rounds_of(longer) == rounds_of(specdemo.replay(recording, "sd", gamma=12))
    with pytest.raises(ValueError, match="samples"):
        book.replay("sd", temperature=0.8)


@pytest.mark.slow
def test_the_embedded_pairs_book_equals_its_real_runs(embedded_pair):
    prompt = "List three things a lighthouse keeper might write in a logbook, and why."
    recording = specdemo.record(embedded_pair, prompt, max_new_tokens=48)
    book = chain_book(recording, max_gamma=8)
    for method, settings in [("sd", dict(gamma=1)), ("sd", dict(gamma=4)), ("sd", dict(gamma=8)),
                             ("egag", dict(gamma_max=6, ema=0.5)), ("egag", dict(gamma_max=8, ema=0.9)),
                             ("sd", dict(gamma=3, copy_n=2)), ("adaedl", dict(gamma_max=6)),
                             ("sd-confidence", dict(gamma_max=6)), ("sd-heuristic", dict(gamma=3))]:
        assert book.shares(method, **settings)
        real = specdemo.generate(embedded_pair, prompt, method, max_new_tokens=48, **settings)
        assert rounds_of(book.replay(method, **settings)) == rounds_of(real), (method, settings)


@pytest.mark.slow
def test_the_embedded_pair_replays_its_real_rounds(embedded_pair):
    prompt = "Write a short story about a robot learning to paint."
    recording = specdemo.record(embedded_pair, prompt, max_new_tokens=48)
    for method, settings in [("sd", dict(gamma=1)), ("sd", dict(gamma=3)), ("sd", dict(gamma=6)),
                             ("egag", dict(gamma_max=6, ema=0.5)), ("egag", dict(gamma_max=8, ema=0.9)),
                             ("sd", dict(gamma=3, copy_n=2)), ("nasd", dict(gamma=3)), ("adaedl", dict(gamma_max=6))]:
        assert_replays_the_run(embedded_pair, recording, prompt, method, settings, length=48)
