"""The target on ONNX Runtime (runtime="onnx"): every chain method returns the runtime's own AR
tokens, a rollback forgets exactly the rejected positions, and what it cannot verify is refused.

A tiny random Llama goes through the same export as the embedded target (onnxruntime-genai's
model builder, once per module, into a temporary cache).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

import specdemo
from specdemo.engine.sampling import SamplingConfig, probabilities
from specdemo.models.errors import ModelLoadError
from specdemo.engine.runtimes.onnx_export import check_exportable, export_folder, is_exported, onnx_runtime_missing
from tests.chi2 import pooled_chisquare
from tests.tiny import ARRuns, write_model, write_tiny_head, write_tokenizer

pytestmark = [pytest.mark.runtime,
              pytest.mark.skipif(onnx_runtime_missing() is not None, reason=str(onnx_runtime_missing()))]

# Not 64, tiny.py's default: the builder takes the first layer as wide as the vocabulary for the
# LM head, and with 64 a projection of this model is (export_folder's check refuses that case).
VOCAB = 80
PROMPTS = [[1, 5, 9, 14, 5, 9, 14, 5], [1, 30, 31, 32, 33, 40, 41, 42, 43, 30, 31]]


@pytest.fixture(scope="module")
def onnx_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx")
    target, draft, head = root / "target", root / "draft", root / "head"
    write_model(target, seed=0, hidden=64, layers=2, vocab=VOCAB)
    write_tokenizer(target, VOCAB)
    write_model(draft, seed=1, hidden=64, layers=2, vocab=VOCAB, like=target, noise=0.5)
    write_tokenizer(draft, VOCAB)
    write_tiny_head(head, target)
    with pytest.MonkeyPatch.context() as patch:  # the exports land beside the models, for this module only
        patch.setenv("SPECDEMO_CACHE", str(root / "cache"))
        yield target, draft, head


@pytest.fixture(scope="module")
def lm_pair(onnx_folders):
    target, draft, _ = onnx_folders
    return specdemo.load_pair(str(target), str(draft), device="cpu", dtype="float32", runtime="onnx")


@pytest.fixture(scope="module")
def head_pair(onnx_folders):
    target, _, head = onnx_folders
    return specdemo.load_pair(str(target), str(head), device="cpu", dtype="float32", runtime="onnx")


def greedy(pair, prompt, method, **params):
    return specdemo.generate(pair, prompt, method=method, max_new_tokens=40, temperature=0.0, seed=0, **params)


_ar_runs = ARRuns()


def ar_run(pair, prompt):
    """`greedy`'s AR run, decoded once per target, runtime and prompt: the reference the method grids below hold
    every method and drafter to."""
    return _ar_runs(pair, prompt, max_new_tokens=40, temperature=0.0, seed=0)


def test_the_export_is_written_once_and_runs_the_target(onnx_folders, lm_pair):
    target, _, _ = onnx_folders
    assert is_exported(export_folder(target, "float32"))
    result = greedy(lm_pair, PROMPTS[0], "ar")
    assert result.runtime == "onnx fp32" and result.stats["runtime"] == "onnx fp32"
    torch_pair = specdemo.load_pair(str(target), device="cpu", dtype="float32", runtime="torch")
    on_torch = greedy(torch_pair, PROMPTS[0], "ar")
    assert on_torch.stats["runtime"] == "torch"
    # The same weights: at float32 the two runtimes agree on this peaked random model's tokens.
    assert result.token_ids == on_torch.token_ids


def test_the_runtimes_cache_is_counted_as_the_buffer_it_holds(lm_pair):
    """The export shares one key/value buffer of max_length positions between past and present, allocated
    whole: the runtime holds layers × 2 × kv heads × head dim × max_length × 4 bytes (float32) from its first
    forward on, and that is its peak, whatever the number of positions filled."""
    config = lm_pair.target.config
    per_position = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4
    lm = lm_pair.target_runtime.cached_lm(lm_pair.target, lm_pair.vocab_size, max_length=50)
    lm.prefill(PROMPTS[0])
    held = np.asarray(lm.generator.get_output("present.1.value"))  # the last layer's values, as the runtime holds them
    assert held.shape == (1, config.num_key_value_heads, 50, config.head_dim) and held.dtype == np.float32
    assert lm.kv_bytes_peak == per_position * 50
    lm.logits(PROMPTS[0] + [3, 4, 5], 1)
    assert lm.kv_bytes_peak == per_position * 50
    lm.close()


def test_the_runtimes_kv_bytes_reach_the_stats_as_torchs_static_cache_of_the_same_length(onnx_folders, lm_pair):
    """target_kv_bytes_peak on the runtime is its whole buffer, the same bytes as torch's static cache sized
    for the same run; a draft LM on the runtime beside it reports its own buffer as draft_kv_bytes_peak."""
    target, _, _ = onnx_folders
    torch_pair = specdemo.load_pair(str(target), device="cpu", dtype="float32", runtime="torch")
    config = lm_pair.target.config
    per_position = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 4
    on_runtime = greedy(lm_pair, PROMPTS[0], "ar")
    static = specdemo.generate(torch_pair, PROMPTS[0], method="ar", max_new_tokens=40, temperature=0.0, seed=0,
                               cache="static")
    peak = on_runtime.stats["target_kv_bytes_peak"]
    assert peak == static.stats["target_kv_bytes_peak"]
    assert peak % per_position == 0 and peak // per_position >= len(PROMPTS[0]) + 40
    sd = greedy(lm_pair, PROMPTS[0], "sd", gamma=3)
    assert lm_pair.draft_runtime is not None
    draft = lm_pair.draft.config  # shaped as the target, so its buffer of the same length takes the same bytes
    assert (draft.num_hidden_layers, draft.num_key_value_heads, draft.head_dim) == (
        config.num_hidden_layers, config.num_key_value_heads, config.head_dim)
    assert sd.stats["draft_kv_bytes_peak"] == sd.stats["target_kv_bytes_peak"] > 0
    # The comparison CSV's columns and the Playground's table carry them.
    from specdemo.app import viz
    from specdemo.bench.measure.tables import summary_frame

    summary = summary_frame([on_runtime, sd], pair=lm_pair)
    assert summary.target_kv_bytes_peak.tolist() == [peak, peak]
    shown = viz.display_table(summary).set_index("method")["KV cache peak (target / draft)"]
    assert shown["AR"] == viz.byte_size(peak) and shown["SD"] == f"{viz.byte_size(peak)} / {viz.byte_size(peak)}"



def test_the_benchmarks_rows_and_summary_carry_the_runtimes_kv_bytes(lm_pair):
    """The benchmark's CSV and its summary on the default path: every run of ours names its target's KV bytes,
    and SD its draft's, nonzero."""
    from specdemo.bench import run_benchmark
    from specdemo.bench.suite import SuitePrompt

    result = run_benchmark(lm_pair, [SuitePrompt("p", "chat", "w5 w9 w13 w17")], ["ar", "sd"], repeats=1, warmup=False,
                           max_new_tokens=8, temperature=0.0, chat=False)
    rows = result.rows.set_index("method")
    assert (rows.target_kv_bytes_peak > 0).all() and rows.loc["sd", "draft_kv_bytes_peak"] > 0
    summary = result.summary[result.summary.category == "all"].set_index("method")
    assert summary.loc["ar", "target_kv_bytes_peak"] == rows.loc["ar", "target_kv_bytes_peak"]
    assert summary.loc["sd", "draft_kv_bytes_peak"] == rows.loc["sd", "draft_kv_bytes_peak"]


