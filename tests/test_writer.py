"""The batched corpus writer: the same records as today's generation loop, so the corpus and the
trainer read its shards unchanged; finished rows leave the batch without changing anyone's answer."""

from __future__ import annotations

import torch

from specdemo.training import corpus as corpus_module
from specdemo.training import eagle
from specdemo.training.generation import answer_batch
from specdemo.training.writer import SlabLayer, write_all, write_batch
from tests.test_training_pipeline import load_tiny

PREFIXES = [[1, 5, 9, 12], [1, 7], [1, 3, 4, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, 30, 31, 32, 33]]


def _same_answers(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.tokens == b.tokens
        assert torch.equal(a.top_ids, b.top_ids)
        torch.testing.assert_close(a.top_logp.float(), b.top_logp.float(), atol=2e-2, rtol=0)
        assert a.features.shape == b.features.shape and a.features.dtype == b.features.dtype == torch.float16
        torch.testing.assert_close(a.features.float(), b.features.float(), atol=2e-2, rtol=0)
        if b.layer_features is None:
            assert a.layer_features is None
        else:
            torch.testing.assert_close(a.layer_features.float(), b.layer_features.float(), atol=2e-2, rtol=0)


def test_greedy_answers_equal_todays_loop_with_every_record(tmp_path):
    """Tokens, top-k ids, log-probabilities, final and intermediate states: what answer_batch keeps."""
    model, _ = load_tiny(tmp_path)
    options = dict(max_new_tokens=12, stops={2}, pad_id=2, feature_layers=(1,))
    _same_answers(write_batch(model, PREFIXES, **options), answer_batch(model, PREFIXES, **options))


def test_rows_that_stop_early_leave_the_batch_and_the_others_keep_their_answers(tmp_path):
    """Rows are dropped every few steps once they end; a dropped row's record is cut at its stop
    token, and the rows that go on write what they would have written in the full batch."""
    model, _ = load_tiny(tmp_path)
    free = answer_batch(model, PREFIXES, max_new_tokens=20, stops={2}, pad_id=2)
    # A token one row writes early, and another row never writes, ends some rows and not others.
    stop = free[0].tokens[1]
    assert any(stop not in a.tokens for a in free)
    options = dict(max_new_tokens=20, stops={stop}, pad_id=0)
    ours = write_batch(model, PREFIXES, **options)
    assert len(ours[0].tokens) == 2 and ours[0].tokens[-1] == stop
    _same_answers(ours, answer_batch(model, PREFIXES, **options))
    kept = write_batch(model, PREFIXES, drop_finished=False, **options)
    _same_answers(ours, kept)


def test_sampled_answers_keep_the_format_and_end_at_a_stop(tmp_path):
    model, _ = load_tiny(tmp_path)
    generator = torch.Generator().manual_seed(3)
    answers = write_batch(model, PREFIXES, max_new_tokens=10, stops={2, 7}, pad_id=2, temperature=1.0,
                          generator=generator)
    for prefix, answer in zip(PREFIXES, answers):
        assert 1 <= len(answer.tokens) <= 10
        assert all(t not in {2, 7} for t in answer.tokens[:-1])
        assert answer.features.shape[0] == len(prefix) + len(answer.tokens) - 1
        assert answer.top_ids.shape == answer.top_logp.shape == (len(answer.tokens), 16)


def test_the_cache_is_allocated_once_for_the_whole_answer():
    layer = SlabLayer(capacity=40)
    keys = torch.randn(3, 2, 5, 4)
    layer.update(keys, keys)
    buffer = layer.buffers[0]
    for _ in range(30):
        layer.update(keys[:, :, :1], keys[:, :, :1])
    assert layer.buffers[0] is buffer and layer.keys.shape[2] == 35
    torch.testing.assert_close(layer.keys[:, :, :5], keys)


def test_the_corpus_written_by_either_writer_is_the_same_and_the_trainer_reads_it(tmp_path):
    """Greedy shards (sample_every=0) from write_all equal those of answer_all, key for key."""
    model, tokenizer = load_tiny(tmp_path)
    roots = {}
    for name, writer in (("loop", None), ("batched", write_all)):
        options = {} if writer is None else {"writer": writer}
        roots[name] = tmp_path / name
        corpus_module.build(model, tokenizer, roots[name], prompts=20, self_instruct_count=0, batch=6,
                            derived_per_shard=2, max_new_tokens=8, sample_every=0, max_shards=2,
                            feature_layers=(1,), log=lambda m: None, **options)
    loop, batched = (corpus_module.Corpus(roots[n]) for n in ("loop", "batched"))
    assert [p.name for p in loop.shards()] == [p.name for p in batched.shards()]
    for a_path, b_path in zip(loop.shards(), batched.shards()):
        a, b = loop.load_shard(a_path), batched.load_shard(b_path)
        assert a.keys() == b.keys()
        for key in ("messages", "categories", "prefixes", "answers", "temperature", "max_new_tokens", "feature_layers"):
            assert a[key] == b[key], key
        for x, y in zip(a["features"], b["features"]):
            torch.testing.assert_close(x.float(), y.float(), atol=2e-2, rtol=0)
    sequences = eagle.read_sequences(batched, feature_layers=(1,))
    assert sequences and all(s.features.shape[0] == len(s.ids) - 1 for s in sequences)
