"""Builders for tiny random model pairs that go through the real loading code."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (AutoModelForSeq2SeqLM, BartConfig, BartForConditionalGeneration, LlamaConfig,
                          LlamaForCausalLM, PreTrainedTokenizerFast, T5Config, T5ForConditionalGeneration)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

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


def byte_level_tokenizer(corpus: list[str], merges: int = 40) -> PreTrainedTokenizerFast:
    """A byte-level BPE like GPT-2's, trained on `corpus`, without a chat template: the 256 byte
    tokens, `merges` merged ones and the EOS '</s>'. Few merges keep the characters the corpus
    lacks split into their UTF-8 bytes, one token each."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=256 + merges + 1, special_tokens=["</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


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
                    vocab: int = VOCAB, head_scale: float = 8.0, hidden: int = 64, layers: int = 2,
                    runtime: str = "torch"):
    """A tiny Llama target and a noisy copy as its draft, saved and loaded back through load_pair; on the
    torch target unless a test about the runtime asks for another (tests/conftest.py)."""
    target_dir, draft_dir = root / "target", root / "draft"
    if not target_dir.exists():
        write_model(target_dir, seed=0, hidden=hidden, layers=layers, vocab=vocab, head_scale=head_scale)
        write_tokenizer(target_dir, vocab)
        write_model(draft_dir, seed=draft_seed, hidden=hidden, layers=layers, like=target_dir, noise=draft_noise)
        write_tokenizer(draft_dir, vocab)
    return specdemo.load_pair(str(target_dir), str(draft_dir), device="cpu", dtype=dtype, runtime=runtime)


def write_tiny_head(folder: Path, target_dir: Path, subset: list[int] | None = None, seed: int = 0) -> None:
    """A feature-level draft head for the tiny target, saved as a folder `load_pair` reads as a draft."""
    from transformers import LlamaForCausalLM

    from specdemo.engine.drafters.feature_head import FeatureHead, HeadConfig

    target = LlamaForCausalLM.from_pretrained(target_dir, dtype=torch.float64)
    subset = sorted(subset if subset is not None else list(range(0, VOCAB, 2)) + [3, 5, 7, 9])
    torch.manual_seed(seed)
    head = FeatureHead(HeadConfig.for_target(target.config, len(subset))).to(torch.float64)
    head.subset.copy_(torch.tensor(subset))
    head.init_from_target(target)
    head.bind(target).eval()
    head.save(folder, dtype=torch.float64)


# Encoder-decoder pairs: T5 and BART configs, sharing one tokenizer with T5's specials
# (pad 0 is the decoder start, EOS 1), so both families decode with the same ids.
SEQ2SEQ_PAD, SEQ2SEQ_EOS = 0, 1


def write_seq2seq_tokenizer(folder: Path, vocab: int = VOCAB) -> None:
    """Word-level over 'w3'..'wN'; the encoder's input ends with </s>, like T5's and BART's tokenizers."""
    tokens = {"<pad>": SEQ2SEQ_PAD, "</s>": SEQ2SEQ_EOS, "<unk>": 2}
    for i in range(3, vocab):
        tokens[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=tokens, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", SEQ2SEQ_EOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>")
    fast.save_pretrained(folder)


