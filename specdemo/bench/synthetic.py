"""Random-weight pairs of realistic sizes (GPT-NeoX or Qwen2 layout), for benchmarking offline.

    python -m specdemo.bench.synthetic --out /tmp/synthetic
    python -m specdemo.bench.synthetic --out /tmp/qwen --target-size qwen2.5-1.5b --draft-size qwen2.5-0.5b
    python -m specdemo bench --target /tmp/synthetic/target --draft /tmp/synthetic/draft --device cuda ...

The default pair has Pythia-1.4B's and Pythia-70M's shapes (vocab 50304); the qwen2.5-*
sizes have Qwen2.5's (grouped-query attention with 2 KV heads, tied embeddings, vocab
151936) in the Llama layout: transformers forces Qwen2's own tokenizer class on a qwen2
config, which cannot read the word-level tokenizer below, and the layouts differ only by
Qwen2's q/k/v biases (well under 0.1 % of the bytes a token reads). Random weights
agree on almost nothing, so acceptance is about zero: what such a run measures is each
method's overhead at a realistic model size, which is the point.

The tokenizer is word-level: the words of the prompt suite get their own ids (so prompt
lookup finds real repeats), every other id decodes to a placeholder word.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..engine.pair import DRAFT_ROLE, TARGET_ROLE

# name → (family, hidden, layers, heads, KV heads, intermediate): the Pythia and Qwen2.5 families' shapes.
SIZES = {
    "2.8b": ("pythia", 2560, 32, 32, 32, 10240),
    "1.4b": ("pythia", 2048, 24, 16, 16, 8192),
    "410m": ("pythia", 1024, 24, 16, 16, 4096),
    "160m": ("pythia", 768, 12, 12, 12, 3072),
    "70m": ("pythia", 512, 6, 8, 8, 2048),
    "tiny": ("pythia", 64, 2, 4, 4, 256),
    # The narrowest shape found whose bfloat16 CPU kernels break near-ties as a GPU's do: a static
    # cache or SD's multi-row verification leaves AR's greedy text within a few hundred tokens.
    "tiny-256": ("pythia", 256, 2, 4, 4, 1024),
    "qwen2.5-1.5b": ("qwen2", 1536, 28, 12, 2, 8960),
    "qwen2.5-0.5b": ("qwen2", 896, 24, 14, 2, 4864),
    "qwen2.5-tiny": ("qwen2", 64, 2, 4, 2, 256),
}
VOCABS = {"pythia": 50304, "qwen2": 151936}  # each family's (padded) vocabulary
EOS = 0  # Pythia's <|endoftext|> is id 0
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def write_tokenizer(folder: Path, vocab: int, suite: Path | None) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = {"<|endoftext|>": EOS, "<unk>": 1}
    words: list[str] = []
    if suite is not None and suite.is_file():
        for line in suite.read_text(encoding="utf-8").splitlines():
            if line.strip():
                words.extend(json.loads(line).get("prompt", "").split())
    for word in dict.fromkeys(words):
        if len(tokens) >= vocab:
            break
        tokens.setdefault(word, len(tokens))
    filler = 0
    while len(tokens) < vocab:
        tokens.setdefault(f"w{filler}", len(tokens))
        filler += 1
    tok = Tokenizer(models.WordLevel(vocab=tokens, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def write_model(folder: Path, size: str, vocab: int, seed: int, dtype: torch.dtype, device: str) -> None:
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    family, hidden, layers, heads, kv_heads, intermediate = SIZES[size]
    if family == "qwen2":
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=kv_heads, intermediate_size=intermediate, max_position_embeddings=32768,
            rms_norm_eps=1e-6, bos_token_id=EOS, eos_token_id=EOS, tie_word_embeddings=True,
        )
        model_class = LlamaForCausalLM
    else:
        config = GPTNeoXConfig(
            vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            intermediate_size=intermediate, rotary_pct=0.25, max_position_embeddings=2048,
            use_parallel_residual=True, bos_token_id=EOS, eos_token_id=EOS, tie_word_embeddings=False,
        )
        model_class = GPTNeoXForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(config)
    model.to(dtype).save_pretrained(folder)
    del model


def build(out: str | Path, target_size: str = "1.4b", draft_size: str = "70m", vocab: int | None = None,
          dtype: str = "bfloat16", device: str = "cpu", suite: str | Path | None = None) -> tuple[Path, Path]:
    """Write out/target and out/draft (each with the tokenizer) and return their paths.
    vocab: both models' vocabulary (default: the target family's)."""
    from .suite import DEFAULT_SUITE
    from ..models.loading import resolve_dtype

    for size in (target_size, draft_size):
        if size not in SIZES:
            raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    if vocab is None:
        vocab = VOCABS[SIZES[target_size][0]]
    torch_dtype = resolve_dtype(dtype, device)
    suite_path = Path(suite) if suite else DEFAULT_SUITE
    out = Path(out)
    folders = (out / TARGET_ROLE, out / DRAFT_ROLE)
    for folder, size, seed in zip(folders, (target_size, draft_size), (0, 1)):
        folder.mkdir(parents=True, exist_ok=True)
        write_model(folder, size, vocab, seed, torch_dtype, device)
        write_tokenizer(folder, vocab, suite_path)
    return folders


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdemo.bench.synthetic", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", required=True, help="folder to write target/ and draft/ into")
    parser.add_argument("--target-size", default="1.4b", choices=list(SIZES), help="shape of the target")
    parser.add_argument("--draft-size", default="70m", choices=list(SIZES), help="shape of the draft")
    parser.add_argument("--vocab", type=int, default=None,
                        help="vocabulary size of both (default: the target family's: 50304 Pythia, 151936 Qwen2.5)")
    parser.add_argument("--dtype", default="bfloat16", help="dtype the weights are saved in")
    parser.add_argument("--device", default="cpu", help="where to initialise the weights (cuda is much faster)")
    parser.add_argument("--suite", default=None, help="prompt suite whose words get their own token ids")
    args = parser.parse_args(argv)
    try:
        target, draft = build(args.out, args.target_size, args.draft_size, args.vocab, args.dtype, args.device,
                              args.suite)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {target} and {draft}\nrun:  python -m specdemo bench --target {target} --draft {draft} "
          "--device cuda --max-new-tokens 128 --repeats 3 --csv results/synthetic.csv --report results/synthetic.html")
    return 0


if __name__ == "__main__": sys.exit(main())
