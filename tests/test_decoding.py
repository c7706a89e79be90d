"""specdemo.decoding: every method is lossless, traced, and stops where it should."""

import contextlib
import dataclasses
import math

import pytest
import torch

import specdemo
from specdemo.engine.trace import ORIGINS
from tests.tiny import ARRuns

PROMPTS = [
    "w5 w6 w7 w8",
    "w9",  # shorter than NASD's n − 1
    "w10 w20 w30 w10 w20 w30 w10 w20",  # repetitive: the n-gram table matches
    [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50],  # token ids used as they are
]


def _ar(pair, prompt, **params):
    return specdemo.generate(pair, prompt, method="ar", **params)


@pytest.fixture(scope="module")
def ar_tokens(tiny_pair):
    """AR's first 48 tokens for a prompt on a cache, computed once for every method compared with them."""
    runs = ARRuns()
    return lambda prompt, cache: runs(tiny_pair, prompt, max_new_tokens=48, cache=cache).token_ids


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("prompt", PROMPTS, ids=["plain", "short", "repetitive", "ids"])
@pytest.mark.parametrize("method", ["sd", "nasd", "egag", "sd-heuristic", "sd-confidence"])
def test_greedy_output_is_exactly_ars(tiny_pair, ar_tokens, prompt, method, cache):
    reference = ar_tokens(prompt, cache)
    rejected = 0
    for gamma in (1, 3, 6):
        for n, copy_n in ((2, 2), (4, 4), (3, 0)):
            result = specdemo.generate(tiny_pair, prompt, method=method, max_new_tokens=48, gamma=gamma,
                                       gamma_max=gamma + 1, ngram_n=n, copy_n=copy_n, cache=cache)
            assert result.token_ids == reference, (method, gamma, n, copy_n)
            rejected += sum(len(r.rejected) for r in result.rounds)
    if method != "nasd" and prompt != PROMPTS[1]:  # after "w9" the draft happens to agree all along
        assert rejected, "the comparison covers rounds that refused drafts"


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 17])
@pytest.mark.parametrize("method", ["ar", "sd", "nasd", "egag"])
def test_generation_stops_exactly_at_max_new_tokens(tiny_pair, method, max_new_tokens):
    result = specdemo.generate(tiny_pair, PROMPTS[2], method=method, max_new_tokens=max_new_tokens, gamma=6)
    assert len(result.token_ids) == max_new_tokens
    assert result.stop_reason == "max_new_tokens"
    assert result.token_ids == _ar(tiny_pair, PROMPTS[2], max_new_tokens=max_new_tokens).token_ids


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("method", ["ar", "sd", "nasd", "egag"])
def test_generation_stops_at_eos_and_matches_ar(tiny_pair, method, cache):
    """With γ = 4 SD drafts past the EOS: the target verifies those drafts too, and the output
    still ends at the EOS."""
    free_run = _ar(tiny_pair, PROMPTS[0], max_new_tokens=30).token_ids
    eos = free_run[6]
    pair = dataclasses.replace(tiny_pair, eos_ids=frozenset({eos}))
    reference = _ar(pair, PROMPTS[0], max_new_tokens=30, cache=cache)
    assert reference.token_ids == free_run[: free_run.index(eos) + 1]
    for gamma in (1, 4):
        result = specdemo.generate(pair, PROMPTS[0], method=method, max_new_tokens=30, gamma=gamma, cache=cache)
        assert result.token_ids == reference.token_ids
        assert result.stop_reason == "eos"


