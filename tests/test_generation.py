"""The training data's one generation loop (specdemo/training/generation.py): prompts answered
together, each as the target would answer it alone, with what distillation and a feature
draft read kept from the same forward; finished rows leave the batch without changing anyone's
answer, and the corpus and the trainer read its shards."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from specdemo.training import corpus as corpus_module
from specdemo.training import eagle
from specdemo.training.generation import (DONE_CHECK_EVERY, SAMPLE_CANDIDATES, TOPK, Answer, SlabLayer, answer_all,
                                          answer_batch, left_padded)
from tests.test_training_pipeline import load_tiny

PREFIXES = [[1, 5, 9, 12, 7], [1, 30], [1, 44, 21, 8, 8, 3, 17, 60, 11]]
RAGGED = [[1, 5, 9, 12], [1, 7], [1, 3, 4, 5, 6, 7, 8, 9, 10], [1, 20, 21], [1, 30, 31, 32, 33]]


def greedy_alone(model, prefix: list[int], steps: int, stops: set[int]) -> list[int]:
    """The target's greedy answer to one unpadded prefix, a full forward per token."""
    ids = list(prefix)
    for _ in range(steps):
        with torch.no_grad():
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        ids.append(token)
        if token in stops:
            break
    return ids[len(prefix):]


@torch.inference_mode()
def plain_loop(model, prefixes, *, max_new_tokens, stops, pad_id, temperature=0.0, generator=None, features=True,
               feature_layers=()) -> list[Answer]:
    """The loop at its plainest, the reference: every row to the batch's end, transformers' growing
    cache, the states gathered step by step, the generator drawn for every row at every step."""
    body, head = model.get_decoder(), model.get_output_embeddings()
    ids, mask = left_padded(prefixes, pad_id)
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    layers = tuple(feature_layers) if features else ()
    out = body(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, output_hidden_states=True)
    fed, steps, done = [out], [], torch.zeros(len(prefixes), dtype=torch.bool)
    for step in range(max_new_tokens):
        logp = F.log_softmax(head(out.last_hidden_state[:, -1]).float(), dim=-1)
        values, indices = logp.topk(max(TOPK, SAMPLE_CANDIDATES), dim=-1)
        pick = (torch.multinomial(F.softmax(values / temperature, dim=-1), 1, generator=generator) if temperature
                else torch.zeros(len(prefixes), 1, dtype=torch.long))
        token = torch.where(done, pad_id, indices.gather(1, pick).squeeze(1))
        steps.append((token, indices[:, :TOPK], values[:, :TOPK]))
        done |= torch.isin(token, torch.tensor(sorted(stops)))
        if step + 1 == max_new_tokens or (step % DONE_CHECK_EVERY == DONE_CHECK_EVERY - 1 and bool(done.all())):
            break
        mask, positions = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1), positions[:, -1:] + 1
        out = body(input_ids=token[:, None], attention_mask=mask, position_ids=positions, cache=out.cache,
                   use_cache=True, output_hidden_states=True)
        fed.append(out)
    states = torch.cat([o.last_hidden_state for o in fed], 1)
    layer_states = torch.cat([torch.cat([o.hidden_states[i] for i in layers], -1) for o in fed], 1) if layers else None
    tokens, top_ids, top_logp = (torch.stack(column, 1) for column in zip(*steps))
    answers, width = [], ids.shape[1]
    for row, prefix in enumerate(prefixes):
        answer = tokens[row].tolist()
        answer = answer[: next((i + 1 for i, t in enumerate(answer) if t in stops), len(answer))]
        kept = slice(width - len(prefix), width + len(answer) - 1)
        answers.append(Answer(answer, states[row, kept].half() if features else None, top_ids[row, : len(answer)].int(),
                              top_logp[row, : len(answer)].half(),
                              None if layer_states is None else layer_states[row, kept].half()))
    return answers