def write_seq2seq_model(folder: Path, family: str, seed: int, vocab: int = VOCAB, hidden: int = 32,
                        layers: int = 2, dtype=torch.float64, like: Path | None = None, noise: float = 0.0,
                        gain: float = 2.0) -> None:
    """A random T5 or BART ("t5" | "bart"); with `like`, a noisy copy of that model."""
    torch.manual_seed(seed)
    if like is not None:
        model = AutoModelForSeq2SeqLM.from_pretrained(like, dtype=torch.float64)
        with torch.no_grad():
            for weight in model.parameters():
                weight.add_(noise * weight.std() * torch.randn_like(weight))
        model.to(dtype).save_pretrained(folder)
        return
    specials = dict(pad_token_id=SEQ2SEQ_PAD, eos_token_id=SEQ2SEQ_EOS, decoder_start_token_id=SEQ2SEQ_PAD)
    if family == "t5":
        config = T5Config(vocab_size=vocab, d_model=hidden, d_kv=hidden // 4, d_ff=hidden * 2, num_layers=layers,
                          num_heads=4, **specials)
        model = T5ForConditionalGeneration(config)
    elif family == "bart":
        config = BartConfig(vocab_size=vocab, d_model=hidden, encoder_layers=layers, decoder_layers=layers,
                            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=hidden * 2,
                            decoder_ffn_dim=hidden * 2, max_position_embeddings=256, bos_token_id=SEQ2SEQ_PAD,
                            forced_eos_token_id=None, tie_word_embeddings=False, **specials)
        model = BartForConditionalGeneration(config)
    else:
        raise ValueError(f"family: {family!r} is not t5 or bart")
    with torch.no_grad():
        # The default initialisation leaves the token's own embedding dominant, so a random model
        # repeats its input; wider layers make the output depend on the source and the prefix.
        for name, weight in model.named_parameters():
            if weight.dim() == 2 and "relative_attention_bias" not in name:
                embedding = weight.shape[0] == vocab or "embed_positions" in name
                weight.normal_(0, 1.0 if embedding else gain * weight.shape[1] ** -0.5)
    model.to(dtype).save_pretrained(folder)


def build_tiny_seq2seq_pair(root: Path, family: str = "t5", dtype: str = "float64", draft_noise: float = 0.3,
                            vocab: int = VOCAB, hidden: int = 32, layers: int = 2, runtime: str = "torch"):
    """A tiny encoder-decoder target and a noisy copy as its draft, saved and loaded back through load_pair
    (on the torch target unless asked otherwise)."""
    target_dir, draft_dir = root / "target", root / "draft"
    if not target_dir.exists():
        write_seq2seq_model(target_dir, family, seed=0, vocab=vocab, hidden=hidden, layers=layers)
        write_seq2seq_tokenizer(target_dir, vocab)
        write_seq2seq_model(draft_dir, family, seed=1, like=target_dir, noise=draft_noise)
        write_seq2seq_tokenizer(draft_dir, vocab)
    return specdemo.load_pair(str(target_dir), str(draft_dir), device="cpu", dtype=dtype, runtime=runtime)


@contextmanager
def verification_swaps_the_top_two(pair):
    """While the block runs, every target forward that scores more than one position (a verification of
    drafts) swaps its two best logits at each position; the one-position step (AR's) is untouched. A planted
    stand-in for a verification that rounds unlike AR's step: greedy SD leaves AR's tokens at its first
    verified token, by AR's own top-1 minus top-2 margin there."""
    def swap(module, inputs, output):
        if output.dim() < 2 or output.shape[-2] < 2:
            return output
        top = output.topk(2, dim=-1)
        swapped = output.clone()
        swapped.scatter_(-1, top.indices[..., :1], top.values[..., 1:])
        swapped.scatter_(-1, top.indices[..., 1:], top.values[..., :1])
        return swapped

    handle = pair.target.get_output_embeddings().register_forward_hook(swap)
    try:
        yield
    finally:
        handle.remove()


class ARRuns:
    """AR's greedy runs, each decoded once: the reference a greedy grid holds every method to (AR does not
    depend on the draft). One per module. A run is keyed by the models it ran on (the torch target and,
    where there is one, the runtime's), the pair's end tokens, the prompt and the settings."""

    def __init__(self) -> None:
        self._runs: dict[tuple, tuple] = {}

    def __call__(self, pair, prompt, **settings) -> specdemo.GenerationResult:
        models = (pair.target, pair.target_runtime)
        key = (*map(id, models), pair.eos_ids, repr(prompt), repr(sorted(settings.items())))
        if key not in self._runs:
            # The models are held beside the run, so that no other model can take their ids.
            self._runs[key] = (models, specdemo.generate(pair, prompt, method="ar", **settings))
        return self._runs[key][1]
