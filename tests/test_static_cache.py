"""The static KV cache: same logits and same tokens as the dynamic one, rollback copies nothing."""

import dataclasses

import pytest
import torch

import specdemo
from specdemo.engine.targets.lm import CachedLM, default_cache_kind
from tests.tiny import build_tiny_pair

METHODS = ["ar", "sd", "nasd", "egag", "sd-heuristic", "sd-confidence"]
PROMPTS = ["w5 w6 w7 w8", "w10 w20 w30 w10 w20 w30 w10 w20", [1, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50]]


@pytest.fixture(scope="module")
def pair32(tmp_path_factory):
    """float32, as the issue asks: the static path must match the dynamic one there too."""
    return build_tiny_pair(tmp_path_factory.mktemp("tiny32"), dtype="float32", draft_noise=0.3)


def _lms(pair, max_length=64):
    return (CachedLM(pair.target, pair.vocab_size),
            CachedLM(pair.target, pair.vocab_size, cache="static", max_length=max_length))


def test_static_logits_match_dynamic_through_feeds_and_rollbacks(pair32):
    dynamic, static = _lms(pair32)
    torch.manual_seed(0)
    sequence = [1, 5, 6, 7, 8]
    steps = [(3, 4, 0), (1, 2, 2), (5, 6, 1), (0, 1, 4), (2, 3, 3), (6, 7, 0)]  # (new tokens, logits, cut back)
    with torch.inference_mode():
        for new, n_logits, cut in steps:
            sequence = sequence[: len(sequence) - cut] + torch.randint(3, 64, (new,)).tolist()
            if new == 0:
                sequence = sequence + [9]
            a = dynamic.logits(sequence, n_logits)
            b = static.logits(sequence, n_logits)
            assert len(dynamic) == len(static) == len(sequence)
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
            full = pair32.target(input_ids=torch.tensor([sequence])).logits[0, -n_logits:]
            torch.testing.assert_close(b, full, rtol=1e-5, atol=1e-5)