def test_a_feature_head_on_the_runtime_reports_its_own_cache(head_pair):
    """The head's keys and values stay in its own cache beside the runtime's step: 2 × its kv heads × the
    positions allocated (the prompt and 64 more, doubled when a run needs more) × head dim × 4 bytes."""
    head = head_pair.draft.config
    result = greedy(head_pair, PROMPTS[0], "sd", gamma=3)
    assert result.stats["target_kv_bytes_peak"] > 0
    assert result.stats["draft_kv_bytes_peak"] == 2 * head.num_kv_heads * (len(PROMPTS[0]) + 64) * head.head_dim * 4


def test_the_runtimes_threads_spin_within_a_forward_and_stop_when_it_ends(onnx_folders, lm_pair, monkeypatch, capfd):
    """Spinning inside a forward keeps its few hundred parallel sections fast; spinning after it would
    take torch's cores while the drafter runs between two target forwards. The session ONNX Runtime
    creates carries the entries for both (its verbose log lists a session's config entries)."""
    from specdemo.engine.runtimes import onnx_lm

    options = onnx_lm.session_options
    monkeypatch.setattr(onnx_lm, "session_options", lambda threads: {**options(threads), "log_severity_level": 0})
    onnx_lm.OnnxTarget(lm_pair.target_runtime.folder, "fp32").model(1)
    log = capfd.readouterr().err
    assert "session.intra_op.allow_spinning: 1" in log and "session.force_spinning_stop: 1" in log


def test_the_heads_steps_run_on_the_runtime_and_draft_what_torchs_head_drafts(head_pair):
    """Beside a runtime target the feature head's steps run on the runtime too (exported once per head);
    its draft distributions are torch's head's to float rounding, through a catch-up, drafting and rollback."""
    from specdemo.engine.drafters.feature_drafter import FeatureDrafter
    from specdemo.engine.methods import _plain_drafter
    from specdemo.engine.runtimes.onnx_head import OnnxFeatureDrafter

    runtime_drafter, torch_drafter = _plain_drafter(head_pair), FeatureDrafter(head_pair.draft)
    assert isinstance(runtime_drafter, OnnxFeatureDrafter)
    config = SamplingConfig(temperature=1.0)
    torch.manual_seed(0)
    d = head_pair.draft.config.hidden_size
    prompt, features = PROMPTS[1], torch.randn(len(PROMPTS[1]) - 1, d)
    for drafter in (runtime_drafter, torch_drafter):
        drafter.start(prompt[:4], features[:3])
        drafter.catch_up(prompt[:4])  # the prompt's read, over an empty cache
        drafter.observe(prompt[:7], 4, None, target_features=features[3:6])
    steps = [(drafter.catch_up(prompt[:7]), drafter) for drafter in (runtime_drafter, torch_drafter)]
    for (predicted, drafter) in steps:
        drafter.cache.rollback(5)
        drafter.committed = 5
        drafter.pending = [features[5:]]
    again = [drafter.catch_up(prompt) for drafter in (runtime_drafter, torch_drafter)]
    # A draft step: one position, fed the head's own prediction.
    drafted = [drafter.head_step(predicted.view(1, -1), [7], len(prompt) - 1)[-1]
               for predicted, drafter in zip(again, (runtime_drafter, torch_drafter))]
    for ours, theirs in (((steps[0][0], runtime_drafter), (steps[1][0], torch_drafter)),
                         ((again[0], runtime_drafter), (again[1], torch_drafter)),
                         ((drafted[0], runtime_drafter), (drafted[1], torch_drafter))):
        q, p = ours[1].q_of(ours[0], config), theirs[1].q_of(theirs[0], config)
        assert torch.allclose(q, p, atol=1e-5), float((q - p).abs().max())
    assert runtime_drafter.cache.length == torch_drafter.cache.length == len(prompt)
    assert torch.allclose(runtime_drafter.cache.k[:, :, : len(prompt)], torch_drafter.cache.k[:, :, : len(prompt)],
                          atol=1e-5)


def test_the_heads_step_reads_its_cache_in_place_without_copying_it(head_pair):
    """The step's graph attends over the cached keys and values as they come in: they feed products only,
    never repeated per query head or appended to (a copy of the whole cache every step, which made a step
    slower the longer the context). The graph read is the one the runtime runs beside this target, exported
    once for the module where `open_head_step` keeps it."""
    import onnx

    from specdemo.engine.runtimes.onnx_head import export_head_step, head_digest

    head = head_pair.draft
    step = export_head_step(head, head_pair.target_runtime.folder.parent / "heads" / head_digest(head))
    graph = onnx.load(str(step)).graph
    readers = {name: [node.op_type for node in graph.node if name in node.input] for name in ("past_k", "past_v")}
    assert readers["past_k"] and readers["past_v"], readers
    assert set(readers["past_k"] + readers["past_v"]) <= {"MatMul", "Transpose", "Shape"}, readers
    assert not [node.op_type for node in graph.node if node.op_type == "Expand"]


def test_a_rounds_profile_times_each_part_at_the_context_asked_for(head_pair, lm_pair):
    """bench.runtime_round times the target's step and verification, bare and through the writer, and the
    head's step, each rolled back after it; a pair without a head has no head step, a torch target is refused."""
    from specdemo.bench.runtime_round import profile_context

    parts = profile_context(head_pair, PROMPTS[1], gamma=2, repeats=2)
    assert set(parts) == {"step", "verify", "bare step", "bare verify", "head step"}
    assert all(ms > 0 for ms in parts.values()), parts
    assert "head step" not in profile_context(lm_pair, PROMPTS[0], gamma=2, repeats=1)
    with pytest.raises(ValueError, match="torch"):
        profile_context(dataclasses.replace(lm_pair, target_runtime=None), PROMPTS[0])


