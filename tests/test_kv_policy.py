"""KV-cache policies: what each keeps, where new tokens sit after an eviction, losslessness on the
draft's cache, the target's marked not lossless, refusals, and the memory columns."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM

import specdemo
from specdemo.bench.measure.tables import summary_frame
from specdemo.engine.targets.kv_policy import RECENT, AttentionMass, KVPolicy, check_policy
from specdemo.engine.targets.lm import CachedLM
from specdemo.engine.params import DecodeParams
from tests.tiny import build_tiny_pair, build_tiny_seq2seq_pair, write_model, write_tiny_head

BUDGET, SINKS = 24, 4
LONG_PROMPT = " ".join(f"w{3 + (i * 7) % 50}" for i in range(100))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_tiny_pair(tmp_path_factory.mktemp("kv"), dtype="float32", draft_noise=0.3)


def run(pair, method, **params):
    return specdemo.generate(pair, LONG_PROMPT, method=method, max_new_tokens=40, kv_budget=BUDGET, copy_n=0,
                             **params)


# Each method's run on full caches, the reference the compressed runs are held to, decoded once per module rather
# than once per test (the tests only read it).
_FULL_RUNS: dict[tuple[str, str], specdemo.GenerationResult] = {}


def full_run(pair, method):
    key = (pair.target_ref, method)
    if key not in _FULL_RUNS:
        _FULL_RUNS[key] = run(pair, method)
    return _FULL_RUNS[key]


@pytest.mark.parametrize("kind, budget, sinks, message", [
    ("streaming", 4, 4, "kv_budget \\(4\\) must be at least kv_sinks \\(4\\) \\+ 1 recent position"),
    ("l2", 10, 4, f"kv_budget \\(10\\) must be at least kv_sinks \\(4\\) \\+ the {RECENT} newest"),
    ("head", 10, 4, f"kv_budget \\(10\\) must be at least kv_sinks \\(4\\) \\+ the {RECENT} newest"),
    ("sliding", 64, 4, "must be one of full, streaming, l2, head"),
])
def test_bad_settings_are_refused_with_what_to_change(kind, budget, sinks, message):
    with pytest.raises(ValueError, match=message):
        check_policy(kind, budget, sinks, "draft_kv")
    with pytest.raises(ValueError, match=message):
        DecodeParams.from_values(draft_kv=kind, kv_budget=budget, kv_sinks=sinks)
    DecodeParams.from_values(kv_budget=budget, kv_sinks=sinks)  # full ignores the sizes


def test_streaming_keeps_the_sinks_and_the_most_recent_positions():
    keys = torch.randn(1, 2, 30, 8)
    kept = KVPolicy.of("streaming", 10, 3).keep_index(keys)
    assert kept.shape == (1, 2, 10)
    assert kept[0, 0].tolist() == [0, 1, 2] + list(range(23, 30))
    assert KVPolicy.of("streaming", 30, 3).keep_index(keys) is None  # within the budget: nothing to drop


def test_l2_keeps_sinks_the_newest_and_the_smallest_keys_per_head():
    keys = torch.ones(1, 2, 40, 8)
    keys[0, 0, [10, 20]] = 0.1  # head 0's two quietest keys
    keys[0, 1, [15, 25]] = 0.1
    kept = KVPolicy.of("l2", 2 + RECENT + 2, 2).keep_index(keys)
    assert kept[0, 0].tolist() == [0, 1, 10, 20] + list(range(40 - RECENT, 40))
    assert kept[0, 1].tolist() == [0, 1, 15, 25] + list(range(40 - RECENT, 40))


def test_head_keeps_sinks_the_newest_and_each_heads_most_attended_positions():
    keys = torch.randn(1, 2, 40, 8)
    attention = torch.full((2, 40), 0.1)
    attention[0, [12, 30]] = 5.0  # head 0 reads far back at 12 and nearer at 30
    attention[1, [5, 6]] = 3.0
    attention[:, 0] = 9.0  # a sink's mass does not take a slot from the others
    kept = KVPolicy.of("head", 2 + RECENT + 2, 2).keep_index(keys, attention)
    assert kept[0, 0].tolist() == [0, 1, 12, 30] + list(range(40 - RECENT, 40))
    assert kept[0, 1].tolist() == [0, 1, 5, 6] + list(range(40 - RECENT, 40))
    with pytest.raises(RuntimeError, match="attention mass"):
        KVPolicy.of("head", 2 + RECENT + 2, 2).keep_index(keys)


def test_the_attention_mass_is_what_eager_attention_gives_each_position(tmp_path):
    """A head cache's scores after a prefill and two steps equal the attention weights eager
    attention returns, summed over queries and over the query heads of each KV head."""
    write_model(tmp_path, seed=5, hidden=32, layers=2)
    sdpa = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64, attn_implementation="sdpa").eval()
    eager = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64, attn_implementation="eager").eval()
    ids = [3 + (i * 5) % 40 for i in range(20)]
    lm = CachedLM(sdpa)
    lm.set_kv_policy(KVPolicy.of("head", 64, 2))
    with torch.inference_mode():
        lm.prefill(ids[:18])
        lm.logits(ids[:19], 1)
        lm.logits(ids, 1)
        weights = eager(input_ids=torch.tensor([ids]), output_attentions=True).attentions
    groups = sdpa.config.num_attention_heads // sdpa.config.num_key_value_heads
    for layer, (mass, attention) in enumerate(zip(lm._attention_masses, weights)):
        expected = attention[0].sum(dim=1).view(-1, groups, len(ids)).sum(dim=1)  # [KV heads, positions]
        assert torch.allclose(mass.over(len(ids)), expected.float(), atol=1e-5), layer
    lm.set_kv_policy(KVPolicy())  # another policy takes the scores away, from the modules too
    assert lm._attention_masses is None
    assert not [m for m in sdpa.modules() if hasattr(m, "kv_attention_mass")]
    lm.set_kv_policy(KVPolicy.of("head", 64, 2))  # and head gives them back
    assert len([m for m in sdpa.modules() if hasattr(m, "kv_attention_mass")]) == 2
    CachedLM(eager).set_kv_policy(KVPolicy())  # another model's full policy leaves this one's scores alone
    assert len([m for m in sdpa.modules() if hasattr(m, "kv_attention_mass")]) == 2
    lm.set_kv_policy(KVPolicy())
    assert not [m for m in sdpa.modules() if hasattr(m, "kv_attention_mass")]


def test_the_attention_mass_follows_rollbacks_and_evictions():
    mass = AttentionMass()
    mass.add(torch.ones(2, 5), new=5)
    mass.add(torch.ones(2, 7), new=2)  # two drafts read all five and themselves
    mass.add(torch.ones(2, 6), new=1)  # rolled back to five, one token fed
    assert mass.over(6).tolist() == [[3.0, 3.0, 3.0, 3.0, 3.0, 1.0]] * 2
    mass.keep(torch.tensor([[0, 5], [1, 4]]))
    assert mass.over(2).tolist() == [[3.0, 1.0], [3.0, 3.0]]


def test_head_is_refused_where_attention_returns_no_weights_it_can_read(tmp_path):
    write_model(tmp_path, seed=3, hidden=32, layers=1)
    eager = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64, attn_implementation="eager").eval()
    with pytest.raises(ValueError, match="draft_kv=head scores positions by the attention weights that sdpa"):
        CachedLM(eager).set_kv_policy(KVPolicy.of("head", 32, 2), "draft_kv")


def test_after_eviction_new_tokens_sit_at_their_true_positions(tmp_path):
    """One layer: keys and values depend on each token and its position only, so a compressed cache's
    next-token logits equal a full forward whose last query is masked from the evicted positions,
    at the original positions (not re-indexed ones)."""
    write_model(tmp_path, seed=3, hidden=32, layers=1)
    model = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    ids = [3 + (i * 11) % 60 for i in range(60)]
    budget, sinks = 12, 2
    lm = CachedLM(model)
    lm.set_kv_policy(KVPolicy.of("streaming", budget, sinks))
    with torch.inference_mode():
        lm.prefill(ids[:budget])
        for t in range(budget, len(ids)):  # one token a step, as AR feeds them
            compressed = lm.logits(ids[: t + 1], 1)[0]
            seen = torch.ones(t + 1, t + 1, dtype=torch.bool).tril()
            seen[t, sinks : t - (budget - sinks)] = False  # what the last query no longer reads
            full = model(input_ids=torch.tensor([ids[: t + 1]]), attention_mask=seen[None, None]).logits[0, -1]
            assert torch.allclose(compressed, full, atol=1e-9), t
    assert lm.evicted > 0 and lm.length - lm.evicted <= budget + 1


def test_a_rollback_into_evicted_positions_is_refused(pair):
    lm = CachedLM(pair.target)
    lm.set_kv_policy(KVPolicy.of("streaming", 16, 4))
    with torch.inference_mode():
        lm.logits(list(range(3, 50)), 1)
        lm.logits(list(range(3, 51)), 1)
        with pytest.raises(RuntimeError, match="cannot roll a compressed cache back"):
            lm.rollback(10)
        lm.rollback(0)  # starting over is always possible
    assert (lm.length, lm.evicted) == (0, 0)


@pytest.mark.parametrize("kind", ["streaming", "l2", "head"])
@pytest.mark.parametrize("method", ["sd", "egag", "sd-heuristic"])
def test_a_compressed_draft_cache_is_lossless(pair, method, kind):
    ar = full_run(pair, "ar")
    result = run(pair, method, draft_kv=kind)
    assert result.token_ids == ar.token_ids
    stats = result.stats
    assert stats["drafted"] > 0
    per_position = full_run(pair, method).stats["draft_kv_bytes_peak"] / (len(result.prompt_ids) + 40)
    # The budget, plus one chunk of the prefill, or one round's feed.
    assert stats["draft_kv_bytes_peak"] <= 2 * BUDGET * per_position * 1.05
    assert stats["target_kv_bytes_peak"] == ar.stats["target_kv_bytes_peak"]


def test_a_compressed_target_cache_is_marked_not_lossless(pair):
    results = [full_run(pair, "ar"), run(pair, "sd", target_kv="streaming"), full_run(pair, "sd")]
    frame = summary_frame(results).set_index("target_kv")
    assert frame.loc["streaming", "matches_ar"] is None
    assert frame.loc["full"].matches_ar.tolist() == [True, True]
    assert results[1].stats["target_kv_bytes_peak"] < results[0].stats["target_kv_bytes_peak"]


def test_under_streaming_peak_kv_memory_stays_flat(pair):
    peaks = {kind: [specdemo.generate(pair, LONG_PROMPT, method="ar", max_new_tokens=n, target_kv=kind,
                                      kv_budget=BUDGET).stats["target_kv_bytes_peak"] for n in (20, 80)]
             for kind in ("full", "streaming")}
    assert peaks["streaming"][0] == peaks["streaming"][1]
    assert peaks["full"][1] > peaks["full"][0]


def test_memory_columns(pair):
    sd, nasd = full_run(pair, "sd").stats, full_run(pair, "nasd").stats
    assert sd["target_weight_bytes"] == sd["draft_weight_bytes"] > 0  # the tiny draft is a noisy copy
    assert sd["draft_kv_bytes_peak"] > 0 and sd["target_kv_bytes_peak"] > 0
    assert nasd["draft_weight_bytes"] == nasd["draft_kv_bytes_peak"] == 0  # its table is not a model
    frame = summary_frame([specdemo.generate(pair, LONG_PROMPT, method="ar", max_new_tokens=5)])
    assert frame.target_kv_bytes_peak.iloc[0] > 0 and not math.isnan(frame.target_weight_bytes.iloc[0])


def test_policies_where_they_cannot_run_are_refused(pair, tmp_path):
    with pytest.raises(ValueError, match="KV policies compress the dynamic cache"):
        run(pair, "sd", target_kv="streaming", cache="static")
    with pytest.raises(ValueError, match="trees of drafts index the cache by position"):
        run(pair, "sd-tree", draft_kv="streaming")
    with pytest.raises(ValueError, match="keeps no KV cache"):
        run(pair, "ar-nocache", target_kv="streaming")
    seq2seq = build_tiny_seq2seq_pair(tmp_path / "t5")
    with pytest.raises(ValueError, match="KV policies run on decoder-only models"):
        specdemo.generate(seq2seq, "w5 w6 w7", method="sd", target_kv="streaming", kv_budget=16)
    target = tmp_path / "target"
    build_tiny_pair(tmp_path)
    write_tiny_head(tmp_path / "head", target)
    headed = specdemo.load_pair(str(target), str(tmp_path / "head"), device="cpu", dtype="float64")
    with pytest.raises(ValueError, match="feature head drafts from the target's states"):
        specdemo.generate(headed, "w5 w6 w7", method="sd", draft_kv="streaming", kv_budget=16)


def test_a_draft_policy_is_ignored_where_no_draft_model_drafts(pair):
    ar = full_run(pair, "ar")
    assert run(pair, "ar", draft_kv="streaming").token_ids == ar.token_ids
    assert run(pair, "nasd", draft_kv="l2").token_ids == ar.token_ids


def test_the_dynamic_cache_still_holds_full_attention_layers_only(pair):
    # The policy rewrites `keys` and `values` of DynamicLayer; a cache of other layers is refused.
    assert {type(layer).__name__ for layer in DynamicCache(config=pair.target.config).layers} == {"DynamicLayer"}
