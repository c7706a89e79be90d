"""Broad text for the feature head: passages gathered from docstrings and read by the target."""

from __future__ import annotations

import textwrap

import torch

from specdemo.training import eagle
from specdemo.training import passages as text
from specdemo.training.corpus import Corpus
from tests.test_training_pipeline import build as build_answers
from tests.test_training_pipeline import load_tiny

PROSE = ("The reader keeps a window of recent tokens and looks up how the text went on the last time "
         "it saw them. When nothing matches it proposes nothing, and the caller falls back to the model. ")


def write_package(root):
    package = root / "fakepkg"
    (package / "tests").mkdir(parents=True)
    (package / "__init__.py").write_text(f'"""{PROSE * 3}"""\n')
    (package / "core.py").write_text(textwrap.dedent(f'''
        def documented():
            """{PROSE * 2}"""

        def session():
            """
            >>> documented()
            >>> documented()
            >>> documented()
            1
            """

        def terse():
            """Too short to teach anything."""
        '''))
    (package / "tests" / "test_core.py").write_text(f'def test_x():\n    """{PROSE * 3}"""\n')
    return package


def test_docstring_passages_keep_prose_and_skip_tests_sessions_and_one_liners(tmp_path):
    found = text.docstring_passages(write_package(tmp_path), "fakepkg", prefix="fakepkg")
    assert sorted(p.title for p in found) == ["`fakepkg.core.documented`", "`fakepkg`"]
    assert all(p.source == "fakepkg" and PROSE.strip() in p.text for p in found)


def test_long_docstrings_split_at_paragraphs():
    paragraphs = [f"Paragraph {i}. " + PROSE for i in range(6)]
    pieces = text.split_paragraphs("\n\n".join(paragraphs), max_chars=450)
    assert len(pieces) == 6 // 2
    assert all(len(p) <= 450 for p in pieces)
    assert pieces[0].startswith("Paragraph 0.") and "Paragraph 1." in pieces[0]


def test_only_permissive_licences_are_read():
    for licence in ("MIT", "BSD-3-Clause", "Apache-2.0", "PSF-2.0", "BSD License"):
        assert text.is_permissive(licence), licence
    for licence in ("", "GPL-3.0-or-later", "LGPL-2.1 OR MIT", "Proprietary"):
        assert not text.is_permissive(licence), licence


def word_passages(count: int) -> list[text.Passage]:
    # The tiny tokenizer knows only the words w3..wN.
    return [text.Passage("words", f"w{3 + i}", " ".join(f"w{3 + (i * 7 + j) % 60}" for j in range(10 + i)))
            for i in range(count)]


def test_text_corpus_holds_the_targets_hidden_states_and_resumes(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    out = tmp_path / "text"

    def sources():
        return word_passages(10), {"words": "MIT"}

    first = text.build(model, tokenizer, out, sources=sources, passages_per_shard=4, max_shards=1,
                       log=lambda m: None)
    assert first["shards"] == 1 and first["sequences"] == 4
    stamp = Corpus(out).shard_path(0).stat().st_mtime_ns
    second = text.build(model, tokenizer, out, sources=sources, passages_per_shard=4, log=lambda m: None)
    corpus = Corpus(out)
    assert second["shards"] == 3 and second["sequences"] == 10
    assert corpus.shard_path(0).stat().st_mtime_ns == stamp  # kept, not read again

    shard = corpus.load_shard(1)
    for prefix, answer, features, messages in zip(shard["prefixes"], shard["answers"], shard["features"],
                                                   shard["messages"]):
        assert messages[0]["role"] == "user" and messages[1]["content"] in tokenizer.decode(answer)
        with torch.no_grad():
            hidden = model.get_decoder()(input_ids=torch.tensor([prefix + answer])).last_hidden_state[0]
        torch.testing.assert_close(features.float(), hidden[:-1], atol=2e-2, rtol=2e-2)
    sequences = eagle.read_sequences(corpus, read=True)
    assert len(sequences) == 10 and all(s.read for s in sequences)


def test_passages_train_the_head_without_choosing_its_vocabulary_or_validating_it(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    build_answers(model, tokenizer, tmp_path / "answers", shards=3)
    text.build(model, tokenizer, tmp_path / "text", sources=lambda: (word_passages(12), {}), log=lambda m: None)
    answers = eagle.read_sequences(Corpus(tmp_path / "answers"))
    read = eagle.read_sequences(Corpus(tmp_path / "text"), read=True)
    options = dict(subset_size=24, epochs=2, tokens_per_batch=256, validation=0.2, log=lambda m: None)

    alone, alone_info = eagle.train_head(model, answers, **options)
    mixed, mixed_info = eagle.train_head(model, answers, passages=read, **options)
    assert torch.equal(alone.subset, mixed.subset)
    assert mixed_info["validation_sequences"] == alone_info["validation_sequences"]
    assert mixed_info["train_answer_tokens"] == alone_info["train_answer_tokens"]
    assert mixed_info["passage_tokens"] == sum(len(s.ids) - s.answer_start for s in read) > 0
    assert mixed_info["steps"] > alone_info["steps"]


def test_a_head_can_go_on_training_from_where_it_stopped(tmp_path):
    model, tokenizer = load_tiny(tmp_path)
    build_answers(model, tokenizer, tmp_path / "answers", shards=3)
    answers = eagle.read_sequences(Corpus(tmp_path / "answers"))
    first, _ = eagle.train_head(model, answers, subset_size=24, epochs=1, tokens_per_batch=256, validation=0.2,
                                log=lambda m: None)
    before = {k: v.clone() for k, v in first.state_dict().items()}
    second, info = eagle.train_head(model, answers, subset_size=48, epochs=5, tokens_per_batch=256, validation=0.2,
                                    start_from=first, max_steps=3, log=lambda m: None)
    assert info["continued"] and info["steps"] == 3
    assert torch.equal(second.subset, first.subset)  # the subset it was trained over, not a new one
    assert all(torch.equal(v, before[k]) for k, v in first.state_dict().items())  # the start is left as it was
    assert any(not torch.equal(v, before[k]) for k, v in second.state_dict().items() if v.is_floating_point())
