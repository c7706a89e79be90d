"""specdemo.roofline: bytes per token and the bandwidth bound, checked by hand."""

import pytest
import torch
from transformers import GPTNeoXConfig, LlamaConfig, LlamaForCausalLM

from specdemo.bench.measure.roofline import BANDWIDTHS, bandwidth_for, kv_bytes_per_token, parameter_bytes, roofline


def test_pythia_1_4b_shaped_bound_by_hand():
    # Pythia-1.4B: 24 layers, 16 heads of 128 (no GQA); bfloat16 → 2 bytes.
    config = GPTNeoXConfig(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16)
    kv = kv_bytes_per_token(config, 2)
    assert kv == 24 * 2 * 16 * 128 * 2 == 196_608
    # 1.414e9 parameters × 2 bytes, 512 positions of context, H100 SXM.
    bound = roofline(2_828_000_000, kv, 512, "H100 SXM")
    assert bound.bytes_per_token == 2_828_000_000 + 196_608 * 512 == 2_928_663_296
    assert bound.tokens_per_s == pytest.approx(3.35e12 / 2_928_663_296)  # ≈ 1143.9 tokens/s
    assert bound.tokens_per_s == pytest.approx(1143.87, abs=0.01)
    assert bound.fraction(571.935) == pytest.approx(0.5, rel=1e-4)


def test_gqa_config_and_explicit_bandwidth():
    # Qwen2.5-1.5B-like: 28 layers, 2 KV heads of 128 → 28·2·2·128·2 = 28 672 bytes per position in bf16.
    config = LlamaConfig(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2)
    assert kv_bytes_per_token(config, 2) == 28_672
    bound = roofline(3_000_000_000, 28_672, 1000, 2.0e12)
    assert bound.bytes_per_token == 3_028_672_000
    assert bound.tokens_per_s == pytest.approx(660.35, abs=0.01)


def test_parameter_bytes_counts_tied_weights_once():
    config = LlamaConfig(vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(torch.float16)
    untied = sum(p.numel() for p in model.parameters())  # parameters() already skips the tied copy
    assert parameter_bytes(model) == untied * 2
    bound = roofline(parameter_bytes(model), kv_bytes_per_token(model.config, 2), 3, 1e9)
    # 1 layer · 2 · 1 KV head · head_dim 4 · 2 bytes = 16 bytes per position.
    assert bound.kv_bytes_per_token == 16
    assert bound.bytes_per_token == untied * 2 + 48


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"), ("NVIDIA A100-PCIE-40GB", "A100 40GB"), ("NVIDIA L4", "L4"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("NVIDIA A10G", "A10G"), ("Tesla T4", "T4"),
])
def test_device_names_map_to_the_nominal_table(name, expected):
    assert bandwidth_for(name) == BANDWIDTHS[expected]


def test_unknown_devices_and_bad_numbers_are_refused():
    assert bandwidth_for("Some Accelerator 9000") is None
    with pytest.raises(ValueError, match="bandwidth"):
        roofline(1, 1, 1, "Some Accelerator 9000")
    with pytest.raises(ValueError, match="bandwidth"):
        roofline(1, 1, 1, 0.0)