@pytest.mark.parametrize("method", ["ar", "sd", "nasd", "egag"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_trace_bookkeeping_adds_up(tiny_pair, method, temperature):
    result = specdemo.generate(tiny_pair, PROMPTS[2], method=method, max_new_tokens=40, temperature=temperature,
                               seed=5)
    rounds = result.rounds
    produced = len(result.tokens)
    assert sum(len(r.new_tokens) for r in rounds) == produced
    assert produced == 40 or (result.stop_reason == "eos" and result.token_ids[-1] in tiny_pair.eos_ids)
    for r in rounds:
        assert r.accepted + len(r.rejected) == len(r.drafted)
        assert len(r.draft_entropies) in (0, len(r.drafted))
        assert r.new_tokens == r.drafted[: r.accepted] + [r.next_token]
        if method == "ar":
            assert r.gamma == 0 and r.drafted == []
    assert {t.origin for t in result.tokens} <= set(ORIGINS)
    assert [t.id for t in result.tokens] == [t for r in rounds for t in r.new_tokens]
    stats = result.stats
    assert stats["new_tokens"] == produced
    assert stats["target_forwards"] == len(rounds)
    drafted = sum(len(r.drafted) for r in rounds)
    if drafted:
        assert stats["acceptance_rate"] == pytest.approx(sum(r.accepted for r in rounds) / drafted)
    assert stats["mean_accepted_tokens"] == pytest.approx(produced / len(rounds))
    if method == "ar":
        assert stats["mean_accepted_tokens"] == 1.0 and math.isnan(stats["acceptance_rate"])
        assert stats["draft_forwards"] == 0
    assert 0 < stats["ttft_s"] <= stats["seconds"]
    special = set(tiny_pair.tokenizer.all_special_ids)
    assert "".join(t.text for t in result.tokens if t.id not in special).split() == result.text.split()


def test_origins_follow_each_round(tiny_pair):
    result = specdemo.generate(tiny_pair, PROMPTS[2], method="nasd", max_new_tokens=40)
    by_round = {}
    for token in result.tokens:
        by_round.setdefault(token.round, []).append(token.origin)
    for r in result.rounds:
        origins = by_round[r.index]
        assert origins[:-1] == ["accepted"] * r.accepted
        expected_last = "target" if not r.drafted else ("bonus" if r.accepted == len(r.drafted) else "corrected")
        assert origins[-1] == expected_last


def test_egag_records_entropy_per_round_and_per_drafted_token(tiny_pair):
    result = specdemo.generate(tiny_pair, PROMPTS[0], method="egag", max_new_tokens=30, gamma_min=1, gamma_max=5)
    for r in result.rounds:
        assert r.entropy is not None and 0.0 <= r.entropy <= 1.0
        assert 1 <= r.gamma <= 5
        assert len(r.draft_entropies) == len(r.drafted)
    assert 0.0 <= result.stats["mean_entropy"] <= 1.0


@contextlib.contextmanager
def fed_lengths(model):
    """Record how many tokens each forward of `model` is fed."""
    lengths: list[int] = []

    def hook(module, args, kwargs):
        lengths.append(kwargs["input_ids"].shape[-1])

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield lengths
    finally:
        handle.remove()


def test_caches_are_reused_not_refilled(tiny_pair):
    with fed_lengths(tiny_pair.target) as target_fed, fed_lengths(tiny_pair.draft) as draft_fed:
        result = specdemo.generate(tiny_pair, PROMPTS[0], method="sd", max_new_tokens=40, gamma=4, copy_n=0)
    prompt = len(result.prompt_ids)
    # The target: the prompt once, then per round exactly its drafts plus the one token it has not seen.
    assert target_fed == [prompt - 1] + [len(r.drafted) + 1 for r in result.rounds]
    # The draft: the prompt once, then only tokens it has not seen (at most a round's worth), never the context.
    assert draft_fed[0] == prompt - 1
    assert all(n <= 4 + 1 for n in draft_fed[1:])
    assert sum(draft_fed) <= prompt + sum(len(r.drafted) + 1 for r in result.rounds)
    # The counts in the trace are the models' own forward counters, not the loop's rounds.
    assert result.stats["target_forwards"] == len(target_fed) - 1 == len(result.rounds)
    assert result.stats["draft_forwards"] == len(draft_fed)


def test_after_copied_rounds_the_draft_catches_up_on_what_it_has_not_seen(tiny_pair):
    with fed_lengths(tiny_pair.draft) as draft_fed:
        result = specdemo.generate(tiny_pair, PROMPTS[2], method="sd", max_new_tokens=40, gamma=4, copy_n=2)
    copied = [r for r in result.rounds if r.source == "copy"]
    assert copied and len(copied) < len(result.rounds)
    prompt = len(result.prompt_ids)
    drafted_by_model = sum(len(r.drafted) for r in result.rounds if r.source == "draft")
    # Each output token once, and the model's own drafts: never the context again.
    assert draft_fed[0] == prompt - 1
    assert sum(draft_fed) <= prompt + len(result.tokens) + drafted_by_model


@pytest.mark.parametrize("method", ["ar", "sd", "nasd", "egag"])
def test_the_same_seed_gives_the_same_output_and_trace_and_another_seed_another_output(tiny_pair, method):
    runs = [specdemo.generate(tiny_pair, PROMPTS[0], method=method, max_new_tokens=24, temperature=1.0, seed=11)
            for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids
    strip = lambda r: [(x.gamma, x.drafted, x.accepted, x.next_token) for x in r.rounds]
    assert strip(runs[0]) == strip(runs[1])
    # The seed drives the sampling: a run that sampled from a seed of its own would repeat itself here.
    other = specdemo.generate(tiny_pair, PROMPTS[0], method=method, max_new_tokens=24, temperature=1.0, seed=12)
    assert other.token_ids != runs[0].token_ids


def test_streaming_yields_one_growing_result_per_round(tiny_pair):
    seen = []
    for partial in specdemo.iter_generate(tiny_pair, PROMPTS[0], method="sd", max_new_tokens=20):
        seen.append((len(partial.rounds), len(partial.tokens), partial.done))
    assert [s[0] for s in seen] == list(range(1, len(seen) + 1))
    assert seen[-1][2] and not any(done for _, _, done in seen[:-1])
    assert seen[-1][1] == 20


@pytest.mark.parametrize("method", ["ar", "sd", "nasd", "egag"])
def test_closing_the_stream_stops_decoding_and_frees_the_caches(tiny_pair, method, monkeypatch):
    from specdemo.engine.targets import lm, seq2seq

    made: list[lm.CachedLM] = []

    class Recorded(lm.CachedLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    # The loop and the model drafter both make their cached LMs through `seq2seq.cached_lm`.
    monkeypatch.setattr(seq2seq, "CachedLM", Recorded)
    stream = specdemo.iter_generate(tiny_pair, PROMPTS[0], method=method, max_new_tokens=50)
    first = next(stream)
    live = sum(m.cache is not None for m in made)
    assert live == (2 if method in ("sd", "egag") else 1), "the target's cache, and the draft model's if any"
    stream.close()
    assert len(first.rounds) == 1 and not first.done
    assert all(m.cache is None for m in made), "close() must drop every KV cache of the run"
    assert next(stream, None) is None and len(first.rounds) == 1


@pytest.mark.parametrize(
    "params, field",
    [
        ({"method": "medusa"}, "method"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"gamma": 0}, "gamma"),
        ({"gamma_min": 0}, "gamma_min"),
        ({"gamma_min": 5, "gamma_max": 3}, "gamma_min"),
        ({"temperature": -0.5}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"ngram_n": 1}, "ngram_n"),
        ({"ngram_storage": "trie"}, "ngram_storage"),
        ({"ema": 1.0}, "ema"),
        ({"gamma": "four"}, "gamma"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"max_new_tokens": 500, "prompt": "w5 " * 100}, "prompt is too long"),
    ],
)
def test_bad_arguments_raise_value_errors_that_name_the_field(tiny_pair, params, field):
    params = dict(params)
    prompt = params.pop("prompt", "w5 w6")
    method = params.pop("method", "sd")
    with pytest.raises(ValueError, match=field):
        specdemo.generate(tiny_pair, prompt, method=method, **params)


def test_methods_that_need_a_draft_refuse_a_pair_without_one(tiny_pair):
    target_only = dataclasses.replace(tiny_pair, draft=None)
    with pytest.raises(ValueError, match="needs a draft"):
        specdemo.generate(target_only, "w5", method="egag")
    assert specdemo.generate(target_only, "w5", method="nasd", max_new_tokens=4).token_ids


def test_chat_prompts_go_through_the_chat_template(tiny_pair):
    plain = tiny_pair.encode("w5 w6")
    chat = tiny_pair.encode("w5 w6", chat=True)
    assert chat != plain and len(chat) > len(plain) - 1


def test_rounds_resumed_on_another_thread_still_run_without_autograd(tiny_pair):
    """A page streams rounds from worker threads: every forward runs in inference mode whichever
    thread resumes the generation (inference mode is thread-local)."""
    import threading

    modes = []
    hook = tiny_pair.target.register_forward_hook(lambda *_: modes.append(torch.is_inference_mode_enabled()))
    try:
        rounds = specdemo.iter_generate(tiny_pair, "w5 w6 w7", method="sd", max_new_tokens=12, copy_n=0)
        next(rounds)
        worker = threading.Thread(target=lambda: [None for _ in rounds])
        worker.start()
        worker.join()
    finally:
        hook.remove()
    assert len(modes) > 2 and all(modes)
