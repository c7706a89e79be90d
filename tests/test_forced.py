"""The GPU suite's planted oracle (`gpu_suite.forced`): both models of a random-weight pair
follow one planted text, the draft at a set rate, so every greedy method writes that text and
the per-position acceptance α is the rate — in bfloat16 with a real-sized vocabulary too, where
near-uniform logits let kernels of different shapes break their near-ties differently."""

from __future__ import annotations

import functools

import pytest

from specdemo import generate
from specdemo.bench.measure import benchmark
from specdemo.bench import synthetic
from specdemo.bench.gpu_suite.checks import forced_hooks_trace
from specdemo.bench.gpu_suite.forced import ForcedAcceptance
from specdemo.bench.measure.runners import HFRunner
from specdemo.engine.params import DecodeParams
from specdemo.models.loading import load_pair

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = [5, 9, 14, 3, 22, 7]
SUITE = [{"prompt": "w5 w6 w7 w8 w9 w10 w5 w6", "category": "chat"}]
RATE = 0.8
GAMMA = 4
# At γ = 4 and α = 0.8 a run tries about 0.88 drafted positions per new token (a round that
# accepts all γ tries no further). α within ±0.05 of the rate needs 0.05 ≥ 3 binomial σ,
# σ = √(α(1 − α) / trials): at least 576 trials, so 700 new tokens.
ALPHA_TOLERANCE = 0.05
MIN_TRIALS = round(RATE * (1 - RATE) / (ALPHA_TOLERANCE / 3) ** 2)
LONG_RUN = 700


def _acceptance(result) -> float:
    drafted = sum(len(r.drafted) for r in result.rounds)
    return sum(r.accepted for r in result.rounds) / drafted


def _special_ids(pair) -> set[int]:
    return set(pair.eos_ids) | set(pair.tokenizer.all_special_ids)


@pytest.fixture
def forced(tiny_pair):
    """The tiny pair hooked at a given rate; the hooks come off after the test."""
    hooks = []

    def make(rate: float, seed: int = 0) -> ForcedAcceptance:
        hook = ForcedAcceptance.on_pair(tiny_pair, rate, seed)
        hooks.append(hook)
        return hook

    yield make
    for hook in hooks:
        hook.remove()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_forced_pair_writes_the_planted_text_and_the_draft_agrees_where_told(tiny_pair, forced, cache):
    always = forced(1.0)
    ar = generate(tiny_pair, PROMPT, "ar", max_new_tokens=32, temperature=0.0, cache=cache)
    sd = generate(tiny_pair, PROMPT, "sd", max_new_tokens=32, temperature=0.0, gamma=4, copy_n=0, cache=cache)
    assert ar.token_ids == sd.token_ids == always.text_after(len(PROMPT), 32) and _acceptance(sd) == 1.0
    always.remove()
    never = forced(0.0)
    sd = generate(tiny_pair, PROMPT, "sd", max_new_tokens=32, temperature=0.0, gamma=4, copy_n=0, cache=cache)
    assert sd.token_ids == never.text_after(len(PROMPT), 32) and _acceptance(sd) == 0.0


def test_a_forced_draft_accepts_where_its_mask_agrees_in_ours_and_in_transformers_assisted(tiny_pair, forced):
    hook = forced(0.6, seed=3)
    ours = generate(tiny_pair, PROMPT, "sd", max_new_tokens=32, temperature=0.0, gamma=4, copy_n=0)
    assert ours.token_ids == hook.text_after(len(PROMPT), 32) and 0.0 < _acceptance(ours) < 1.0
    # Each round's drafts are accepted up to the first position the mask refuses.
    agrees = hook.agrees_after(len(PROMPT), 40)
    start = 0
    for round_ in ours.rounds:
        if round_.drafted:
            assert round_.accepted == (agrees[start: start + len(round_.drafted)] + [False]).index(False)
        start += len(round_.new_tokens)
    runner = HFRunner(tiny_pair, DecodeParams.from_values(max_new_tokens=32, temperature=0.0, gamma=4))
    theirs = runner.run("hf-assisted", PROMPT, 0)
    assert theirs.token_ids == ours.token_ids
    # The same rounds: transformers' assisted generation meets the same hooks.
    assert [r for r in theirs.rounds if r[0]] == [(len(r.drafted), r.accepted) for r in ours.rounds if r.drafted]


