"""Builders for tiny random model pairs that go through the real loading code."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from tokenizers import Tokenizer, models, pre_tokenizers, decoders

import specdemo

VOCAB = 64
EOS = 2


def write_tokenizer(folder: Path, vocab: int = VOCAB) -> None:
    """A word-level tokenizer over 'w0'..'wN' plus specials, so any id decodes to text."""
    tokens = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, vocab):
        tokens[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=tokens, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}<s> {{ m['content'] }} </s>{% endfor %}"
    fast.save_pretrained(folder)


def write_model(folder: Path, seed: int, hidden: int, layers: int, vocab: int = VOCAB,
                eos: int = EOS, dtype=torch.float64, like: Path | None = None, noise: float = 0.0,
                head_scale: float = 8.0) -> None:
    """A random Llama; with `like`, a noisy copy of that model (a drafter that agrees often, not always)."""
    torch.manual_seed(seed)
    if like is not None:
        model = LlamaForCausalLM.from_pretrained(like, dtype=torch.float64)
        with torch.no_grad():
            for weight in model.parameters():
                weight.add_(noise * weight.std() * torch.randn_like(weight))
        model.to(dtype).save_pretrained(folder)
        return
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=eos, tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Larger output weights give peaked, diverse next-token distributions, like a trained LM.
        model.lm_head.weight.mul_(head_scale)
    model.to(dtype).save_pretrained(folder)


def build_tiny_pair(root: Path, dtype: str = "float64", draft_seed: int = 1, draft_noise: float = 0.5,
                    vocab: int = VOCAB, head_scale: float = 8.0, hidden: int = 64, layers: int = 2):
    target_dir, draft_dir = root / "target", root / "draft"
    if not target_dir.exists():
        write_model(target_dir, seed=0, hidden=hidden, layers=layers, vocab=vocab, head_scale=head_scale)
        write_tokenizer(target_dir, vocab)
        write_model(draft_dir, seed=draft_seed, hidden=hidden, layers=layers, like=target_dir, noise=draft_noise)
        write_tokenizer(draft_dir, vocab)
    return specdemo.load_pair(str(target_dir), str(draft_dir), device="cpu", dtype=dtype)


def write_tiny_head(folder: Path, target_dir: Path, subset: list[int] | None = None, seed: int = 0) -> None:
    """A feature-level draft head for the tiny target, saved as a folder `load_pair` reads as a draft."""
    from transformers import LlamaForCausalLM

    from specdemo.engine.feature_head import FeatureHead, HeadConfig

    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float64)
    subset = sorted(subset if subset is not None else list(range(0, VOCAB, 2)) + [3, 5, 7, 9])
    torch.manual_seed(seed)
    head = FeatureHead(HeadConfig.for_target(target.config, len(subset))).to(torch.float64)
    head.subset.copy_(torch.tensor(subset))
    head.init_from_target(target)
    head.bind(target).eval()
    head.save(folder, dtype=torch.float64)
