"""The lean Llama forward (engine/targets/lean.py) gives bitwise what transformers' forward gives,
and stands aside wherever transformers' own call is needed."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaForCausalLM, StaticCache

import specdemo
from specdemo.engine.targets import lean
from specdemo.engine.targets.lean import lean_forward_fits, lean_logits
from specdemo.engine.targets.lm import CachedLM, forward_with_features
from tests.tiny import write_model

FEEDS = (7, 1, 3, 1, 2, 5)  # a prefill, AR steps and verifications of several lengths


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lean") / "model"
    write_model(folder, seed=0, hidden=64, layers=3)
    return folder


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_logits_and_cache_equal_transformers_bit_for_bit(model_dir, dtype):
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    reference, ours = DynamicCache(config=model.config), DynamicCache(config=model.config)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for n in FEEDS:
            ids = torch.randint(3, 64, (1, n), generator=generator)
            expected = model(input_ids=ids, cache=reference, use_cache=True, logits_to_keep=min(n, 2)).logits
            logits, features = lean_logits(model, ids, ours, min(n, 2))
            assert features is None
            assert torch.equal(logits, expected), (dtype, n)
    for theirs, mine in zip(reference.layers, ours.layers):
        assert torch.equal(theirs.keys, mine.keys) and torch.equal(theirs.values, mine.values)


@pytest.mark.parametrize("layers", [(), (0, 2), (1, 3), (3,), (0, 1, 2)])
def test_features_equal_transformers_hidden_states(model_dir, layers):
    """Layer indices as transformers numbers its hidden states: 0 the embedding, 3 (the last) the normed
    final state."""
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    reference, ours = DynamicCache(config=model.config), DynamicCache(config=model.config)
    with torch.inference_mode():
        for ids in (torch.tensor([[5, 9, 11, 4]]), torch.tensor([[7, 3, 8]])):
            expected_logits, expected = forward_with_features(model, layers, input_ids=ids, cache=reference,
                                                              use_cache=True)
            logits, features = lean_logits(model, ids, ours, ids.shape[1], hidden_layers=layers)
            assert torch.equal(logits, expected_logits) and torch.equal(features, expected)


def test_a_trees_positions_and_mask_give_what_transformers_gives(model_dir):
    """Four drafts after a context of five, as a tree verification feeds them: two children of the context's
    last token, each with a child of its own, at the depths' positions and under an ancestors' mask."""
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    reference, ours = DynamicCache(config=model.config), DynamicCache(config=model.config)
    context = torch.tensor([[5, 9, 11, 4, 6]])
    tree = torch.tensor([[7, 8, 12, 13]])
    positions = torch.tensor([[5, 5, 6, 6]])
    allowed = torch.ones(4, 9, dtype=torch.bool)
    allowed[:, 5:] = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 1, 0, 1]], dtype=torch.bool)
    with torch.inference_mode():
        for cache in (reference, ours):
            model(input_ids=context, cache=cache, use_cache=True)
        expected = model(input_ids=tree, position_ids=positions, attention_mask=allowed[None, None], cache=reference,
                         use_cache=True, logits_to_keep=4).logits
        logits, _ = lean_logits(model, tree, ours, 4, position_ids=positions, attention_mask=allowed[None, None])
    assert torch.equal(logits, expected)
    for theirs, mine in zip(reference.layers, ours.layers):
        assert torch.equal(theirs.keys, mine.keys)


def test_it_stands_aside_where_transformers_own_call_is_needed(model_dir, monkeypatch):
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    dynamic = DynamicCache(config=model.config)
    assert lean_forward_fits(model, dynamic)
    assert lean_forward_fits(model, StaticCache(config=model.config, max_cache_len=16))
    assert not lean_forward_fits(model, type("OtherCache", (DynamicCache,), {})(config=model.config))
    for module in (model, model.model, model.model.layers[1], model.model.layers[2].self_attn):
        handle = module.register_forward_pre_hook(lambda *args: None)
        assert not lean_forward_fits(model, dynamic), type(module).__name__
        handle.remove()
    handle = model.lm_head.register_forward_hook(lambda *args: None)  # a leaf's hook: called as a module
    assert lean_forward_fits(model, dynamic)
    handle.remove()
    model.train()
    assert not lean_forward_fits(model, dynamic)
    model.eval()
    monkeypatch.setattr(model.config, "_attn_implementation", "eager")  # its causal mask is not sdpa's
    assert not lean_forward_fits(model, dynamic)
    monkeypatch.undo()
    monkeypatch.setenv(lean.SWITCH, "0")
    assert not lean_forward_fits(model, dynamic)


# Each kind of module the lean forward calls itself (an unhooked one's forward directly), with the rows it is fed.
LEAVES_AND_ROWS = {"lm_head": 2, "model.embed_tokens": 3, "model.rotary_emb": 3, "model.norm": 3,
                   "model.layers.0.input_layernorm": 3, "model.layers.0.self_attn.q_proj": 3,
                   "model.layers.0.self_attn.o_proj": 3, "model.layers.0.mlp": 3, "model.layers.0.mlp.up_proj": 3,
                   "model.layers.0.mlp.act_fn": 3, "model.layers.0.post_attention_layernorm": 3}


@pytest.mark.parametrize("name", list(LEAVES_AND_ROWS))
def test_a_hook_on_a_leaf_module_still_fires(model_dir, name):
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    with torch.inference_mode():
        expected = lean_logits(model, torch.tensor([[4, 5, 6]]), DynamicCache(config=model.config), 2)[0]
    rows = []
    handle = model.get_submodule(name).register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[1]))
    with torch.inference_mode():
        hooked = lean_logits(model, torch.tensor([[4, 5, 6]]), DynamicCache(config=model.config), 2)[0]
    handle.remove()
    assert rows == [LEAVES_AND_ROWS[name]]
    assert torch.equal(hooked, expected)


def test_the_engine_feeds_a_dynamic_cache_through_it_and_decodes_what_transformers_forward_decodes(
        tiny_pair, monkeypatch):
    calls = []
    original = lean.lean_logits

    def counted(model, input_ids, cache, *args, **kwargs):
        calls.append(cache)
        return original(model, input_ids, cache, *args, **kwargs)

    import specdemo.engine.targets.lm as lm

    monkeypatch.setattr(lm, "lean_logits", counted)
    runs = {}
    for switch in ("1", "0"):
        monkeypatch.setenv(lean.SWITCH, switch)
        runs[switch] = [specdemo.generate(tiny_pair, "w5 w6 w7 w8", method=method, max_new_tokens=12, seed=3,
                                          temperature=temperature)
                        for method in ("ar", "sd", "egag", "sd-tree") for temperature in (0.0, 1.0)]
        if switch == "1":
            assert calls and all(type(cache) is DynamicCache for cache in calls)
            calls.clear()
    assert not calls
    for lean_run, plain_run in zip(runs["1"], runs["0"]):
        assert lean_run.token_ids == plain_run.token_ids
        assert [(r.drafted, r.accepted) for r in lean_run.rounds] == [(r.drafted, r.accepted) for r in plain_run.rounds]


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_a_cached_lm_feeds_rolls_back_and_scores_trees_as_through_transformers(tiny_pair, cache, monkeypatch):
    """The same calls on a CachedLM with the lean forward and without: every logit and hidden state equal."""
    def session():
        lm = CachedLM(tiny_pair.target, tiny_pair.vocab_size, cache=cache, max_length=48)
        out = []
        with torch.inference_mode():
            lm.prefill([1, 5, 6, 7, 8, 9])
            out.append(lm.logits([1, 5, 6, 7, 8, 9, 10], 1))
            out += [lm.logits([1, 5, 6, 7, 8, 9, 10, 11, 12, 13], 3, n_hidden=3), lm.hidden]
            out.append(lm.logits([1, 5, 6, 7, 8, 9, 10, 14], 1))  # rolled back two, one new
            ancestors = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)  # 20 and 21, then 22 after 20
            out.append(lm.tree_logits([1, 5, 6, 7, 8, 9, 10, 14], torch.tensor([20, 21, 22]), ancestors,
                                      torch.tensor([1, 1, 2]), n_hidden=True))
            out.append(lm.hidden)
        return out

    lean_run = session()
    monkeypatch.setenv(lean.SWITCH, "0")
    for ours, theirs in zip(lean_run, session(), strict=True):
        assert torch.equal(ours, theirs)
