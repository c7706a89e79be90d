"""Training a fused-feature head (EAGLE-3): the layers' data, the training-time test, the pipeline.

Specification: the corpus keeps the chosen layers from the generating forward, or gets them from
one teacher-forced pass, and both give the target's states; the training-time test unrolls a
round exactly as the drafter drafts it; the commands train, continue and evaluate a fused head
end to end on a tiny target.
"""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest
import torch

from specdemo.engine.drafters.feature_drafter import FeatureDrafter
from specdemo.engine.drafters.feature_head import FeatureHead, HeadCache, HeadConfig
from specdemo.engine.drafters.policies import FixedGamma
from specdemo.engine.sampling import SamplingConfig
from specdemo.training import corpus as corpus_module
from specdemo.training import eagle, evaluate, layers
from tests.test_training_pipeline import load_tiny

LAYERS = (1,)  # the tiny target's first layer, beside its final state


def build(model, tokenizer, out, shards, feature_layers=()):
    return corpus_module.build(model, tokenizer, out, prompts=40, self_instruct_count=0, batch=6,
                               derived_per_shard=2, max_new_tokens=8, sample_every=2, max_shards=shards,
                               feature_layers=feature_layers, log=lambda m: None)


def teacher_forced(model, ids: list[int], chosen) -> torch.Tensor:
    with torch.no_grad():
        out = model.get_decoder()(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i][0] for i in chosen], dim=-1)