def test_the_draft_lm_drafts_on_the_runtime_beside_a_runtime_target_and_on_torch_elsewhere(lm_pair, onnx_folders):
    from specdemo.engine.methods import _plain_drafter
    from specdemo.engine.runtimes.onnx_lm import OnnxCachedLM

    assert lm_pair.draft_runtime is not None and lm_pair.draft_runtime.precision == "fp32"
    result = greedy(lm_pair, PROMPTS[0], "sd", gamma=4)
    assert result.token_ids == ar_run(lm_pair, PROMPTS[0]).token_ids and result.stats["accepted"] > 0
    drafter = _plain_drafter(lm_pair)
    drafter.use_cache("dynamic", 64)
    assert isinstance(drafter.lm, OnnxCachedLM) and drafter.lm.model is lm_pair.draft
    # A draft cache a KV policy compresses is torch's: the runtime keeps its own full cache.
    squeezed = greedy(lm_pair, PROMPTS[1], "sd", gamma=4, draft_kv="streaming", kv_budget=8, kv_sinks=2)
    assert squeezed.token_ids == ar_run(lm_pair, PROMPTS[1]).token_ids
    target, draft, _ = onnx_folders
    on_torch = specdemo.load_pair(str(target), str(draft), device="cpu", dtype="float32", runtime="torch")
    assert on_torch.draft_runtime is None
    half_draft = specdemo.load_pair(str(target), str(draft), device="cpu", dtype="float32", draft_dtype="bfloat16",
                                    runtime="onnx")
    assert half_draft.draft_runtime is None  # the runtime runs the draft at float32 only; bfloat16 stays torch's


CHAIN_METHODS = ["sd", "nasd", "egag", "rest", "sd-heuristic", "sd-confidence", "adaedl", "egag-token", "specdecpp"]


@pytest.mark.parametrize("drafter", ["lm", "head"])
@pytest.mark.parametrize("method", CHAIN_METHODS)
def test_every_chain_method_returns_the_runtimes_own_ar_tokens(lm_pair, head_pair, drafter, method):
    pair = lm_pair if drafter == "lm" else head_pair
    drafted = accepted = 0
    for prompt in PROMPTS:
        reference = ar_run(pair, prompt).token_ids
        result = greedy(pair, prompt, method, gamma=4)
        assert result.token_ids == reference, f"{method} with the {drafter} on prompt {prompt}"
        drafted += result.stats["drafted"]
        accepted += result.stats["accepted"]
    if method in ("sd", "egag"):  # the comparison means something only if drafts were kept and refused
        assert 0 < accepted < drafted


def test_the_feature_head_reads_the_runtimes_hidden_states(head_pair):
    """The head drafts from the states the runtime returns: states of zeros would change its drafts."""
    assert greedy(head_pair, PROMPTS[0], "sd", gamma=4).stats["accepted"] > 0


def fresh_logits(pair, ids: list[int]) -> torch.Tensor:
    lm = pair.target_runtime.cached_lm(pair.target, None, 64)
    return lm.feed(torch.tensor(ids), len(ids))


