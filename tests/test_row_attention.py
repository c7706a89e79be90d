"""Row-by-row attention: with an int8 target, and with a bfloat16 or float16 target on the CPU where
SPECDEMO_ROW_EXACT_HALF=1 asks for it, every row of a verification forward (a chain or a tree of
drafts, on a dynamic or a static cache) equals AR's one-row step bit for bit."""

from __future__ import annotations

import pytest
import torch

import specdemo
from specdemo.engine.targets.lm import CachedLM
from specdemo.engine.targets.row_attention import MARK, attend_row_by_row
from tests.tiny import build_tiny_pair

CONTEXT = [3, 9, 4, 11, 5, 3, 9, 4, 17, 2, 8]
DRAFTS = [6, 12, 7, 30, 21]


@pytest.fixture(scope="module", params=["int8", "bfloat16", "float16"])
def row_exact_target(request, tmp_path_factory):
    """The tiny target at a precision whose verification is made row-exact on the CPU."""
    root = tmp_path_factory.mktemp("row-attention")
    build_tiny_pair(root, dtype="float32", hidden=64, layers=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECDEMO_ROW_EXACT_HALF", "1")
        pair = specdemo.load_pair(str(root / "target"), str(root / "draft"), device="cpu", target_dtype=request.param)
        assert pair.exactness == "bit-exact"
    assert all(getattr(m, MARK, False) for m in pair.target.modules() if type(m).__name__.endswith("Attention"))
    return pair.target


def one_row_steps(model, ids: list[int], cache: str = "dynamic") -> torch.Tensor:
    """AR's logits: each position fed alone after the context's prefill."""
    lm = CachedLM(model, cache=cache, max_length=64)
    lm.prefill(CONTEXT[:-1])
    with torch.inference_mode():
        return torch.stack([lm.logits(CONTEXT + ids[:i], 1)[0] for i in range(len(ids) + 1)])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_chain_verification_equals_the_one_row_steps_bit_for_bit(row_exact_target, cache):
    lm = CachedLM(row_exact_target, cache=cache, max_length=64)
    lm.prefill(CONTEXT[:-1])
    with torch.inference_mode():
        verified = lm.logits(CONTEXT + DRAFTS, len(DRAFTS) + 1)
    assert torch.equal(verified, one_row_steps(row_exact_target, DRAFTS, cache))


def test_each_path_of_a_tree_verification_equals_the_one_row_steps_bit_for_bit(row_exact_target):
    # Rows: 0 ← root's children 6 and 12; 6 → 7 → 30; 12 → 21.
    tokens = torch.tensor([6, 12, 7, 21, 30])
    parents = [-1, -1, 0, 1, 2]
    ancestors = torch.eye(5, dtype=torch.bool)
    for row, parent in enumerate(parents):
        if parent >= 0:
            ancestors[row] |= ancestors[parent]
    depths = ancestors.sum(dim=1)
    lm = CachedLM(row_exact_target)
    lm.prefill(CONTEXT[:-1])
    with torch.inference_mode():
        verified = lm.tree_logits(CONTEXT, tokens, ancestors, depths)
    for path_rows in ([0, 2, 4], [1, 3]):
        path = one_row_steps(row_exact_target, tokens[path_rows].tolist())
        assert torch.equal(verified[[0] + [r + 1 for r in path_rows]], path), path_rows


def test_a_float_model_is_left_to_sdpa_and_a_non_sdpa_model_is_refused(tmp_path):
    from transformers import AutoModelForCausalLM

    build_tiny_pair(tmp_path, dtype="float32")
    for dtype in ("float32", "bfloat16"):  # bfloat16 without SPECDEMO_ROW_EXACT_HALF
        float_target = specdemo.load_pair(str(tmp_path / "target"), device="cpu", target_dtype=dtype).target
        assert not any(getattr(m, MARK, False) for m in float_target.modules()), dtype
    eager = AutoModelForCausalLM.from_pretrained(tmp_path / "target", attn_implementation="eager")
    with pytest.raises(ValueError, match="wraps sdpa attention; this model uses 'eager'"):
        attend_row_by_row(eager)