def _same_answers(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.tokens == b.tokens
        assert torch.equal(a.top_ids, b.top_ids) and a.top_ids.dtype == b.top_ids.dtype
        torch.testing.assert_close(a.top_logp.float(), b.top_logp.float(), atol=2e-2, rtol=0)
        for name in ("features", "layer_features"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if y is not None:
                assert x.shape == y.shape and x.dtype == y.dtype == torch.float16
                torch.testing.assert_close(x.float(), y.float(), atol=2e-2, rtol=0)


def options(pair, **more):
    return dict(max_new_tokens=10, stops=set(pair.eos_ids), pad_id=0, **more)


def test_prompts_answered_together_get_the_answers_each_gets_alone(tiny_pair):
    answers = answer_batch(tiny_pair.target, PREFIXES, **options(tiny_pair))
    for prefix, answer in zip(PREFIXES, answers):
        assert answer.tokens == greedy_alone(tiny_pair.target, prefix, 10, set(tiny_pair.eos_ids))


def test_each_answer_step_keeps_the_targets_top_k_at_temperature_one(tiny_pair):
    answer = answer_batch(tiny_pair.target, PREFIXES[:1], topk=4, **options(tiny_pair))[0]
    assert answer.top_ids.shape == answer.top_logp.shape == (len(answer.tokens), 4)
    assert answer.top_ids[:, 0].tolist() == answer.tokens  # greedy: the most likely token is the one taken
    with torch.no_grad():
        logits = tiny_pair.target(input_ids=torch.tensor([PREFIXES[0]])).logits[0, -1]
    expected = torch.log_softmax(logits.float(), -1).topk(4)
    assert answer.top_ids[0].tolist() == expected.indices.tolist()
    assert torch.allclose(answer.top_logp[0].float(), expected.values, atol=1e-2)  # stored in half precision


def test_features_are_the_final_hidden_state_at_every_fed_position(tiny_pair):
    answers = answer_batch(tiny_pair.target, PREFIXES, **options(tiny_pair))
    hidden = tiny_pair.target.config.hidden_size
    for prefix, answer in zip(PREFIXES, answers):
        fed = prefix + answer.tokens[:-1]
        assert answer.features.shape == (len(fed), hidden)
        with torch.no_grad():
            alone = tiny_pair.target.get_decoder()(input_ids=torch.tensor([fed])).last_hidden_state[0]
        assert torch.allclose(answer.features.float(), alone.float(), atol=1e-2)
    assert all(a.features is None for a in answer_batch(tiny_pair.target, PREFIXES, features=False,
                                                         **options(tiny_pair)))


def test_answer_all_batches_by_length_and_returns_the_answers_in_the_prompts_order(tiny_pair):
    prefixes = PREFIXES * 2 + [[1, 3]]
    together = answer_all(tiny_pair.target, prefixes, batch=2, features=False, **options(tiny_pair))
    assert [a.tokens for a in together] == [a.tokens for a in answer_batch(tiny_pair.target, prefixes,
                                                                            **options(tiny_pair))]


def test_sampled_answers_follow_the_generator(tiny_pair):
    def sampled(seed):
        generator = torch.Generator().manual_seed(seed)
        return [a.tokens for a in answer_batch(tiny_pair.target, PREFIXES, temperature=1.0, generator=generator,
                                               features=False, **options(tiny_pair))]

    assert sampled(3) == sampled(3)
    assert any(sampled(seed) != sampled(3) for seed in range(4, 8))


@pytest.mark.parametrize("temperature, features, feature_layers", [
    (0.0, True, (1,)), (0.0, False, ()), (1.0, True, ()), (0.7, True, (1, 0)), (1.0, False, (1,))])
def test_every_record_equals_the_plain_loops_greedy_or_sampled_with_a_seed(tmp_path, temperature, features,
                                                                           feature_layers):
    """Tokens, top-k ids, log-probabilities, final and intermediate states, with stops that end
    some rows early (so a greedy batch drops them), the same generator seed on both sides."""
    model, _ = load_tiny(tmp_path)
    free = plain_loop(model, RAGGED, max_new_tokens=20, stops={2}, pad_id=2)
    stops = {free[0].tokens[1], free[2].tokens[9]}
    assert any(not stops & set(a.tokens) for a in free)
    shared = dict(max_new_tokens=20, stops=stops, pad_id=2, temperature=temperature, features=features,
                  feature_layers=feature_layers)
    _same_answers(answer_batch(model, RAGGED, generator=torch.Generator().manual_seed(5), **shared),
                  plain_loop(model, RAGGED, generator=torch.Generator().manual_seed(5), **shared))


def test_rows_that_stop_early_leave_the_batch_and_the_others_keep_their_answers(tmp_path):
    """Rows are dropped every few steps once they end; a dropped row's record is cut at its stop
    token, and the rows that go on write what they would have written in the full batch."""
    model, _ = load_tiny(tmp_path)
    free = answer_batch(model, RAGGED, max_new_tokens=20, stops={2}, pad_id=2)
    # A token one row writes early, and another row never writes, ends some rows and not others.
    stop = free[0].tokens[1]
    assert any(stop not in a.tokens for a in free)
    shared = dict(max_new_tokens=20, stops={stop}, pad_id=0)
    ours = answer_batch(model, RAGGED, **shared)
    assert len(ours[0].tokens) == 2 and ours[0].tokens[-1] == stop
    _same_answers(ours, answer_batch(model, RAGGED, drop_finished=False, **shared))


@pytest.mark.parametrize("drop_finished", [None, True])
def test_sampled_answers_keep_the_format_and_end_at_a_stop(tmp_path, drop_finished):
    model, _ = load_tiny(tmp_path)
    generator = torch.Generator().manual_seed(3)
    answers = answer_batch(model, RAGGED, max_new_tokens=10, stops={2, 7}, pad_id=2, temperature=1.0,
                           generator=generator, drop_finished=drop_finished)
    for prefix, answer in zip(RAGGED, answers):
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


def test_the_corpus_is_the_same_whether_finished_rows_leave_or_stay_and_the_trainer_reads_it(tmp_path):
    """Greedy shards (sample_every=0) with finished rows dropped equal those with every row kept, key for key."""
    model, tokenizer = load_tiny(tmp_path)
    roots = {}
    for name, writer in (("dropped", None), ("kept", functools.partial(answer_all, drop_finished=False))):
        roots[name] = tmp_path / name
        corpus_module.build(model, tokenizer, roots[name], prompts=20, self_instruct_count=0, batch=6,
                            derived_per_shard=2, max_new_tokens=8, sample_every=0, max_shards=2,
                            feature_layers=(1,), log=lambda m: None, **({} if writer is None else {"writer": writer}))
    dropped, kept = (corpus_module.Corpus(roots[n]) for n in ("dropped", "kept"))
    assert [p.name for p in dropped.shards()] == [p.name for p in kept.shards()]
    for a_path, b_path in zip(dropped.shards(), kept.shards()):
        a, b = dropped.load_shard(a_path), kept.load_shard(b_path)
        assert a.keys() == b.keys()
        for key in ("messages", "categories", "prefixes", "answers", "temperature", "max_new_tokens", "feature_layers"):
            assert a[key] == b[key], key
        for x, y in zip(a["features"], b["features"]):
            torch.testing.assert_close(x.float(), y.float(), atol=2e-2, rtol=0)
    sequences = eagle.read_sequences(dropped, feature_layers=(1,))
    assert sequences and all(s.features.shape[0] == len(s.ids) - 1 for s in sequences)
