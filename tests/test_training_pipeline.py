"""The draft's data pipeline and the feature head's training, end to end on a tiny target."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdemo.training import corpus as corpus_module
from specdemo.training import eagle
from specdemo.training import prompts as request_source
from tests.tiny import write_model, write_tokenizer


def load_tiny(tmp_path):
    folder = tmp_path / "target"
    write_model(folder, seed=0, hidden=32, layers=2, dtype=torch.float32)
    write_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def build(model, tokenizer, out, shards):
    return corpus_module.build(model, tokenizer, out, prompts=40, self_instruct_count=3, batch=6,
                               derived_per_shard=2, max_new_tokens=8, sample_every=2, max_shards=shards,
                               log=lambda m: None)


def test_requests_never_include_held_out_prompts_or_topics():
    requests = request_source.build_prompts(3000, seed=1)
    texts = [r["messages"][0]["content"].lower() for r in requests]
    assert len(set(texts)) == len(texts) == 3000
    held = {p.lower() for p in request_source.heldout_prompts()}
    assert not held & set(texts)
    for topic in ("glaciers", "origami", "the silk road", "quantum computing"):
        assert not any(topic in t for t in texts)
    assert {"code", "maths", "translation", "chat", "writing"} <= {r["category"] for r in requests}


def test_corpus_resumes_and_stores_what_the_target_computes(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    first = build(model, tokenizer, out, shards=2)
    assert first["shards"] == 2
    stamps = {p.name: p.stat().st_mtime_ns for p in corpus_module.Corpus(out).shards()}
    second = build(model, tokenizer, out, shards=5)
    corpus = corpus_module.Corpus(out)
    assert second["shards"] == 5
    assert {p.name: p.stat().st_mtime_ns for p in corpus.shards()[:2]} == stamps  # kept, not redone
    assert second["answer_tokens"] > first["answer_tokens"]
    # Later shards ask follow-ups on earlier exchanges.
    categories = [c for p in corpus.shards() for c in corpus.load_shard(p)["categories"]]
    assert "multi-turn" in categories or "summarisation" in categories

    shard = corpus.load_shard(0)
    prefix, answer = shard["prefixes"][0], shard["answers"][0]
    ids = torch.tensor([prefix + answer])
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state[0]
        logp = torch.log_softmax(model.lm_head(hidden).float(), dim=-1)
    features = shard["features"][0].float()
    assert features.shape == (len(prefix) + len(answer) - 1, 32)
    torch.testing.assert_close(features, hidden[:-1], atol=2e-2, rtol=2e-2)
    top = shard["top_ids"][0].long()
    expected = logp[len(prefix) - 1 : len(prefix) - 1 + len(answer)].gather(1, top)
    torch.testing.assert_close(shard["top_logp"][0].float(), expected, atol=2e-2, rtol=2e-2)
    if shard["temperature"] == 0:
        assert answer[0] == int(logp[len(prefix) - 1].argmax())


def test_head_trains_on_the_corpus_and_improves_agreement(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    build(model, tokenizer, out, shards=6)
    sequences = eagle.read_sequences(corpus_module.Corpus(out))
    assert sequences and all(s.features.shape[0] == len(s.ids) - 1 for s in sequences)
    head, info = eagle.train_head(model, sequences, subset_size=48, epochs=30, tokens_per_batch=256, lr=3e-3,
                                  validation=0.2, log=lambda m: None)
    assert 0 <= info["validation_agreement_step1"] <= 1
    train, _ = eagle.split_by_request(sequences, 0.2, 0)
    lm_head = model.lm_head.weight.detach()
    trained = eagle.agreement(head, train, lm_head)
    fresh = eagle.FeatureHead(head.config)
    fresh.subset.copy_(head.subset)
    fresh.init_from_target(model)
    fresh.bind(model)
    untrained = eagle.agreement(fresh, train, lm_head)
    assert trained[0] > untrained[0]
    head.save(tmp_path / "head", extra={"training": info})
    assert (tmp_path / "head" / "feature_head.json").is_file()


def test_asking_for_more_requests_grows_the_plan_at_its_end_and_keeps_what_was_answered(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    build(model, tokenizer, out, shards=2)
    corpus = corpus_module.Corpus(out)
    plan = corpus_module.read_jsonl(corpus.requests_path)
    assert corpus_module.requests_for(corpus, 40, [], 0) == plan  # the same ask adds nothing
    grown = corpus_module.requests_for(corpus, 400, [], 0)
    assert grown[: len(plan)] == plan and len(grown) > len(plan)
    keys = [str(r["messages"]).lower() for r in grown]
    assert len(set(keys)) == len(keys)
    assert corpus_module.read_jsonl(corpus.requests_path) == grown
    shard = corpus.load_shard(0)
    corpus_module.build(model, tokenizer, out, prompts=400, self_instruct_count=3, batch=6, derived_per_shard=2,
                        max_new_tokens=4, max_shards=3, log=lambda m: None)
    assert corpus.load_shard(0)["messages"] == shard["messages"]
    assert len(corpus.shards()) == 3


def test_workers_split_the_shards_between_them(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    for worker in (1, 0):
        corpus_module.build(model, tokenizer, out, prompts=40, self_instruct_count=3, batch=6, derived_per_shard=2,
                            max_new_tokens=4, max_shards=4, worker=worker, workers=2, log=lambda m: None)
        written = sorted(p.name for p in corpus_module.Corpus(out).shards())
        if worker == 1:
            assert written == ["shard-00001.pt", "shard-00003.pt"]
    assert written == [f"shard-{i:05d}.pt" for i in range(4)]


def test_learning_rate_warms_up_then_anneals_to_zero_by_steps():
    rates = [eagle.learning_rate(1e-3, step, 100, 10) for step in range(101)]
    assert rates[0] == pytest.approx(1e-4)
    assert max(rates) == pytest.approx(1e-3, rel=0.03)
    assert rates[100] == pytest.approx(0.0, abs=1e-12)
    after_warmup = rates[10:]
    assert all(a >= b for a, b in zip(after_warmup, after_warmup[1:]))


def test_a_time_budget_that_runs_out_first_still_anneals_to_zero():
    # 10 of 1000 planned steps done, but the whole budget spent: training ends at a zero rate.
    assert eagle.training_progress(10, 1000, elapsed_share=1.0) == 1.0
    assert eagle.learning_rate(1e-3, 10, 1000, 5, elapsed_share=1.0) == pytest.approx(0.0, abs=1e-12)
    halfway = eagle.learning_rate(1e-3, 10, 1000, 5, elapsed_share=0.5)
    assert halfway == pytest.approx(0.5e-3)
    # Steps that run out before the clock still decide.
    assert eagle.training_progress(1000, 1000, elapsed_share=0.2) == 1.0


def test_training_under_a_time_budget_stops_and_keeps_a_head(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    build(model, tokenizer, out, shards=2)
    sequences = eagle.read_sequences(corpus_module.Corpus(out))
    head, info = eagle.train_head(model, sequences, subset_size=48, epochs=10_000, tokens_per_batch=256,
                                  validation=0.2, max_minutes=0.02, log=lambda m: None)
    assert 0 < info["steps"] < 10_000  # at least one step an epoch was planned: the clock ended it
    assert head.subset.numel() == 48


def test_the_time_budget_also_bounds_the_requests_the_target_writes(tmp_path):
    """`minutes` covers every stage: a budget spent before the first request is written leaves
    neither requests nor shards, and the next run starts them."""
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "corpus"
    said = []
    spent = corpus_module.build(model, tokenizer, out, prompts=40, self_instruct_count=50, batch=6,
                                max_new_tokens=8, minutes=0.0, log=said.append)
    corpus = corpus_module.Corpus(out)
    assert spent["shards"] == 0 and not corpus_module.read_jsonl(corpus.self_instruct_path)
    assert not [m for m in said if m.startswith("self-instruct:")]  # not one batch of requests was asked for
    resumed = build(model, tokenizer, out, shards=1)
    assert resumed["shards"] == 1


def test_the_head_command_reads_several_corpora_and_continues_a_head(tmp_path):
    """As on a GPU, where one process per seed writes its own corpus and the head reads them all."""
    model, tokenizer = load_tiny(tmp_path)
    folders = [tmp_path / "corpus-1", tmp_path / "corpus-2"]
    for seed, folder in enumerate(folders, start=1):
        corpus_module.build(model, tokenizer, folder, prompts=40, self_instruct_count=0, batch=6, derived_per_shard=2,
                            max_new_tokens=8, max_shards=2, seed=seed, log=lambda m: None)
    sequences = sum(len(eagle.read_sequences(corpus_module.Corpus(f))) for f in folders)
    common = ["--corpus", *map(str, folders), "--target", str(tmp_path / "target"), "--tokens-per-batch", "256",
              "--device", "cpu"]
    eagle.main([*common, "--out", str(tmp_path / "first"), "--subset", "48", "--epochs", "1"])
    first = eagle.FeatureHead.load(tmp_path / "first")
    info = json.loads((tmp_path / "first" / "feature_head.json").read_text())["training"]
    assert info["train_sequences"] + info["validation_sequences"] == sequences
    assert not info["continued"]

    eagle.main([*common, "--out", str(tmp_path / "second"), "--start-from", str(tmp_path / "first"), "--max-steps", "2"])
    second = eagle.FeatureHead.load(tmp_path / "second")
    info = json.loads((tmp_path / "second" / "feature_head.json").read_text())["training"]
    assert info["continued"] and info["steps"] == 2
    assert torch.equal(second.subset, first.subset)  # a continued head keeps its vocabulary
    assert not torch.equal(second.fc.weight, first.fc.weight)


def test_near_duplicate_requests_are_refused_by_word_trigram_overlap():
    seen = request_source.NearDuplicates(threshold=0.5)
    seen.add("How do I keep my sourdough starter alive while I travel for two weeks?")
    assert seen.is_near("How do I keep my sourdough starter alive while I travel for three weeks?")
    assert seen.is_near("how do i keep my SOURDOUGH starter alive while i travel for two weeks")
    assert not seen.is_near("What should a night-shift nurse eat to stay alert until morning?")
    assert not seen.is_near("Why do I keep my sourdough starter in the fridge?")


def test_self_written_requests_are_asked_as_sampled_personas_in_sampled_formats():
    import random

    asks = [request_source.persona_ask(random.Random(seed), "a question", "Explain tides.") for seed in range(40)]
    assert len({a for a in asks}) > 30
    assert len({p for p in request_source.PERSONAS if any(p in a for a in asks)}) > 10
    assert all("Explain tides." in a and a.endswith("Reply with the new request only.") for a in asks)


def test_a_resumed_run_never_repeats_a_round_of_self_written_requests(tmp_path, monkeypatch):
    """Rounds that keep few requests must not be asked again after a restart: a repeated round
    asks the same questions with the same seed and keeps nothing."""
    model, tokenizer = load_tiny(tmp_path)
    asked: list[tuple[str, ...]] = []
    real = corpus_module.answer_batch

    def recording(model, prefixes, **kwargs):
        asked.append(tuple(tokenizer.decode(p) for p in prefixes))
        return real(model, prefixes, **kwargs)

    monkeypatch.setattr(corpus_module, "answer_batch", recording)
    corpus = corpus_module.Corpus(tmp_path / "corpus")
    kwargs = dict(batch=4, seed=0, stops={tokenizer.eos_token_id}, pad_id=tokenizer.pad_token_id, log=lambda m: None)
    corpus_module.self_instruct(model, tokenizer, corpus, 2, **kwargs)
    first_run = len(asked)
    corpus_module.self_instruct(model, tokenizer, corpus, 4, **kwargs)  # resumed, asking for more
    assert first_run >= 1 and len(asked) > first_run
    assert len(set(asked)) == len(asked)


def test_requests_built_on_earlier_answers_take_turns_as_follow_up_summary_passage_question_and_translation(tmp_path):
    from types import SimpleNamespace

    texts = [f"Tides rise twice a day near harbour {i}. The Moon pulls the sea toward it. Sailors plan their trips by "
             f"the tide tables. Fishing boats wait for high water." for i in range(8)]
    corpus = corpus_module.Corpus(tmp_path)
    corpus_module.save_atomic({"messages": [[{"role": "user", "content": f"Tell me about tides, part {i}."}]
                                             for i in range(8)],
                                "answers": [[100 + i] * 30 for i in range(8)], "max_new_tokens": 32},
                               corpus.shard_path(0))
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: texts[ids[0] - 100])
    derived = corpus_module.derived_requests(corpus, tokenizer, index=4, lag=4, count=8, seed=0, stops=set())
    kinds = [r["category"] for r in derived]
    assert kinds == ["multi-turn", "summarisation", "rag", "translation"] * 2
    for request in derived:
        content = request["messages"][-1]["content"]
        if request["category"] == "rag":  # the whole passage as context, then one question any passage answers
            passage = content.split("Context:\n")[1].split("\n\nQuestion: ")[0]
            assert passage in texts and content.split("\n\nQuestion: ")[1] in request_source.PASSAGE_QUESTIONS
        if request["category"] == "translation":  # the first one to three sentences of a passage, into a language
            ask, excerpt = content.split("\n\n")
            assert any(language in ask for language in request_source.LANGUAGES)
            assert any(t.startswith(excerpt) for t in texts) and excerpt.endswith(".")