@pytest.mark.parametrize("kept", range(5))
def test_a_rollback_after_a_rejection_forgets_exactly_the_rejected_positions(lm_pair, kept):
    """Verify 4 drafts, keep `kept` of them, then feed a correction: its logits are those of a
    runtime that never saw the rejected drafts."""
    context, drafts, correction = PROMPTS[1], [7, 8, 9, 10], 20
    lm = lm_pair.target_runtime.cached_lm(lm_pair.target, None, 64)
    lm.logits(context, 1)
    lm.logits(context, 5, then=torch.tensor(drafts))
    lm.note_fed(drafts)
    kept_sequence = context + drafts[:kept] + [correction]
    after = lm.logits(kept_sequence, 1)
    assert lm.length == len(kept_sequence)
    torch.testing.assert_close(after[0], fresh_logits(lm_pair, kept_sequence)[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["sd-tree", "egag-tree"])
def test_the_decode_loop_itself_refuses_a_tree_on_the_runtime_with_the_reason(head_pair, method):
    from specdemo.engine.decoding import generate

    with pytest.raises(ValueError, match="verifies a chain only"):
        generate(head_pair, PROMPTS[0], method, max_new_tokens=8, temperature=0.0)


@pytest.mark.parametrize("method", ["beam", "ar-nocache"])
def test_the_decode_loop_itself_refuses_torchs_own_loops_on_the_runtime(lm_pair, method):
    from specdemo.engine.decoding import generate

    with pytest.raises(ValueError, match="runs torch's own loop over the target .*, not the onnx runtime's"):
        generate(lm_pair, PROMPTS[0], method, max_new_tokens=8, temperature=0.0)


def torch_copy_ar(pair, prompt):
    from specdemo.models.torch_copy import on_torch

    result = ar_run(on_torch(pair), prompt)
    assert result.runtime == "torch"
    return result


@pytest.mark.parametrize("method, params, why", [
    ("sd-tree", {}, "tree attention mask"),
    ("egag-tree", {}, "tree attention mask"),
    ("adaedl-tree", {}, "tree attention mask"),
    ("nasd", {"nasd_tree": True}, "tree attention mask"),
    ("rest", {"rest_tree": True}, "tree attention mask"),
    ("ar-nocache", {}, "torch's own loop over the target (no KV cache)"),
    ("ar", {"target_kv": "streaming", "kv_budget": 16}, "target_kv=streaming"),
])
@pytest.mark.parametrize("pair_name", ["lm_pair", "head_pair"])
def test_what_the_runtime_cannot_run_runs_on_the_torch_copy_and_returns_its_ar_tokens(request, pair_name, method,
                                                                                      params, why):
    pair = request.getfixturevalue(pair_name)
    for prompt in PROMPTS:
        result = greedy(pair, prompt, method, **params)
        assert result.runtime == "torch copy" and result.stats["runtime"] == "torch copy"
        assert result.runtime_reason.startswith("on the torch copy of the target: ") and why in result.runtime_reason
        reference = torch_copy_ar(pair, prompt)
        limit = result.params["max_new_tokens"]  # AR without a cache stops early
        if params.get("target_kv") is None:
            assert result.token_ids == reference.token_ids[:limit]
    # A method the runtime runs stays on it, and says why the target is there.
    chain = greedy(pair, PROMPTS[0], "sd")
    assert chain.runtime == "onnx fp32" and chain.runtime_reason == pair.runtime_reason == "the target on onnx, as asked"


def test_beam_search_and_graph_capture_run_on_the_torch_copy(lm_pair):
    beam = greedy(lm_pair, PROMPTS[0], "beam", num_beams=2)
    assert beam.runtime == "torch copy" and "beam search" in beam.runtime_reason
    from specdemo.engine.params import DecodeParams
    from specdemo.engine.runtimes import runtime_reason

    assert "graph capture is torch's" in runtime_reason(lm_pair, "ar", DecodeParams(), compile=True)
    assert runtime_reason(lm_pair, "sd", DecodeParams()) is None


def test_verifies_a_tree_says_what_building_each_method_says(lm_pair):
    """The torch copy's rule for trees is decided before any drafter is built; it must agree with the drafters."""
    from specdemo.engine.methods import METHODS
    from specdemo.engine.params import DecodeParams
    from specdemo.engine.runtimes import drafts_a_tree as verifies_a_tree, refusal
    from specdemo.models.torch_copy import on_torch

    torch_pair = on_torch(lm_pair)
    for name, method in METHODS.items():
        if method.run is not None or method.decoder == "draft" or refusal(torch_pair, name):
            continue
        for switches in ({}, {"nasd_tree": True, "rest_tree": True}):
            params = DecodeParams.from_values(**switches)
            drafter, _ = method.build(torch_pair, params)
            assert verifies_a_tree(name, params) == bool(drafter is not None and drafter.drafts_trees), name


def test_a_vocabulary_as_wide_as_a_projection_is_refused(tmp_path):
    write_model(tmp_path / "m", seed=0, hidden=64, layers=1, vocab=64)
    with pytest.raises(ModelLoadError, match="as wide as one of its projections"):
        check_exportable(tmp_path / "m")


def test_a_head_size_the_runtimes_attention_cannot_run_is_refused(tmp_path):
    write_model(tmp_path / "m", seed=0, hidden=32, layers=1, vocab=VOCAB)  # 4 heads of 8
    with pytest.raises(ModelLoadError, match="multiple of 16"):
        check_exportable(tmp_path / "m")


def test_the_runtime_refuses_a_gpu_and_a_precision_it_does_not_run():
    with pytest.raises(ValueError, match="on the CPU"):
        specdemo.load_pair("embedded", device="cuda", runtime="onnx")
    with pytest.raises(ValueError, match="not one of auto, torch, onnx"):
        specdemo.load_pair("embedded", runtime="tensorrt")


def test_the_benchmark_times_the_torch_target_beside_the_runtimes(lm_pair):
    from specdemo import bench

    suite = [{"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "chat"}]
    result = bench.run_benchmark(lm_pair, suite, ["ar", "sd", "torch-ar"], repeats=1, warmup=False,
                                 max_new_tokens=12, temperature=0.0)
    rows = result.rows.set_index("method")
    assert rows.loc["ar", "runtime"] == rows.loc["sd", "runtime"] == "onnx fp32"
    assert rows.loc["torch-ar", "runtime"] == "torch copy"  # as the Playground's reference row reads
    assert rows.loc["sd", "matches_ar"] and rows.loc["torch-ar", "matches_ar"]
    assert result.meta["target_dtype"] == "onnx fp32"


def test_the_benchmark_adds_the_torch_copys_ar_for_a_method_that_runs_there_and_sets_it_against_that(lm_pair):
    from specdemo import bench

    suite = [{"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "chat"}]
    result = bench.run_benchmark(lm_pair, suite, ["ar", "sd", "sd-tree"], repeats=1, warmup=False,
                                 max_new_tokens=12, temperature=0.0)
    rows = result.rows.set_index("method")
    assert list(rows.index) and set(rows.index) == {"ar", "sd", "sd-tree", "torch-ar"}
    assert rows.loc["sd-tree", "runtime"] == "torch copy" and rows.loc["sd", "runtime"] == "onnx fp32"
    assert rows.loc["sd-tree", "matches_ar"] and rows.loc["sd", "matches_ar"]
    summary = result.summary.set_index(["category", "method"]).loc["all"]
    per_token = rows["seconds"] / rows["new_tokens"]
    assert summary.loc["sd-tree", "speedup_vs_ar"] == pytest.approx(per_token["torch-ar"] / per_token["sd-tree"])
    assert summary.loc["sd", "speedup_vs_ar"] == pytest.approx(per_token["ar"] / per_token["sd"])


def test_transformers_peers_run_on_the_torch_copy_against_its_ar_and_every_contender_is_warmed_first(lm_pair,
                                                                                                     monkeypatch):
    """generate needs torch weights, so beside a runtime target it runs on the torch copy: its row says so, the
    torch copy's AR joins the run, and its ratios are over that AR, never the runtime's (nor the runtime's AR set
    against it). Every contender, ours and the peers, is warmed up before its first timed call."""
    from specdemo import bench
    from specdemo.bench.measure import benchmark
    from specdemo.cli.bench import reference_lines

    calls, run = [], benchmark._Session.run

    def recorded(self, method, ids, seed, max_new_tokens=None):
        calls.append((method, "warm-up" if max_new_tokens is not None else "timed"))  # a warm-up is cut short
        return run(self, method, ids, seed, max_new_tokens)

    monkeypatch.setattr(benchmark._Session, "run", recorded)
    suite = [{"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "chat"}]
    result = bench.run_benchmark(lm_pair, suite, ["ar", "hf-generate"], repeats=1, max_new_tokens=12, temperature=0.0)
    rows = result.rows.set_index("method")
    assert set(rows.index) == {"ar", "hf-generate", "torch-ar"}
    assert rows.loc["ar", "runtime"] == rows.loc["ar", "reference_runtime"] == "onnx fp32"
    assert rows.loc["hf-generate", "runtime"] == rows.loc["hf-generate", "reference_runtime"] == "torch copy"
    assert rows.loc["hf-generate", "threads"] == rows.loc["torch-ar", "threads"]
    assert rows.loc["hf-generate", "matches_ar"]  # the torch copy's AR tokens
    per_token = rows["seconds"] / rows["new_tokens"]
    summary = result.summary.set_index(["category", "method"]).loc["all"]
    assert summary.loc["hf-generate", "speedup_vs_ar"] == pytest.approx(per_token["torch-ar"] / per_token["hf-generate"])
    assert summary.loc["torch-ar", "speedup_vs_hf"] == pytest.approx(per_token["hf-generate"] / per_token["torch-ar"])
    assert pd.isna(summary.loc["ar", "speedup_vs_hf"])  # the runtime's AR against generate on torch: no ratio
    assert summary.loc["hf-generate", "reference_runtime"] == "torch copy"
    lines = reference_lines(result.summary[result.summary.category == "all"])
    assert any(line.startswith("hf-generate (torch copy) vs AR (torch copy): speedup_vs_ar ") for line in lines)
    assert any("not for ar" in line for line in lines)
    first = {}
    for method, kind in calls:
        first.setdefault(method, kind)
    assert first == {"ar": "warm-up", "hf-generate": "warm-up", "torch-ar": "warm-up"}
    assert {method for method, kind in calls if kind == "timed"} == set(first)


def test_a_sweep_on_the_runtime_runs_a_tree_on_the_torch_copy_against_that_copys_ar(lm_pair):
    """A tree the runtime cannot verify runs on the torch copy, as the benchmark runs it, and AR on that copy
    runs beside it as its reference: its speedup and its match are over that AR, never the runtime's."""
    from specdemo.bench.sweep.grid import Setting
    from specdemo.bench.sweep.runner import run_sweep

    result = run_sweep(lm_pair, ["w5 w6 w7 w8 w5 w6 w7"], [Setting("sd-tree", node_budget=3)], repeats=1,
                       max_new_tokens=6, temperature=0.0, warmup=False)
    rows = result.rows.set_index("setting")
    assert list(rows.index) == ["ar", "sd-tree:node_budget=3", "torch-ar"]
    assert rows.loc["ar", "runtime"] == "onnx fp32"
    assert rows.loc["sd-tree:node_budget=3", "runtime"] == rows.loc["torch-ar", "runtime"] == "torch copy"
    assert rows.loc["sd-tree:node_budget=3", "runtime_reason"].startswith("on the torch copy of the target: the method "
                                                                          "drafts a tree")
    tree, copy_ar = rows.loc["sd-tree:node_budget=3"], rows.loc["torch-ar"]
    assert tree.speedup_vs_ar == pytest.approx((copy_ar.seconds / copy_ar.new_tokens) / (tree.seconds / tree.new_tokens))
    assert tree.matches_ar and pd.isna(copy_ar.matches_ar)
    assert rows.loc["torch-ar", "label"] == "AR (torch copy)"
    assert "SD-tree 3 nodes ran on the torch copy of the target" in result.verdict


def test_a_comparison_sets_a_torch_copy_method_against_the_torch_copys_ar(lm_pair):
    from specdemo.bench.measure.compare import run_comparison

    comparison = run_comparison(lm_pair, PROMPTS[0], ["ar", "sd-tree"], max_new_tokens=16, temperature=0.0)
    summary = comparison.summary.set_index("method")
    assert list(summary.index) == ["ar", "torch-ar", "sd-tree"]
    assert summary.loc["torch-ar", "label"] == "AR (torch copy)"
    assert summary.loc["sd-tree", "label"] == "SD-tree (torch copy)" and summary.loc["sd-tree", "runtime"] == "torch copy"
    speeds = summary["tokens_per_s"]
    assert summary.loc["sd-tree", "speedup_vs_ar"] == pytest.approx(speeds["sd-tree"] / speeds["torch-ar"])
    assert summary.loc["sd-tree", "matches_ar"]


@pytest.mark.parametrize("peer", ["torch-ar", "onnx-generate", "onnx-ngram"])
def test_the_peers_beside_a_runtime_are_refused_where_the_target_is_torchs_already(onnx_folders, peer):
    from specdemo.bench.measure.runners import parse_bench_methods

    target, _, _ = onnx_folders
    torch_pair = specdemo.load_pair(str(target), device="cpu", dtype="float32", runtime="torch")
    with pytest.raises(ValueError, match="runs on torch already"):
        parse_bench_methods(f"ar,{peer}", torch_pair)


def test_the_runtimes_own_decoders_run_beside_ours_and_write_its_ar_tokens(lm_pair):
    from specdemo import bench

    suite = [{"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8 w9 w10 w5 w6 w7", "category": "chat"}]
    result = bench.run_benchmark(lm_pair, suite, ["ar", "onnx-generate", "onnx-ngram"], repeats=1, warmup=False,
                                 max_new_tokens=24, temperature=0.0, gamma=3)
    rows = result.rows.set_index("method")
    assert (rows["error"] == "").all(), rows["error"].to_dict()
    assert rows.loc["onnx-generate", "runtime"] == rows.loc["onnx-ngram", "runtime"] == "onnx fp32"
    assert rows.loc["onnx-generate", "matches_ar"] and rows.loc["onnx-ngram", "matches_ar"]
    ngram = rows.loc["onnx-ngram"]
    assert ngram["drafted"] > 0 and ngram["rounds"] < ngram["new_tokens"], "the repeated prompt gives the lookup hits"
    assert 0 <= ngram["accepted"] <= ngram["drafted"]


def test_the_runtimes_own_search_reads_a_prompt_that_ends_in_the_eos_id_as_ours_does(lm_pair):
    """The export names the EOS id its padding id too, and the runtime's search left such a prompt's last
    token out of attention (a chat template or a later turn can end in it)."""
    from specdemo.bench.measure.runtime_peers import RuntimeRunner
    from specdemo.engine.params import DecodeParams

    eos = min(lm_pair.eos_ids)
    prompt = PROMPTS[0] + [eos]
    run = RuntimeRunner(lm_pair, DecodeParams.resolve(None, max_new_tokens=40, temperature=0.0)).run(
        "onnx-generate", prompt, seed=0)
    assert run.token_ids == greedy(lm_pair, prompt, "ar").token_ids


def test_the_runtimes_own_search_stops_at_the_pairs_eos(onnx_folders):
    target, _, _ = onnx_folders
    pair = specdemo.load_pair(str(target), device="cpu", dtype="float32", runtime="onnx")
    free = greedy(pair, PROMPTS[1], "ar").token_ids
    stop = free[5]
    assert stop not in free[:5]
    pair.target_runtime.eos_ids = (stop,)  # before its first session opens, as the loader sets it
    pair = dataclasses.replace(pair, eos_ids=frozenset({stop}))
    from specdemo.bench.measure.runtime_peers import RuntimeRunner
    from specdemo.engine.params import DecodeParams

    run = RuntimeRunner(pair, DecodeParams.resolve(None, max_new_tokens=40, temperature=0.0)).run(
        "onnx-generate", PROMPTS[1], seed=0)
    assert run.token_ids == free[:6] == greedy(pair, PROMPTS[1], "ar").token_ids  # the EOS id kept, as ours keep it
    assert run.stats["stop_reason"] == "eos"


def test_the_runtimes_sampling_takes_the_runs_settings():
    from specdemo.bench.measure.runtime_peers import search_options
    from specdemo.engine.params import DecodeParams

    greedy_options = search_options(DecodeParams.resolve(None, temperature=0.0), 50, 7, 80)
    assert greedy_options["do_sample"] is False and greedy_options["max_length"] == 50
    sampled = search_options(DecodeParams.resolve(None, temperature=0.7, top_k=0, top_p=0.9), 50, 7, 80)
    assert sampled == {**sampled, "do_sample": True, "temperature": 0.7, "top_k": 80, "top_p": 0.9, "random_seed": 7}


SAMPLING_PROMPT = [3, 4, 5, 3, 4, 5, 3, 4]


@pytest.fixture(scope="module")
def small_vocab_onnx_pair(onnx_folders):
    """An 8-token target on the runtime and a noisy torch copy as its draft, with no EOS, so that
    every run yields two tokens (an 8-token vocabulary is narrower than every projection)."""
    root = onnx_folders[0].parent
    target, draft = root / "target8", root / "draft8"
    write_model(target, seed=0, hidden=64, layers=1, vocab=8, head_scale=1.5)
    write_tokenizer(target, 8)
    write_model(draft, seed=1, hidden=64, layers=1, vocab=8, like=target, noise=0.6)
    write_tokenizer(draft, 8)
    pair = specdemo.load_pair(str(target), str(draft), device="cpu", dtype="float32", runtime="onnx")
    return dataclasses.replace(pair, eos_ids=frozenset({10_000}))


def runtime_joint(pair, config) -> torch.Tensor:
    """p(t1) · p(t2 | t1) as the runtime computes it (its own forwards, not torch's)."""
    first = probabilities(fresh_logits(pair, SAMPLING_PROMPT)[-1], config)
    joint = torch.zeros(8, 8)
    for t1 in range(8):
        if first[t1] > 0:
            joint[t1] = first[t1] * probabilities(fresh_logits(pair, SAMPLING_PROMPT + [t1])[-1], config)
    return joint


@pytest.mark.parametrize("method", ["sd", "egag"])
def test_sd_under_sampling_draws_from_the_runtimes_distribution(small_vocab_onnx_pair, method):
    pair, samples = small_vocab_onnx_pair, 600
    assert pair.draft_runtime is not None  # the draft's q comes from the runtime too
    counts = torch.zeros(8, 8)
    drafted = accepted = 0
    for seed in range(samples):
        result = specdemo.generate(pair, SAMPLING_PROMPT, method=method, max_new_tokens=3, gamma=2, gamma_min=2,
                                   gamma_max=3, temperature=1.0, copy_n=0, seed=seed)
        t1, t2 = result.token_ids[:2]
        counts[t1, t2] += 1
        drafted += result.stats["drafted"]
        accepted += result.stats["accepted"]
    assert 0 < accepted < drafted, "the test means something only if drafts were both kept and refused"
    expected = runtime_joint(pair, SamplingConfig(temperature=1.0)).flatten() * samples
    assert counts.flatten()[expected == 0].sum() == 0
    assert pooled_chisquare(counts.flatten(), expected) > 1e-3


# --------------------------------------------------------------------------- the Playground on the runtime


@pytest.fixture(scope="module")
def page_presets(onnx_folders):
    from specdemo.models.loading import Preset

    target, draft, head = onnx_folders
    return {"tiny-onnx": Preset("tiny-onnx", str(target), str(draft)),
            "tiny-head-onnx": Preset("tiny-head-onnx", str(target), str(head)),
            "hub": Preset("hub", "someone/some-model", None),
            "gguf": Preset("gguf", "/nowhere/some-model.gguf", None)}


def float32_loader(target, draft=None, device=None, dtype=None, **chosen):
    return specdemo.load_pair(target, draft, device="cpu", dtype="float32", **chosen)


def runtime_dropdown(demo, elem_id: str = "sd-runtime"):
    return next(block for block in demo.blocks.values() if getattr(block, "elem_id", None) == elem_id)


@pytest.fixture(scope="module")
def demos(page_presets):
    """The page built once for each start the tests read (they only read its controls): the tiny pair's
    default, a .gguf pair's, `python app.py --runtime onnx`'s, and the tiny pair's where the runtime is not
    installed."""
    from specdemo.app import ui
    from specdemo.engine.runtimes import onnx_export

    def build(**options):
        return ui.build_demo(pair_loader=float32_loader, presets=page_presets, **options)

    built = {"tiny": build(default_preset="tiny-onnx"), "gguf": build(default_preset="gguf"),
             "onnx first": build(default_preset="tiny-onnx", runtime="onnx")}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnx_export, "onnx_runtime_missing", lambda: "onnxruntime-genai is not installed")
        built["torch only"] = build(default_preset="tiny-onnx")
    return built


def test_the_page_offers_the_runtime_where_it_runs_and_hides_it_elsewhere(page_presets, demos):
    from types import SimpleNamespace

    from specdemo.app import ui
    from specdemo.app.playgroundtab import runtime_offered
    from specdemo.engine.runtimes import onnx_export

    assert onnx_export.served_runtimes("cpu") == ("torch", "onnx")
    assert onnx_export.served_runtimes("cuda:0") == ("torch",)
    dropdown = runtime_dropdown(demos["tiny"])
    assert dropdown.visible and [value for _, value in dropdown.choices] == ["auto", "torch", "onnx"]
    assert dropdown.value == "auto"
    # A .gguf target cannot be exported as it is: choosing its pair hides the control, on auto (torch there).
    ctx = SimpleNamespace(presets=page_presets, runtimes=("auto", "torch", "onnx"))
    assert runtime_offered(ctx, "gguf") == {"__type__": "update", "visible": False, "value": "auto"}
    assert runtime_offered(ctx, "tiny-head-onnx")["visible"] and runtime_offered(ctx, "hub")["visible"]
    # `python app.py --runtime onnx`: the page's default, which its preloaded pair runs on.
    assert ui.page_runtimes("cpu", "onnx") == ("onnx", "auto", "torch")
    assert ui.page_runtimes("cpu") == ("auto", "torch", "onnx") and ui.page_runtimes("cuda") == ("auto", "torch")
    assert runtime_dropdown(demos["onnx first"]).value == "onnx"
    with pytest.raises(ValueError, match="onnx runtime runs the target on the CPU"):
        ui.page_runtimes("cuda", "onnx")
    assert not runtime_dropdown(demos["torch only"]).visible  # onnxruntime-genai not installed


def page_run(presets, methods: str, runtime: str = "", preset: str = "tiny-head-onnx"):
    """A Playground run through the handlers on a real pair cache, on the page's default runtime (auto) unless
    `runtime` is given."""
    from specdemo.app import handlers
    from specdemo.app.page import PairCache

    cache = PairCache(float32_loader, warm_up=False)
    request = handlers.make_request("w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", preset, "", "",
                                    {"temperature": 0.0, "max_new_tokens": 24, "chat": False, "runtime": runtime},
                                    presets, methods=methods, runtimes=("auto", "torch", "onnx"))
    load = lambda r: cache.get(r.target, r.draft, target_dtype=r.target_dtype, runtime=r.runtime)  # noqa: E731
    return list(handlers.stream_run(request, load))


def test_a_playground_run_on_the_runtime_gives_sd_the_runtimes_own_ar_tokens(page_presets):
    updates = page_run(page_presets, "ar,sd,egag")  # the default path: auto
    assert "preparing the fast target, first time only" in updates[0].status
    assert "The target on onnx (auto)" in updates[-1].status
    ar, *drafting = updates[-1].results
    assert all(result.runtime == "onnx fp32" for result in (ar, *drafting))
    assert [result.token_ids for result in drafting] == [ar.token_ids] * 2
    assert sum(result.stats["accepted"] for result in drafting) > 0


def test_a_method_the_runtime_cannot_run_runs_on_the_torch_copy_and_its_speedup_is_over_the_copys_ar(page_presets):
    last = page_run(page_presets, "ar,sd,sd-tree")[-1]
    ar, sd, tree, reference = last.results
    assert [r.method for r in last.results] == ["ar", "sd", "sd-tree", "torch-ar"]
    assert (ar.runtime, sd.runtime, tree.runtime, reference.runtime) == ("onnx fp32", "onnx fp32", "torch copy",
                                                                         "torch copy")
    assert tree.token_ids == reference.token_ids and sd.token_ids == ar.token_ids
    assert "SD-tree on the torch copy of the target" in last.status and "the AR (torch copy) row" in last.status
    table = last.table.set_index("method")
    assert list(table.index) == ["AR", "AR (torch copy)", "SD", "SD-tree (torch copy)"]
    assert table.loc["SD-tree (torch copy)", "speedup vs AR"].endswith("over AR (torch copy)")
    assert table.loc["SD-tree (torch copy)", "quality"] == "identical to AR (torch copy)"
    expected = tree.stats["tokens_per_s"] / reference.stats["tokens_per_s"]
    assert table.loc["SD-tree (torch copy)", "speedup vs AR"].startswith(f"{expected:.2f}×")
    assert "⚠️" not in last.status  # no method was refused


def test_a_runtime_the_page_does_not_offer_is_refused_by_name(page_presets):
    from specdemo.app import handlers

    with pytest.raises(ValueError, match="runtime must be one of auto, torch, onnx here, got 'tensorrt'"):
        handlers.make_request("w5", "tiny-onnx", "", "", {"runtime": "tensorrt"}, page_presets,
                              runtimes=("auto", "torch", "onnx"))


@pytest.mark.filterwarnings("ignore::Warning:gradio.queueing")  # Gradio's own pandas deprecations
def test_the_served_page_runs_on_the_runtime_it_is_asked_for(onnx_folders, page_presets):
    """Through the page's own endpoint: the runtime field reaches the pair cache and the table names it."""
    gradio_client = pytest.importorskip("gradio_client")
    from tests.uiserver import serve

    with serve(onnx_folders[0].parent, presets=page_presets, loader=float32_loader) as (url, _):
        client = gradio_client.Client(url, verbose=False)
        for runtime, ran_on in (("", "onnx fp32"), ("onnx", "onnx fp32"), ("torch", "torch")):  # "": the default
            summary, *_ = client.predict(prompt="w5 w6 w7 w8 w9 w10 w5 w6", preset="tiny-onnx", methods=["ar", "sd"],
                                         max_new_tokens=12, temperature=0.0, chat=False, runtime=runtime,
                                         api_name="/compare")
            rows = [dict(zip(summary["headers"], row)) for row in summary["data"]]
            assert [row["runtime"] for row in rows] == [ran_on] * 2
            assert rows[1]["matches_ar"] in (True, "True", 1)


def test_the_benchmark_tab_offers_the_runtime_where_the_playground_does(page_presets, demos):
    from types import SimpleNamespace

    from specdemo.app import benchtab

    demo = demos["tiny"]
    playground, tab = runtime_dropdown(demo), runtime_dropdown(demo, "bench-runtime")
    # A suite's methods depend on the runtime: the tab offers what auto gives here (onnx) and torch.
    assert tab.visible and [value for _, value in tab.choices] == ["onnx", "torch"] and tab.value == "onnx"
    assert playground.value == "auto"
    gguf = demos["gguf"]
    assert not runtime_dropdown(gguf, "bench-runtime").visible and runtime_dropdown(gguf, "bench-runtime").value == "torch"
    assert runtime_dropdown(demos["onnx first"], "bench-runtime").value == "onnx"
    # Choosing onnx offers the methods it runs; a pair it cannot take goes back to torch, and so do its methods.
    offer = benchtab.offer_methods(SimpleNamespace(presets=page_presets, runtimes=("torch", "onnx")))
    checked, note = offer("tiny-onnx", ["ar", "sd", "hf-generate", "onnx-ngram"], "onnx")
    # transformers' peers stay checked: on onnx they run on the torch copy, beside that copy's AR.
    assert checked == ["ar", "sd", "hf-generate", "onnx-ngram"] and 'input[name="hf-generate"]' not in note
    checked, note = offer("gguf", ["ar", "onnx-ngram"], "onnx")
    assert checked == ["ar"] and "which this page does not offer for this pair" in note
    assert not runtime_dropdown(demos["torch only"], "bench-runtime").visible  # onnxruntime-genai not installed


def bench_tab_run(presets, folder, methods: list[str], runtime: str) -> list:
    """The Benchmark tab's handler on a real pair cache: its status lines, then its outputs."""
    import json

    from specdemo.app import benchtab
    from specdemo.app.limits import Limits
    from specdemo.app.page import PairCache, TabContext

    suite = folder / "suite.jsonl"
    suite.write_text(json.dumps({"prompt": "w5 w6 w7 w8 w9 w10 w5 w6 w7 w8", "category": "chat"}) + "\n")
    cache = PairCache(float32_loader, warm_up=False)
    ctx = TabContext(presets=presets, default_preset="tiny-onnx", load=cache.get,
                     limits=Limits(), gpu=lambda work: work, export=lambda: folder, runtimes=("torch", "onnx"))
    form = benchtab.BenchForm("tiny-onnx", "all", 1, 1, 12, methods, 0.0, 3, 3, 0, str(suite), False, runtime)
    return list(benchtab.benchmark(ctx, form, progress=lambda *args, **kwargs: None))


@pytest.mark.filterwarnings("ignore::Warning:gradio")  # Gradio's own deprecations while it builds the outputs
def test_the_benchmark_tab_runs_on_the_runtime_with_its_own_search_beside_ar(page_presets, tmp_path):
    import gradio as gr
    import pandas as pd

    *statuses, outputs = bench_tab_run(page_presets, tmp_path, ["ar", "onnx-generate"], "onnx")
    assert "exports the target for ONNX Runtime" in statuses[0]
    message, shown = outputs[:2]
    assert message.startswith("Done: 2 runs") and "the target on onnx fp32" in message
    rows = pd.read_csv(tmp_path / "bench-runs.csv").set_index("method")
    assert rows["error"].isna().all(), rows["error"].to_dict()
    assert rows.loc["ar", "runtime"] == rows.loc["onnx-generate", "runtime"] == "onnx fp32"
    assert rows.loc["onnx-generate", "matches_ar"] and rows.loc["ar", "new_tokens"] == 12
    assert list(shown.columns[:3]) == ["category", "method", "runtime"]  # which target each row timed
    with pytest.raises(gr.Error, match="onnx-generate: run beside a target on another runtime: choose the onnx"):
        bench_tab_run(page_presets, tmp_path, ["ar", "onnx-generate"], "torch")


def test_the_sweep_tab_offers_the_runtime_where_the_playground_does(demos):
    demo = demos["tiny"]
    playground, tab = runtime_dropdown(demo), runtime_dropdown(demo, "sweep-runtime")
    assert tab.visible and [value for _, value in tab.choices] == ["onnx", "torch"] and tab.value == "onnx"
    # Another pair offers its runtimes: the tab's Model pair drives its control.
    preset = runtime_dropdown(demo, "sweep-preset")
    assert any((preset._id, "change") in [(target[0], target[1]) for target in fn.targets]
               and tab in fn.outputs for fn in demo.fns.values())
    gguf = demos["gguf"]
    assert not runtime_dropdown(gguf, "sweep-runtime").visible and runtime_dropdown(gguf, "sweep-runtime").value == "torch"
    assert runtime_dropdown(demos["onnx first"], "sweep-runtime").value == "onnx"
    assert not runtime_dropdown(demos["torch only"], "sweep-runtime").visible  # onnxruntime-genai not installed


def sweep_tab_run(presets, folder, load, **changes) -> list:
    """The Sweep tab's handler on the tiny pair: its status lines, then its outputs."""
    from specdemo.app import sweeptab
    from specdemo.app.limits import Limits
    from specdemo.app.page import TabContext

    ctx = TabContext(presets=presets, default_preset="tiny-onnx", load=load, limits=Limits(), gpu=lambda work: work,
                     export=lambda: folder, runtimes=("torch", "onnx"))
    values = {"preset": "tiny-onnx", "methods": ["sd", "egag"], "gamma": "2", "gamma_max": "3", "ema": "0.9",
              "categories": ["chat"], "prompts_per_category": 1, "repeats": 1, "max_new_tokens": 8, "chat": False,
              "temperature": 0.0, "seed": 0, "runtime": "onnx", **changes}
    return list(sweeptab.page_sweep(ctx, values, progress=lambda *args, **kwargs: None))


@pytest.mark.filterwarnings("ignore::Warning:gradio")  # Gradio's own deprecations while it builds the outputs
def test_the_sweep_tab_runs_on_the_runtime_and_its_rows_name_it(page_presets, tmp_path):
    import pandas as pd

    from specdemo.app.page import PairCache

    cache = PairCache(float32_loader, warm_up=False)
    *statuses, outputs = sweep_tab_run(page_presets, tmp_path, cache.get)
    assert "exports the target for ONNX Runtime" in statuses[0]
    assert outputs[0].startswith("Done: 3 runs") and outputs[0].endswith("the target on onnx fp32.")
    rows = pd.read_csv(tmp_path / "sweep.csv").set_index("setting")
    assert rows["runtime"].tolist() == ["onnx fp32"] * 3
    assert rows.loc[["sd:gamma=2", "egag:gamma_max=3,ema=0.9"], "matches_ar"].all()  # the runtime's own AR tokens
    summary = pd.read_csv(tmp_path / "sweep.summary.csv")
    assert summary["runtime"].tolist() == ["onnx fp32"] * 3


@pytest.mark.filterwarnings("ignore::Warning:gradio")  # Gradio's own deprecations while it builds the outputs
def test_the_sweep_tab_runs_a_tree_on_the_runtime_pairs_torch_copy_and_says_so(page_presets, tmp_path):
    """The Sweep tab runs an sd-tree setting on a runtime pair as the Benchmark tab does: on the torch copy,
    beside AR on that copy, its table naming which target each setting timed and its verdict saying why."""
    import pandas as pd

    from specdemo.app.page import PairCache

    cache = PairCache(float32_loader, warm_up=False)
    *_, outputs = sweep_tab_run(page_presets, tmp_path, cache.get, methods=["sd-tree"], node_budget="3")
    assert outputs[0].startswith("Done: 3 runs"), outputs[0]
    rows = pd.read_csv(tmp_path / "sweep.csv").set_index("setting")
    assert rows.loc["sd-tree:node_budget=3", "runtime"] == "torch copy" and rows.loc["sd-tree:node_budget=3", "matches_ar"]
    assert rows.loc["ar", "runtime"] == "onnx fp32" and rows.loc["torch-ar", "runtime"] == "torch copy"
    shown = next(o for o in outputs if isinstance(o, pd.DataFrame))
    assert list(shown.columns[:2]) == ["setting", "runtime"]
    assert "SD-tree 3 nodes" in shown.setting.tolist() and "torch copy" in shown.runtime.tolist()
    assert any(isinstance(o, str) and "ran on the torch copy of the target: the method drafts a tree" in o
               for o in outputs)


@pytest.mark.parametrize("changes, message", [
    ({"target_dtype_axis": "bfloat16"}, "target_dtype=bfloat16: the onnx runtime runs the target at float32, int8"),
    ({"target_kv": "streaming", "kv_budget": 16}, "target_kv=streaming: the onnx runtime keeps its own full cache"),
])
def test_what_the_runtime_refuses_stops_the_sweep_tab_before_it_loads_a_pair(page_presets, tmp_path, changes,
                                                                             message):
    import gradio as gr

    def never(*args, **kwargs):
        raise AssertionError("the pair was loaded")

    with pytest.raises(gr.Error, match=message):
        sweep_tab_run(page_presets, tmp_path, never, **changes)


def test_auto_threads_give_ar_every_core_on_the_runtime_and_one_on_torch():
    from specdemo.bench.measure.threads import ThreadPlan

    auto = ThreadPlan.parse("auto", cores=2)
    assert [auto.for_runtime("onnx").for_method(m) for m in ("ar", "sd")] == [2, 2]
    assert [auto.for_runtime("torch").for_method(m) for m in ("ar", "sd")] == [1, 2]
    assert ThreadPlan.parse(1).for_runtime("onnx").for_method("sd") == 1


def test_torch_works_on_one_thread_between_the_runtimes_forwards_which_keep_the_count_asked_for(lm_pair, monkeypatch):
    from specdemo.engine.runtimes import onnx_lm

    seen, feed = [], onnx_lm.OnnxCachedLM.feed

    def counting_feed(self, *args, **kwargs):
        if self.model is lm_pair.target:  # the draft LM drafts on the runtime too, on its own writer
            seen.append(torch.get_num_threads())
        return feed(self, *args, **kwargs)

    monkeypatch.setattr(onnx_lm.OnnxCachedLM, "feed", counting_feed)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        result = greedy(lm_pair, PROMPTS[0], "sd", gamma=4)
        assert torch.get_num_threads() == 2 and result.threads == 2
    finally:
        torch.set_num_threads(before)
    assert 2 in lm_pair.target_runtime._models  # the runtime's session: the count asked for
    assert 2 in lm_pair.draft_runtime._models  # and the draft's
    assert seen[0] == 2 and set(seen[1:]) == {1}  # the prefill before the rounds, then every round's forwards