def test_positions_past_the_length_are_masked(pair32):
    """Garbage left beyond the cache length (a rejected draft) must not change the logits."""
    _, static = _lms(pair32)
    clean = CachedLM(pair32.target, pair32.vocab_size, cache="static", max_length=64)
    with torch.inference_mode():
        static.logits([1, 5, 6, 7, 30, 31, 32, 33, 34], 1)
        static.rollback(4)
        for layer in static.cache.layers:  # and scribble on the stale part for good measure
            layer.keys[:, :, 4:].normal_()
            layer.values[:, :, 4:].normal_()
        got = static.logits([1, 5, 6, 7, 8, 9], 2)
        want = clean.logits([1, 5, 6, 7, 8, 9], 2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rollback_moves_a_position_and_copies_nothing(pair32):
    _, static = _lms(pair32)
    with torch.inference_mode():
        static.logits([1, 5, 6, 7, 8, 9, 10, 11], 1)
        pointers = [(layer.keys.data_ptr(), layer.values.data_ptr(), layer.cumulative_length.data_ptr())
                    for layer in static.cache.layers]
        static.rollback(3)
        assert len(static) == 3
        assert all(int(layer.cumulative_length) == 3 for layer in static.cache.layers)
        static.logits([1, 5, 6, 20, 21], 2)
        static.rollback(4)
        static.logits([1, 5, 6, 20, 22, 23], 1)
    assert pointers == [(layer.keys.data_ptr(), layer.values.data_ptr(), layer.cumulative_length.data_ptr())
                        for layer in static.cache.layers]
    assert static.cache.layers[0].keys.shape[2] == 64


def test_static_cache_refuses_to_overflow_and_bad_kinds(pair32):
    static = CachedLM(pair32.target, pair32.vocab_size, cache="static", max_length=4)
    with torch.inference_mode(), pytest.raises(ValueError, match="max_length"):
        static.logits([1, 5, 6, 7, 8], 1)
    with pytest.raises(ValueError, match="cache"):
        CachedLM(pair32.target, cache="paged")
    with pytest.raises(ValueError, match="max_length"):
        CachedLM(pair32.target, cache="static")
    with pytest.raises(ValueError, match="cache"):
        specdemo.generate(pair32, "w5", method="ar", cache="paged", max_new_tokens=2)


def test_default_cache_kind_is_static_on_cuda_only():
    assert default_cache_kind("cuda") == "static" and default_cache_kind("cpu") == "dynamic"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_static_and_dynamic_give_identical_greedy_tokens(pair32, tiny_pair, method, dtype):
    pair = pair32 if dtype == "float32" else tiny_pair
    refusing_rounds = 0
    for prompt in PROMPTS:
        for gamma in (1, 3, 6):
            kwargs = dict(method=method, max_new_tokens=40, gamma=gamma, gamma_max=gamma + 1, ngram_n=3)
            dynamic = specdemo.generate(pair, prompt, cache="dynamic", **kwargs)
            static = specdemo.generate(pair, prompt, cache="static", **kwargs)
            assert static.cache == "static" and dynamic.cache == "dynamic"
            assert static.token_ids == dynamic.token_ids, (prompt, gamma)
            strip = lambda r: [(x.gamma, x.drafted, x.accepted, x.next_token) for x in r.rounds]
            assert strip(static) == strip(dynamic)
            refusing_rounds += sum(r.accepted < len(r.drafted) for r in dynamic.rounds)
    # Every drafting method's comparison covered rollbacks; AR drafts nothing to roll back.
    assert (refusing_rounds > 0) == (method != "ar")


@pytest.mark.parametrize("method", METHODS)
def test_static_path_stops_at_eos_like_dynamic(pair32, method):
    free_run = specdemo.generate(pair32, PROMPTS[0], method="ar", cache="dynamic", max_new_tokens=30).token_ids
    eos = free_run[6]
    pair = dataclasses.replace(pair32, eos_ids=frozenset({eos}))
    for gamma in (1, 4):
        runs = [specdemo.generate(pair, PROMPTS[0], method=method, cache=cache, max_new_tokens=30, gamma=gamma)
                for cache in ("dynamic", "static")]
        assert runs[0].token_ids == runs[1].token_ids == free_run[: free_run.index(eos) + 1]
        assert runs[1].stop_reason == "eos"


SAMPLINGS = [dict(temperature=1.0), dict(temperature=1.0, top_k=5, top_p=0.9)]


def _same_trace(a, b) -> bool:
    """Same rounds: γ, drafts, verdicts exactly; entropies up to float32 rounding (the two caches
    sum attention in different orders)."""
    exact = lambda r: [(x.gamma, x.drafted, x.accepted, x.next_token) for x in r.rounds]
    entropies = lambda r: [e for x in r.rounds for e in [x.entropy or 0.0, *x.draft_entropies]]
    return a.token_ids == b.token_ids and exact(a) == exact(b) and entropies(a) == pytest.approx(entropies(b), abs=1e-5)


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t1-topk-topp"])
@pytest.mark.parametrize("method", ["sd", "nasd", "egag", "sd-heuristic", "sd-confidence"])
def test_static_path_samples_the_same_trace_for_the_same_seed(pair32, method, sampling):
    """Same draws in the same order on both paths: γ, drafts, entropies, verdicts and tokens all agree."""
    for prompt in PROMPTS:
        runs = [specdemo.generate(pair32, prompt, method=method, cache=cache, max_new_tokens=24, gamma=3,
                                  gamma_max=4, seed=11, **sampling) for cache in ("dynamic", "static", "static")]
        assert _same_trace(runs[0], runs[1]) and _same_trace(runs[1], runs[2]), prompt


@pytest.fixture(scope="module")
def head32(pair32):
    from tests.test_feature_drafter import with_head

    return with_head(pair32, list(range(0, 64, 2)) + [3, 5, 7, 9])


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1", "t1-topk-topp"])
@pytest.mark.parametrize("method", ["sd", "egag"])
def test_static_path_samples_the_same_trace_with_a_feature_head(head32, method, sampling):
    for prompt in PROMPTS:
        runs = [specdemo.generate(head32, prompt, method=method, cache=cache, max_new_tokens=24, gamma=3,
                                  gamma_max=4, seed=5, **sampling) for cache in ("dynamic", "static")]
        assert _same_trace(runs[0], runs[1]), prompt


def test_compile_needs_the_static_cache(pair32):
    with pytest.raises(ValueError, match="compile"):
        specdemo.generate(pair32, "w5", method="ar", cache="dynamic", compile=True, max_new_tokens=2)
    with pytest.raises(ValueError, match="compile"):
        CachedLM(pair32.target, cache="dynamic", compile=True)


@pytest.mark.slow
def test_compiled_steps_give_the_same_tokens_and_compile_once(tmp_path_factory):
    """torch.compile on CPU (default mode): same tokens; a second generation compiles nothing. One layer each:
    what runs compiled does not depend on depth, and compiling a graph takes longer the more layers it holds."""
    from torch._dynamo.utils import counters

    pair32 = build_tiny_pair(tmp_path_factory.mktemp("tiny32-one-layer"), dtype="float32", draft_noise=0.3, layers=1)
    for method, sampling in [("ar", {}), ("sd", {}), ("sd", {"temperature": 1.0, "seed": 4})]:
        kwargs = dict(method=method, max_new_tokens=24, gamma=3, gamma_max=3, **sampling)
        eager = specdemo.generate(pair32, PROMPTS[0], cache="dynamic", **kwargs)
        compiled = specdemo.generate(pair32, PROMPTS[0], cache="static", compile=True, **kwargs)
        assert compiled.token_ids == eager.token_ids, method
        assert compiled.compile_seconds > 0.0 and eager.compile_seconds == 0.0
    frames = dict(counters["frames"])
    again = specdemo.generate(pair32, PROMPTS[1], cache="static", compile=True, method="sd", max_new_tokens=30,
                              gamma=3, gamma_max=3)
    assert dict(counters["frames"]) == frames  # nothing recompiled
    assert again.token_ids == specdemo.generate(pair32, PROMPTS[1], method="ar", max_new_tokens=30).token_ids


class _ReadCounter:
    """Counts reads of tensor values on the host (each is a device sync on a GPU), round by round."""

    NAMES = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.NAMES:
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))

    def _counting(self, read):
        def counted(tensor, *args, **kwargs):
            self.count += 1
            return read(tensor, *args, **kwargs)

        return counted

    def per_round(self, stream) -> list[int]:
        """Reads between one yielded round and the next (the first round's include the prefill's)."""
        counts, before = [], self.count
        for self.result in stream:
            counts.append(self.count - before)
            before = self.count
        return counts