def test_the_corpus_keeps_the_chosen_layers_and_the_pass_adds_them_to_a_corpus_without(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    with_layers, without = tmp_path / "with", tmp_path / "without"
    build(model, tokenizer, with_layers, 2, feature_layers=LAYERS)
    build(model, tokenizer, without, 2)
    corpus = corpus_module.Corpus(without)
    assert layers.add_layers(model, corpus, LAYERS, log=lambda m: None) == 2
    assert layers.add_layers(model, corpus, LAYERS, log=lambda m: None) == 0  # resumed: nothing left
    for folder in (with_layers, without):
        corpus = corpus_module.Corpus(folder)
        for path in corpus.shards():
            shard = corpus.load_shard(path)
            stored = layers.stored_layers(corpus, path, shard, LAYERS)
            for prefix, answer, states in zip(shard["prefixes"], shard["answers"], stored):
                truth = teacher_forced(model, prefix + answer, LAYERS)[:-1]
                assert states.shape == truth.shape
                torch.testing.assert_close(states.float(), truth, atol=2e-2, rtol=2e-2)
    # Read for training, each position holds the layers and then the final state.
    sequences = eagle.read_sequences(corpus_module.Corpus(without), feature_layers=LAYERS)
    assert all(s.features.shape == (len(s.ids) - 1, 64) for s in sequences)
    with pytest.raises(FileNotFoundError, match="training.layers"):
        eagle.read_sequences(corpus_module.Corpus(without), feature_layers=(0,))


def test_layers_are_parsed_from_the_command_line():
    assert corpus_module.parse_layers("2,15") == (2, 15)
    for wrong in ("", "two", "-1"):
        with pytest.raises(Exception, match="layer"):
            corpus_module.parse_layers(wrong)


def tiny_fused_head(model) -> FeatureHead:
    torch.manual_seed(0)
    plain = FeatureHead(HeadConfig.for_target(model.config, 48))
    plain.init_from_target(model)
    head = FeatureHead.widened(plain, LAYERS)
    with torch.no_grad():
        head.fuse.weight.add_(0.2 * torch.randn_like(head.fuse.weight))
    return head.bind(model).eval()


def test_the_training_time_test_unrolls_a_round_exactly_as_the_drafter_drafts_it(tmp_path):
    model, _ = load_tiny(tmp_path)
    head = tiny_fused_head(model)
    ids = torch.randint(3, 60, (12,)).tolist()
    features = evaluate.target_features(model, ids, LAYERS)[:-1]  # positions 0..10
    next_ids = torch.tensor([ids[1:]])
    with torch.no_grad():
        unrolled = list(eagle.round_predictions(head, features[None], next_ids, steps=4))
    for committed in (3, 6):  # the round drafts from position `committed`: true states at 0..committed
        drafter_predictions = []
        with torch.no_grad():
            cache = HeadCache(head.config, "cpu", torch.float32)
            predicted = head(features[None, : committed + 1], next_ids[:, : committed + 1],
                             torch.arange(1, committed + 2), cache=cache)[0, -1]
            drafter_predictions.append(predicted)
            for step in range(1, 4):  # each later draft reads the head's own prediction and the true next token
                position = committed + step
                predicted = head(predicted.view(1, 1, -1), next_ids[:, position : position + 1],
                                 torch.tensor([position + 1]), cache=cache)[0, -1]
                drafter_predictions.append(predicted)
        for step, expected in enumerate(drafter_predictions):
            torch.testing.assert_close(unrolled[step][0, committed + step], expected, atol=1e-5, rtol=1e-4)


def test_the_drafter_drafts_what_the_training_time_test_predicts(tmp_path):
    model, _ = load_tiny(tmp_path)
    head = tiny_fused_head(model)
    prompt = torch.randint(3, 60, (9,)).tolist()
    features = evaluate.target_features(model, prompt, LAYERS)
    drafter = FeatureDrafter(head)
    drafter.start(prompt, features[:-1])
    proposal = drafter.propose(prompt, FixedGamma(3), 3, SamplingConfig(temperature=0.0), None)
    drafts = proposal.tokens.tolist()
    # Teacher-force the drafts as the next tokens: step s's prediction at the last position + s - 1.
    ids = prompt + drafts
    padded = torch.cat([features, features[-1:].repeat(len(drafts), 1)])[: len(ids) - 1]
    with torch.no_grad():
        unrolled = list(eagle.round_predictions(head, padded[None], torch.tensor([ids[1:]]), steps=3))
    last = len(prompt) - 2
    for step, token in enumerate(drafts):
        guess = head.subset[head.subset_logits(unrolled[step][0, last + step]).argmax()]
        assert int(guess) == token


def test_a_fused_head_trains_with_the_training_time_test_and_is_evaluated(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    build(model, tokenizer, out, 6, feature_layers=LAYERS)
    sequences = eagle.read_sequences(corpus_module.Corpus(out), feature_layers=LAYERS)
    head, info = eagle.train_head(model, sequences, subset_size=48, epochs=20, tokens_per_batch=256, lr=3e-3,
                                  validation=0.2, feature_layers=LAYERS, reg_weight=0.0, test_time=True, unroll=3,
                                  log=lambda m: None)
    assert head.config.feature_layers == LAYERS and info["test_time"] and info["reg_weight"] == 0.0
    train, _ = eagle.split_by_request(sequences, 0.2, 0)
    lm_head = model.lm_head.weight.detach()
    fresh = FeatureHead.widened(FeatureHead(dataclasses.replace(head.config, feature_layers=())), LAYERS)
    fresh.subset.copy_(head.subset)
    fresh.bind(model)
    assert eagle.agreement(head, train, lm_head, steps=3)[0] > eagle.agreement(fresh, train, lm_head, steps=3)[0]
    answers = [(s.ids[: s.answer_start].tolist(), s.ids[s.answer_start :].tolist()) for s in sequences[:4]]
    report = evaluate.heldout_acceptance(head, model, answers, gamma=3)
    assert report["rounds"] > 0 and 0 <= report["acceptance"] <= 1
    # Per group (a suite's categories): one label for all is the whole; two labels split the prompts.
    whole = evaluate.heldout_acceptance(head, model, answers, gamma=3, groups=["all"] * 4)["by_group"]["all"]
    assert whole == {"prompts": 4, "acceptance": report["acceptance"], "tokens_per_round": report["tokens_per_round"]}
    split = evaluate.heldout_acceptance(head, model, answers, gamma=3, groups=["a", "b", "a", "b"])["by_group"]
    assert list(split) == ["a", "b"] and split["a"]["prompts"] == split["b"]["prompts"] == 2
    with pytest.raises(ValueError, match="3 group labels for 4 answers"):
        evaluate.heldout_acceptance(head, model, answers, gamma=3, groups=["a"] * 3)
    assert evaluate.step_cost(head, model, context=16, calls=3)["draft_macs"] == head.step_macs()


def test_the_head_command_widens_a_head_and_continues_it_on_the_layers(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    build(model, tokenizer, out, 2)
    common = ["--corpus", str(out), "--target", str(tmp_path / "target"), "--tokens-per-batch", "256",
              "--device", "cpu"]
    eagle.main([*common, "--out", str(tmp_path / "plain"), "--subset", "48", "--epochs", "1"])
    with pytest.raises(FileNotFoundError, match="training.layers"):
        eagle.main([*common, "--out", str(tmp_path / "fused"), "--start-from", str(tmp_path / "plain"),
                    "--feature-layers", "1", "--max-steps", "2"])
    layers.main(["--corpus", str(out), "--feature-layers", "1", "--target", str(tmp_path / "target"),
                 "--device", "cpu"])
    eagle.main([*common, "--out", str(tmp_path / "fused"), "--start-from", str(tmp_path / "plain"),
                "--feature-layers", "1", "--reg-weight", "0", "--test-time", "--unroll", "3", "--max-steps", "2",
                "--rejected-weight", "2"])
    plain, fused = FeatureHead.load(tmp_path / "plain"), FeatureHead.load(tmp_path / "fused")
    info = json.loads((tmp_path / "fused" / "feature_head.json").read_text())["training"]
    assert fused.config.feature_layers == LAYERS and info["continued"] and info["test_time"]
    assert info["rejected_weight"] == 2 and 0 <= info["rejected_share"] <= 1
    assert torch.equal(fused.subset, plain.subset)


def test_on_policy_weights_fall_on_the_positions_the_starting_head_loses(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    build(model, tokenizer, out, 2, feature_layers=LAYERS)
    sequences = eagle.read_sequences(corpus_module.Corpus(out), feature_layers=LAYERS)
    head = tiny_fused_head(model)
    lm_head = model.lm_head.weight.detach()
    share = eagle.weigh_rejections(head, sequences, lm_head, weight=3.0)
    assert 0 < share < 1
    d = model.config.hidden_size
    for seq in sequences[:5]:
        with torch.no_grad():
            predicted = head(seq.features[None].float(), seq.ids[None, 1:], torch.arange(1, len(seq.ids)))[0]
        guess = head.subset[head.subset_logits(predicted[:-1]).argmax(-1)]
        truth = (seq.features[1:, -d:].float() @ lm_head.t()).argmax(-1)
        expected = torch.where(guess != truth, 3.0, 1.0)
        torch.testing.assert_close(seq.weights[:-1], expected)
    # Weights of 1 leave the loss as it was; weights elsewhere change it.
    batch = eagle.collate(sequences[:4])
    plain = dict(batch, weights=torch.ones_like(batch["weights"]))
    torch.manual_seed(0)
    unweighted, _ = eagle.head_losses(head, plain, noise=0.0, unroll=2, cls_weight=1.0, test_time=True)
    torch.manual_seed(0)
    without, _ = eagle.head_losses(head, {k: v for k, v in plain.items() if k != "weights"}, noise=0.0, unroll=2,
                                   cls_weight=1.0, test_time=True)
    weighted, _ = eagle.head_losses(head, batch, noise=0.0, unroll=2, cls_weight=1.0, test_time=True)
    torch.testing.assert_close(unweighted, without)
    assert not torch.allclose(weighted, unweighted)


def test_held_out_agreement_is_the_share_of_answer_tokens_the_drafter_guesses_from_the_true_context(tmp_path):
    """Step 1 of `heldout_agreement` counts, over every token of a greedy answer, whether the
    drafter's first draft from the true context before it is that token."""
    model, _ = load_tiny(tmp_path)
    head = tiny_fused_head(model)
    answers = []
    for prompt in ([1, 5, 9, 13], [1, 7, 7, 30, 2]):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(10):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        answers.append((prompt, ids[len(prompt):]))
    # A vocabulary of the answers' two commonest tokens makes a random head right some of the time.
    common = [t for t, _ in collections.Counter(t for _, answer in answers for t in answer).most_common(2)]
    head.subset[: len(common)] = torch.tensor(common)
    head.subset[len(common):] = common[0]
    head.bind(model)
    hits = total = 0
    for prompt, answer in answers:
        full = prompt + answer
        features = evaluate.target_features(model, full, LAYERS)
        for k in range(len(answer)):
            drafter = FeatureDrafter(head)
            context = full[: len(prompt) + k]
            drafter.start(context, features[: len(context) - 1])
            with torch.inference_mode():
                proposal = drafter.propose(context, FixedGamma(1), 1, SamplingConfig(temperature=0.0), None)
            hits += int(proposal.tokens[0]) == answer[k]
            total += 1
    report = evaluate.heldout_agreement(head, model, answers)
    assert 0 < hits < total  # a test that could tell a wrong count from a right one
    assert report["heldout_agreement_step1"] == round(hits / total, 4)
    assert 0 <= report["heldout_agreement_step2"] <= 1
