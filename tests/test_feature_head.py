"""The feature-level draft head: its cache, its subset distribution and its files."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdemo.engine.drafters.feature_head import FeatureHead, HeadCache, HeadConfig
from tests.head_logits import full_logits


def tiny_target(vocab: int = 64, hidden: int = 32) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).double().eval()


def tiny_head(target, subset_size: int = 24) -> FeatureHead:
    head = FeatureHead(HeadConfig.for_target(target.config, subset_size)).double()
    head.subset.copy_(torch.randperm(target.config.vocab_size)[:subset_size].sort().values)
    head.init_from_target(target)
    return head.bind(target).eval()


def test_cached_steps_equal_one_causal_pass():
    target = tiny_target()
    head = tiny_head(target)
    features = torch.randn(1, 10, 32, dtype=torch.float64)
    ids = torch.randint(0, 64, (1, 10))
    positions = torch.arange(1, 11)
    whole = head(features, ids, positions)
    cache = HeadCache(head.config, "cpu", torch.float64, capacity=4)  # grows on the way
    first = head(features[:, :6], ids[:, :6], positions[:6], cache=cache)
    rest = [head(features[:, i : i + 1], ids[:, i : i + 1], positions[i : i + 1], cache=cache) for i in range(6, 10)]
    stepped = torch.cat([first] + rest, dim=1)
    torch.testing.assert_close(stepped, whole)


def test_rollback_forgets_drafted_positions():
    target = tiny_target()
    head = tiny_head(target)
    features = torch.randn(1, 8, 32, dtype=torch.float64)
    ids = torch.randint(0, 64, (1, 8))
    positions = torch.arange(1, 9)
    cache = HeadCache(head.config, "cpu", torch.float64)
    head(features[:, :5], ids[:, :5], positions[:5], cache=cache)
    head(torch.randn(1, 3, 32, dtype=torch.float64), ids[:, 5:], positions[5:], cache=cache)  # drafts
    cache.rollback(5)
    assert cache.length == 5
    again = head(features[:, 5:], ids[:, 5:], positions[5:], cache=cache)
    torch.testing.assert_close(again, head(features, ids, positions)[:, 5:])


def test_distribution_is_zero_outside_the_subset():
    target = tiny_target()
    head = tiny_head(target, subset_size=24)
    logits = full_logits(head, torch.randn(3, 32, dtype=torch.float64))
    probs = torch.softmax(logits, dim=-1)
    outside = torch.ones(64, dtype=torch.bool)
    outside[head.subset] = False
    assert torch.all(probs[:, outside] == 0)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, dtype=torch.float64))
    # Inside the subset the logits are the target's LM head applied to the prediction.
    predicted = torch.randn(32, dtype=torch.float64)
    expected = target.lm_head.weight[head.subset] @ predicted
    torch.testing.assert_close(full_logits(head, predicted)[head.subset], expected)


def test_save_and_load_keep_weights_and_subset_but_not_the_targets_rows(tmp_path):
    target = tiny_target()
    head = tiny_head(target)
    head.save(tmp_path, dtype=torch.float32, extra={"training": {"note": "test"}})
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / "feature_head.safetensors"))
    assert not any("embed" in k or "head_columns" in k for k in stored)
    loaded = FeatureHead.load(tmp_path, dtype=torch.float64).bind(target)
    assert torch.equal(loaded.subset, head.subset)
    features = torch.randn(1, 5, 32, dtype=torch.float64)
    ids = torch.randint(0, 64, (1, 5))
    torch.testing.assert_close(loaded(features, ids, torch.arange(1, 6)), head(features, ids, torch.arange(1, 6)),
                               atol=1e-5, rtol=1e-4)


def test_step_cost_counts_the_subset_head():
    target = tiny_target()
    small, large = tiny_head(target, 8), tiny_head(target, 40)
    assert large.step_macs() - small.step_macs() == 32 * 32


def test_a_head_widened_to_more_tokens_keeps_its_weights_and_its_logits_on_the_old_subset():
    target = tiny_target()
    head = tiny_head(target, subset_size=24)
    wider = head.with_subset_size(40).bind(target)
    assert wider.config.subset_size == 40 and len(set(wider.subset.tolist())) == 40
    assert set(head.subset.tolist()) <= set(wider.subset.tolist())
    features, ids, positions = torch.randn(1, 5, 32, dtype=torch.float64), torch.randint(0, 64, (1, 5)), torch.arange(1, 6)
    predicted = head(features, ids, positions)[0, -1]
    torch.testing.assert_close(wider(features, ids, positions)[0, -1], predicted)
    old, new = full_logits(head, predicted), full_logits(wider, predicted)
    torch.testing.assert_close(new[head.subset], old[head.subset])
    added = sorted(set(wider.subset.tolist()) - set(head.subset.tolist()))
    assert added == [t for t in range(64) if t not in set(head.subset.tolist())][:16]  # the lowest ids it lacked
    assert torch.isfinite(new[added]).all() and torch.softmax(new, -1)[added].sum() > 0
    assert head.with_subset_size(64).config.subset_size == 64


def test_a_subset_smaller_than_the_heads_or_larger_than_the_vocabulary_is_refused():
    import pytest

    head = tiny_head(tiny_target(), subset_size=24)
    for size in (8, 65):
        with pytest.raises(ValueError, match="between 24 and 64"):
            head.with_subset_size(size)


def test_a_step_over_rows_equals_each_row_alone_and_follows_a_weight_learnt_in_place():
    """step_rows runs the layer's products from weights kept transposed; a weight the online head writes in
    place (an optimiser's step) is read afresh on the next step, not from the kept copy."""
    target = tiny_target()
    head = tiny_head(target)
    torch.manual_seed(1)
    features, ids = torch.randn(3, 32, dtype=torch.float64), torch.tensor([5, 9, 40])

    def rows_and_alone():
        caches = [HeadCache(head.config, "cpu", torch.float64) for _ in range(3)]
        alone = [HeadCache(head.config, "cpu", torch.float64) for _ in range(3)]
        for cache, other, length in zip(caches, alone, (1, 3, 7)):
            history, history_ids = torch.randn(1, length, 32, dtype=torch.float64), torch.randint(0, 64, (1, length))
            for c in (cache, other):
                head(history, history_ids, torch.arange(1, length + 1), cache=c)
        rows = head.step_rows(features, ids, [c.length + 1 for c in caches], caches)
        each = torch.cat([head(features[i].view(1, 1, -1), ids[i].view(1, 1), torch.tensor([alone[i].length + 1]),
                               cache=alone[i])[0] for i in range(3)])
        return rows, each

    with torch.no_grad():
        rows, each = rows_and_alone()
        torch.testing.assert_close(rows, each, rtol=1e-12, atol=1e-12)
        head.up_proj.weight.mul_(1.5)  # written in place, as an optimiser writes it
        learnt_rows, learnt_each = rows_and_alone()
    torch.testing.assert_close(learnt_rows, learnt_each, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(learnt_rows, rows)


def test_a_step_over_rows_ignores_what_a_rollback_left_past_a_rows_length_and_pads_a_short_cache():
    """The rows attend side by side over the longest row's positions: past its length a row's cache holds the
    keys its rolled-back drafts left (here made huge, so any weight on them would show), and a cache shorter
    than the longest row is padded rather than grown."""
    target = tiny_target()
    head = tiny_head(target)
    torch.manual_seed(3)
    caches = [HeadCache(head.config, "cpu", torch.float64, capacity=capacity) for capacity in (16, 2, 16)]
    alone = [HeadCache(head.config, "cpu", torch.float64) for _ in caches]
    with torch.no_grad():
        for cache, other, length in zip(caches, alone, (4, 1, 9)):
            history, history_ids = torch.randn(1, length, 32, dtype=torch.float64), torch.randint(0, 64, (1, length))
            for c in (cache, other):
                head(history, history_ids, torch.arange(1, length + 1), cache=c)
        head(torch.randn(1, 3, 32, dtype=torch.float64), torch.randint(0, 64, (1, 3)), torch.arange(5, 8),
             cache=caches[0])  # three drafts, refused
        caches[0].rollback(4)
        caches[0].k[:, :, 5:8] *= 1e6
        caches[0].v[:, :, 5:8] *= 1e6
        features, ids = torch.randn(3, 32, dtype=torch.float64), torch.tensor([2, 30, 61])
        rows = head.step_rows(features, ids, [c.length + 1 for c in caches], caches)
        each = torch.cat([head(features[i].view(1, 1, -1), ids[i].view(1, 1), torch.tensor([alone[i].length + 1]),
                               cache=alone[i])[0] for i in range(3)])
    torch.testing.assert_close(rows, each, rtol=1e-12, atol=1e-12)
    assert caches[1].k.shape[2] == 2, "the short cache keeps its size"


def test_reading_rows_gives_each_rows_last_prediction_and_keeps_every_position_in_its_cache():
    """read_rows runs the layer past attention for each row's last position only; what it returns, and the cache
    it leaves (read by the next step), equal the row's own cached forward over all its positions."""
    target = tiny_target()
    head = tiny_head(target)
    torch.manual_seed(2)
    earlier, read = (2, 5, 1), (4, 1, 6)
    caches = [HeadCache(head.config, "cpu", torch.float64) for _ in earlier]
    alone = [HeadCache(head.config, "cpu", torch.float64) for _ in earlier]
    features, ids, expected = [], [], []
    with torch.no_grad():
        for cache, other, before, n in zip(caches, alone, earlier, read):
            history, history_ids = torch.randn(1, before, 32, dtype=torch.float64), torch.randint(0, 64, (1, before))
            for c in (cache, other):
                head(history, history_ids, torch.arange(1, before + 1), cache=c)
            features.append(torch.randn(n, 32, dtype=torch.float64))
            ids.append(torch.randint(0, 64, (n,)))
            expected.append(head(features[-1][None], ids[-1][None], torch.arange(before + 1, before + n + 1),
                                 cache=other)[0, -1])
        rows = head.read_rows(features, ids, [before for before in earlier], caches)
        torch.testing.assert_close(rows, torch.stack(expected), rtol=1e-12, atol=1e-12)
        assert [c.length for c in caches] == [c.length for c in alone]
        step = head.step_rows(rows, torch.tensor([3, 7, 11]), [c.length + 1 for c in caches], caches)
        each = torch.cat([head(rows[i].view(1, 1, -1), torch.tensor([[t]]), torch.tensor([alone[i].length + 1]),
                               cache=alone[i])[0] for i, t in enumerate((3, 7, 11))])
    torch.testing.assert_close(step, each, rtol=1e-12, atol=1e-12)


def test_q_from_the_subset_alone_equals_the_filters_over_the_whole_vocabulary():
    """draft_q's softmax runs over the subset's columns only; it is the q the sampling filters give over the full
    vocabulary's logits, −inf outside the subset, greedy or sampled, for one row or a batch of rows."""
    from specdemo.engine.drafters.feature_drafter import draft_q
    from specdemo.engine.sampling import SamplingConfig, probabilities

    head = tiny_head(tiny_target(), subset_size=24)
    predicted = torch.randn(3, 32, dtype=torch.float64)
    for sampling in (SamplingConfig(), SamplingConfig(temperature=0.7, top_k=10, top_p=0.8)):
        q = draft_q(head, head.draft_logits(predicted), sampling)
        # probabilities works in float32: the two sums over different columns agree to its rounding.
        torch.testing.assert_close(q, probabilities(full_logits(head, predicted), sampling), rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(q[1], draft_q(head, head.draft_logits(predicted[1]), sampling))
        outside = torch.ones(64, dtype=torch.bool)
        outside[head.subset] = False
        assert q.shape == (3, 64) and torch.all(q[:, outside] == 0)
