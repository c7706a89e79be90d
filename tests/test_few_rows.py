"""specdemo.engine.targets.few_rows: verification's few-row products, computed in another order, give
linear's results, and a pair loaded on the CPU uses them in every layer large enough to gain from them."""

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import specdemo
from specdemo.engine.targets.few_rows import (FEW_ROW_MIN_WEIGHTS, FEW_ROWS, SWITCH, FewRowLinear,
                                              use_few_row_products)
from tests.tiny import build_tiny_pair


# Wide enough that its linear layers, but not all of them, are switched (k and v: 256×128 stay plain).
WIDE = 256


def _switched_copy(layer: nn.Linear) -> nn.Linear:
    """A copy of `layer` computing its products as FewRowLinear does, whatever its size."""
    copy = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, dtype=layer.weight.dtype)
    copy.load_state_dict(layer.state_dict())
    copy.__class__ = FewRowLinear
    return copy


def _switched_exactly_the_large_layers(model: nn.Module) -> None:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert {type(m) for m in linears} == {nn.Linear, FewRowLinear}, "the model has layers of both sizes"
    for layer in linears:
        large = layer.weight.numel() >= FEW_ROW_MIN_WEIGHTS
        assert (type(layer) is FewRowLinear) == large, (tuple(layer.weight.shape), type(layer).__name__)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, FEW_ROWS, FEW_ROWS + 1, 40])
def test_products_equal_linears_for_any_number_of_rows(rows, bias):
    torch.manual_seed(rows)
    plain = nn.Linear(24, 56, bias=bias, dtype=torch.float64)
    switched = _switched_copy(plain)
    assert type(switched) is FewRowLinear
    for shape in [(rows, 24), (1, rows, 24)]:
        x = torch.randn(shape, dtype=torch.float64)
        out = switched(x)
        assert out.shape == (*shape[:-1], 56) and out.is_contiguous()
        torch.testing.assert_close(out, plain(x), rtol=1e-12, atol=1e-12)


def test_float32_products_agree_to_rounding():
    torch.manual_seed(0)
    plain = nn.Linear(576, 1536, bias=False)
    switched = _switched_copy(plain)
    x = torch.randn(1, 5, 576)
    torch.testing.assert_close(switched(x), plain(x), rtol=1e-5, atol=1e-5)


def test_switching_keeps_parameters_tied_weights_and_state():
    config = LlamaConfig(vocab_size=WIDE, hidden_size=WIDE, intermediate_size=2 * WIDE, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    large = sum(type(m) is nn.Linear and m.weight.numel() >= FEW_ROW_MIN_WEIGHTS for m in model.modules())

    assert use_few_row_products(model) == large > 0
    _switched_exactly_the_large_layers(model)
    assert type(model.lm_head) is FewRowLinear
    assert model.lm_head.weight is model.get_input_embeddings().weight
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[name], before[name]) for name in before)


def test_layers_too_small_to_gain_keep_linear():
    """A verification's 2-6 rows through a small weight are faster as `linear` computes them."""
    small = nn.Linear(FEW_ROW_MIN_WEIGHTS // 512, 511)
    large = nn.Linear(FEW_ROW_MIN_WEIGHTS // 512, 512)
    assert use_few_row_products(small) == 0 and type(small) is nn.Linear
    assert use_few_row_products(large) == 1 and type(large) is FewRowLinear


def test_a_pair_loaded_on_the_cpu_uses_them_in_target_and_draft(tmp_path):
    pair = build_tiny_pair(tmp_path, hidden=WIDE, layers=1)
    for model in (pair.target, pair.draft):
        _switched_exactly_the_large_layers(model)


def test_the_switch_turns_them_off(tmp_path, monkeypatch):
    build_tiny_pair(tmp_path, hidden=WIDE, layers=1)
    monkeypatch.setenv(SWITCH, "0")
    pair = specdemo.load_pair(str(tmp_path / "target"), str(tmp_path / "draft"), device="cpu", dtype="float64",
                              runtime="torch")
    assert not any(isinstance(m, FewRowLinear) for m in pair.target.modules())
    assert not any(isinstance(m, FewRowLinear) for m in pair.draft.modules())


def test_greedy_decoding_is_unchanged_by_them(tmp_path, monkeypatch):
    """Verification (several rows) now runs the switched products, AR (one row) does not:
    greedy SD still returns AR's tokens, and the same tokens as with the products off."""
    switched = build_tiny_pair(tmp_path, dtype="float32", hidden=WIDE, layers=1)
    assert any(isinstance(m, FewRowLinear) for m in switched.target.modules())
    monkeypatch.setenv(SWITCH, "0")
    plain = specdemo.load_pair(str(tmp_path / "target"), str(tmp_path / "draft"), device="cpu", dtype="float32",
                               runtime="torch")
    prompt = "w5 w9 w11 w7"
    ar = specdemo.generate(plain, prompt, "ar", max_new_tokens=40, chat=False).token_ids
    for method in ("sd", "egag"):
        assert specdemo.generate(switched, prompt, method, max_new_tokens=40, chat=False, gamma=4).token_ids == ar
        assert specdemo.generate(plain, prompt, method, max_new_tokens=40, chat=False, gamma=4).token_ids == ar


def test_the_default_draft_lengths_verify_on_the_few_row_products():
    from specdemo.engine.params import PARAMS

    for name in ("gamma", "gamma_max"):
        assert 2 <= PARAMS[name].default + 1 <= FEW_ROWS


def test_row_products_equal_the_layer_and_follow_a_weight_written_in_place_but_not_into_a_copy():
    """RowProducts multiplies from a kept transposed copy of the weight: equal to the layer's own product, made
    again after an in-place write (an optimiser's step), and not carried into a deep copy of its owner."""
    import copy

    from specdemo.engine.targets.few_rows import RowProducts

    products = RowProducts()
    layer = nn.Linear(4, 3, bias=True).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    torch.testing.assert_close(products(layer, x), layer(x))
    with torch.no_grad():
        layer.weight.add_(1.0)
    torch.testing.assert_close(products(layer, x), layer(x))
    owner = nn.Module()
    owner.layer, owner.products = layer, products
    copied = copy.deepcopy(owner)
    assert copied.products is not products and copied.products(copied.layer, x).shape == (2, 3)
    torch.testing.assert_close(copied.products(copied.layer, x), layer(x))
    assert len(copied.products._kept) == 1  # its own layer only