def test_the_planted_text_follows_positions_not_the_prompt_and_holds_no_special_token(tiny_pair, forced):
    hook = forced(0.5, seed=1)
    special = _special_ids(tiny_pair)
    assert special and not special & (set(hook.text.tolist()) | set(hook.wrong.tolist()))
    other = [30, 31, 32, 33, 34, 35]
    for prompt in (PROMPT, other, PROMPT[:3]):
        ar = generate(tiny_pair, prompt, "ar", max_new_tokens=12, temperature=0.0)
        assert ar.token_ids == hook.text_after(len(prompt), 12)
    assert hook.text_after(len(PROMPT), 12) != hook.text_after(3, 12)


def test_the_forced_hooks_trace_through_dynamo():
    assert forced_hooks_trace()


def test_a_forced_rate_outside_zero_to_one_is_refused(tiny_pair):
    with pytest.raises(ValueError, match="rate"):
        ForcedAcceptance(tiny_pair.target, tiny_pair.draft, 1.5)


# ------------------------------------------------- bfloat16, a 32k vocabulary, the benchmark's columns

@pytest.fixture(scope="module")
def bf16_pair(tmp_path_factory):
    """Pythia-layout random weights in bfloat16 with a 32k vocabulary: logits as near-uniform as the
    real shapes', saved and loaded back through load_pair. At hidden size 256 the CPU's kernels
    of different shapes already break their near-ties differently (at 64 they agreed over hundreds
    of tokens)."""
    target, draft = synthetic.build(tmp_path_factory.mktemp("bf16"), "tiny-256", "tiny-256", vocab=32768,
                                    dtype="bfloat16")
    pair = load_pair(str(target), str(draft), device="cpu", dtype="bfloat16")
    yield pair
    pair.close()


@pytest.fixture
def planted_bench(bf16_pair, monkeypatch):
    """run_benchmark on the bf16 pair with the oracle at RATE. transformers' static generate runs
    its static cache eagerly: compiling it takes minutes on a CPU, and the hooks' tracing is
    `forced_hooks_trace`'s to check."""
    monkeypatch.setattr(benchmark, "HFRunner", functools.partial(HFRunner, compile_static=False))
    hooks = []

    def run(methods: list[str], new_tokens: int):
        hook = ForcedAcceptance.on_pair(bf16_pair, RATE, seed=0)
        hooks.append(hook)
        result = benchmark.run_benchmark(bf16_pair, SUITE, methods, repeats=1, warmup=False, max_new_tokens=new_tokens,
                                         temperature=0.0, gamma=GAMMA, copy_n=0)
        rows = result.rows.set_index("method")
        assert (rows.error.fillna("") == "").all(), rows.error.to_dict()
        planted = hook.text_after(int(rows.prompt_tokens.iloc[0]), new_tokens)
        assert not _special_ids(bf16_pair) & set(planted)
        for method, row in rows.iterrows():
            assert [int(t) for t in row.output_ids.split()] == planted, f"{method} left the planted text"
        return rows

    yield run
    for hook in hooks:
        hook.remove()


def test_in_bfloat16_every_greedy_method_writes_the_planted_text_and_matches_ar(planted_bench):
    rows = planted_bench(["ar", "sd", "egag", "hf-generate-static"], 128)
    assert rows.matches_ar.astype(bool).all()


def test_in_bfloat16_sd_and_assisted_generation_write_the_planted_text_and_accept_at_its_rate(planted_bench):
    # AR's text is the planted one (the test above), so these two match AR as well.
    rows = planted_bench(["sd", "hf-assisted"], LONG_RUN)
    for method in ("sd", "hf-assisted"):
        row = rows.loc[method]
        assert row.accepted + row.rejected_rounds >= MIN_TRIALS, method
        assert abs(row.alpha - RATE) <= ALPHA_TOLERANCE, f"{method}: α = {row.alpha:.3f}"
