"""The carved-draft candidate: the target's own layers, a subset read-out, recovered by distillation."""

from __future__ import annotations

import torch

from specdemo.training import carve, eagle
from specdemo.training import corpus as corpus_module
from tests.test_training_pipeline import build, load_tiny


def tiny_corpus(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    build(model, tokenizer, tmp_path / "corpus", shards=6)
    return model, eagle.read_sequences(corpus_module.Corpus(tmp_path / "corpus"))


def test_keeping_every_layer_over_the_whole_vocabulary_is_the_target(tmp_path):
    model, sequences = tiny_corpus(tmp_path)
    everything = torch.arange(model.config.vocab_size)
    draft = carve.CarvedDraft(model, [0, 1], everything)
    assert carve.agreement(draft, sequences) == 1.0
    answers = [(s.ids[: s.answer_start].tolist(), s.ids[s.answer_start :].tolist()) for s in sequences[:3]]
    report = carve.heldout_acceptance(draft, answers, gamma=3)
    assert report["acceptance"] == 1.0


def test_the_embedding_is_the_targets_and_is_not_trained(tmp_path):
    model, _ = tiny_corpus(tmp_path)
    draft = carve.CarvedDraft(model, [1], torch.arange(16))
    assert draft.model.embed_tokens.weight is model.get_input_embeddings().weight
    assert all(p is not model.get_input_embeddings().weight for p in draft.trainable())
    assert len(draft.model.layers) == 1
    torch.testing.assert_close(draft.model.layers[0].mlp.up_proj.weight, model.model.layers[1].mlp.up_proj.weight)
    assert draft.step_macs() == (sum(p.numel() for p in model.model.layers[1].parameters() if p.dim() == 2)
                                 + 16 * model.config.hidden_size)


def test_distillation_recovers_agreement_lost_by_dropping_a_layer(tmp_path):
    model, sequences = tiny_corpus(tmp_path)
    for p in model.parameters():
        p.requires_grad_(False)
    draft, info = carve.train_carved(model, sequences, [1], subset_size=48, epochs=30, tokens_per_batch=256,
                                     lr=3e-3, validation=0.2, log=lambda m: None)
    train, _ = eagle.split_by_request(sequences, 0.2, 0)
    untrained = carve.CarvedDraft(model, [1], draft.subset)
    assert carve.agreement(draft, train) > carve.agreement(untrained, train)
    assert info["validation_agreement"] >= info["validation_agreement_untrained"]
    cost = carve.step_cost(draft, model, context=16, calls=5)
    assert cost["draft_step_ms"] > 0 and cost["cost_ratio"] > 0