def _reads_per_round(pair, method, monkeypatch, temperature, prompt=PROMPTS[1]):
    """Reads per round, and what each round expects beyond the one: a copied round reads no
    entropy (its point mass has none to weigh)."""
    counter = _ReadCounter(monkeypatch)
    stream = specdemo.iter_generate(pair, prompt, method=method, cache="static", max_new_tokens=30,
                                    gamma=3, gamma_max=4, temperature=temperature, seed=2)
    counts = counter.per_round(stream)
    return counts, [r.source == "copy" for r in counter.result.rounds]


@pytest.mark.parametrize("method, reads", [("ar", 1), ("sd", 1), ("sd-heuristic", 1), ("nasd", 1), ("egag", 2)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_host_reads_per_round_on_the_static_path(pair32, monkeypatch, method, reads, temperature):
    """One read a round brings back drafts, entropies, the verdict (and NASD's view of the target's
    top-k for its table) together. EGAG reads the entropy that sets γ before it drafts. The prefill
    reads nothing."""
    counts, copied = _reads_per_round(pair32, method, monkeypatch, temperature)
    assert counts == [1 if was_copied else reads for was_copied in copied]


@pytest.mark.parametrize("method, reads", [("sd", 1), ("egag", 2)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_host_reads_per_round_with_a_feature_head(head32, monkeypatch, method, reads, temperature):
    counts, copied = _reads_per_round(head32, method, monkeypatch, temperature, prompt=PROMPTS[2])
    assert counts == [1 if was_copied else reads for was_copied in copied]


@pytest.mark.parametrize("pair_name", ["pair32", "head32"])
def test_confidence_stopping_reads_once_each_time_it_weighs_another_draft(request, monkeypatch, pair_name):
    """Whether to draft one more token is decided on the host: one read each time (the position's
    entropy and top probability together), on top of the round's read."""
    from specdemo.engine.drafters.policies import ConfidenceStop

    weighed = []
    keep_drafting = ConfidenceStop.keep_drafting

    def counting(self, entropy, top_prob, **where):
        weighed[-1] += 1
        return keep_drafting(self, entropy, top_prob, **where)

    monkeypatch.setattr(ConfidenceStop, "keep_drafting", counting)
    counter = _ReadCounter(monkeypatch)
    stream = specdemo.iter_generate(request.getfixturevalue(pair_name), PROMPTS[2], method="sd-confidence",
                                    cache="static", max_new_tokens=30, gamma_max=6, seed=2)
    counts, before = [], 0
    weighed.append(0)
    for _ in stream:
        counts.append(counter.count - before)
        before = counter.count
        weighed.append(0)
    assert counts == [1 + w for w in weighed[:-1]]
    assert any(weighed), "some round weighed a second draft"


def test_a_pooled_cache_filled_under_inference_mode_is_reset_for_the_next_generation(pair32):
    """Generations run under inference mode, so the cache they hand back to the pool holds
    inference tensors; the next generation must still be able to reset it."""
    first = CachedLM(pair32.target, pair32.vocab_size, cache="static", max_length=40, compile=True)
    with torch.inference_mode():
        first.prefill(list(range(3, 12)))
        for layer in first.cache.layers:
            # On a GPU the layer's first forward moves its length to the device, which under
            # inference mode makes an inference tensor; on the CPU the move is a no-op.
            layer.cumulative_length = layer.cumulative_length.clone()
    pooled = first.cache
    first.close()
    second = CachedLM(pair32.target, pair32.vocab_size, cache="static", max_length=40, compile=True)
    assert second.cache is pooled
    assert all(int(layer.cumulative_length) == 0 for layer in second.cache.layers)
