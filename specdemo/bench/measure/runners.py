"""Runners: one timed call of one method on one prompt, for our methods (through the
decode loop) and for transformers' peers (``generate``, assisted generation, prompt lookup),
fed exactly the same prompt ids, EOS ids and sampling settings.

May import ``specdemo.engine`` and ``specdemo.models``; pandas is not needed here.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import os
import platform
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ...models.torch_copy import TORCH_COPY, TORCH_COPY_AR_REASON, generate, generate_batch, on_torch
from ...engine.targets.seq2seq import decoder_start
from ...engine.methods import DEFAULT_METHODS, HEAD_KINDS, METHODS, REFERENCE
from ...engine.params import DecodeParams
from ...engine.runtimes import refusal, runtime_reason
from ...engine.tokens import cut_at_eos
from ...engine.trace import GenerationResult, TokenRecord
from ...models.tokens import device_name

HF_METHODS: dict[str, tuple[str, str]] = {
    "hf-generate": ("HF generate", "transformers' model.generate (greedy or the same sampling settings)"),
    "hf-generate-static": ("HF generate (static, compiled)",
                           "model.generate with transformers' static cache and its torch.compile'd forward"),
    "hf-assisted": ("HF assisted (γ)", "assisted generation with our draft, γ tokens a round, constant, no confidence stop"),
    "hf-assisted-default": ("HF assisted (defaults)", "assisted generation with our draft and transformers' default schedule"),
    "hf-prompt-lookup": ("HF prompt lookup", "prompt-lookup decoding, γ tokens, matching up to n−1 tokens"),
}
# For a pair whose target runs on another runtime (runtime=onnx): our AR on the torch copy of the
# same weights, so one run times the two targets side by side; and the runtime's own decoders on the
# same exported target (`bench.runtime_peers`), the yardstick for ours on it.
TORCH_AR, ONNX_GENERATE, ONNX_NGRAM = "torch-ar", "onnx-generate", "onnx-ngram"
RUNTIME_PEERS: dict[str, tuple[str, str]] = {
    TORCH_AR: ("AR (torch copy)", "AR on the torch copy of the target, beside a target on another runtime"),
    ONNX_GENERATE: ("Runtime generate", "onnxruntime-genai's own decode loop on the same exported target"),
    ONNX_NGRAM: ("Runtime n-gram", "onnxruntime-genai's own n-gram speculative decoding: γ tokens a round, "
                                   "matched on the last n−1 tokens (at least 2)"),
}
# The peers that write one token a step, as AR does (the others verify drafts).
ONE_TOKEN_BASELINES = frozenset({"hf-generate", "hf-generate-static", TORCH_AR, ONNX_GENERATE})
DEFAULT_BENCH_METHODS = (*DEFAULT_METHODS, "hf-generate", "hf-assisted", "hf-prompt-lookup")

def bench_methods() -> dict[str, str]:
    """Every method the benchmark knows, name → label."""
    return {**{name: m.label for name, m in METHODS.items()}, **{n: label for n, (label, _) in HF_METHODS.items()},
            **{n: label for n, (label, _) in RUNTIME_PEERS.items()}}


def _needs_draft(name: str) -> bool:
    return (name in METHODS and METHODS[name].needs_draft) or name.startswith("hf-assisted")


def unavailable_bench_methods(draft_kind: str | None) -> dict[str, str]:
    """The methods a pair cannot run, by what it drafts with ("feature-head", "model" or None),
    each with the one-line reason a page shows."""
    if draft_kind is None:
        return {n: "needs a draft, and this pair has none" for n in bench_methods() if _needs_draft(n)}
    if draft_kind in HEAD_KINDS:
        # transformers' assisted generation runs a whole draft LM; a head that reads the target is not one.
        return {n: "runs a draft language model, and this pair drafts with a feature head (the embedded-lm "
                   "pair has one)" for n in HF_METHODS if n.startswith("hf-assisted")}
    return {}


def parse_bench_methods(value: str | Sequence[str] | None, pair=None) -> list[str]:
    if value is None:
        names = list(DEFAULT_BENCH_METHODS)
    else:
        names = value.split(",") if isinstance(value, str) else list(value)
        names = list(dict.fromkeys(n.strip().lower() for n in names if n and n.strip()))
    known = bench_methods()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    if not names:
        raise ValueError(f"methods: choose at least one of {', '.join(known)}")
    if pair is not None and pair.draft is None:
        needs = [n for n in names if _needs_draft(n)]
        if needs:
            raise ValueError(f"method(s) {', '.join(needs)} need a draft model; load the pair with a draft "
                             "or drop them")
    beside_runtime = [n for n in names if n in RUNTIME_PEERS]
    if pair is not None and beside_runtime and getattr(pair, "runtime", "torch") == "torch":
        raise ValueError(f"{', '.join(beside_runtime)} run beside a target on another runtime (the torch copy's AR, "
                         "the runtime's own decoders); this pair's target runs on torch already: load it with "
                         "--runtime onnx or drop them")
    if pair is not None:
        for name in names:  # a method the target's runtime cannot run runs on the torch copy (models.torch_copy)
            refused = refusal(on_torch(pair), name) if name in METHODS else None
            if refused:
                raise ValueError(refused)
    if pair is not None and getattr(pair, "draft_kind", None) in HEAD_KINDS:
        # transformers' assisted generation runs a whole draft LM; a head that reads the target is not one.
        assisted = [n for n in names if n.startswith("hf-assisted")]
        if assisted and value is None:
            names = [n for n in names if n not in assisted]
        elif assisted:
            raise ValueError(f"method(s) {', '.join(assisted)} need a draft language model, and this pair drafts "
                             "with a feature head; drop them, or use the embedded-lm pair for assisted generation")
    return names


@dataclass
class Run:
    token_ids: list[int]
    seconds: float
    stats: dict[str, Any]
    rounds: list[tuple[int, int]]  # (drafted, accepted) per round
    result: GenerationResult | None = None

    @classmethod
    def of(cls, result: GenerationResult, seconds: float) -> "Run":
        stats = dict(result.stats)
        stats["engine_seconds"] = stats.pop("seconds")
        stats["prefill_s"] = result.prefill_seconds
        return cls(result.token_ids, seconds, stats, [(len(r.drafted), r.accepted) for r in result.rounds], result)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def quiet_gc():
    """Collect before a timed call and not during it: a collection mid-run is noise. Only the young
    generations, where what the last runs left lies: a full collection walks every object alive (the
    libraries, the loaded pair), 0.3 s and more a call on a small CPU, which a benchmark of many short
    runs would spend in the collector; older garbage goes in the collector's own full collections,
    between runs. The page's decodes go through it too, so that its numbers and the benchmark's are
    timed alike."""
    gc.collect(1)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def with_torch_copy_reference(names: Sequence[str], pair, decode: DecodeParams, compile: bool = False) -> list[str]:
    """`names`, with the torch copy's AR (TORCH_AR) added where one of them runs on the torch copy of a runtime
    target (a method of ours the runtime refuses, or any of transformers' peers, which call generate on that
    copy): the reference those rows' speedups are over, never the runtime's AR."""
    on_copy = [n for n in names if (n in METHODS and runtime_reason(pair, n, decode, compile=compile))
               or (n in HF_METHODS and runs_peers_on_torch_copy(pair))]
    return [*names, TORCH_AR] if on_copy and TORCH_AR not in names else list(names)


def runs_peers_on_torch_copy(pair) -> bool:
    """Whether transformers' peers run on the torch copy of this pair's target: its target runs on another
    runtime, and `generate` needs the torch weights the pair keeps beside it."""
    return getattr(pair, "target_runtime", None) is not None


def measured_on(device: torch.device) -> dict[str, str]:
    """Which machine and device a run's rows were measured on: the host's name, and the device with
    its model. A GPU is named by its index as the machine counts them (CUDA_VISIBLE_DEVICES maps a
    worker's cuda:0 to the GPU a scheduler gave it), so two GPUs of one node stay apart."""
    if device.type != "cuda":
        return {"node": platform.node(), "device": device_name(device)}
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    physical = visible[index] if index < len(visible) else str(index)
    return {"node": platform.node(), "device": f"cuda:{physical} ({device_name(device)})"}


def run_ours(pair, method: str, prompt_ids: list[int], params: dict, seed: int, cache: str | None = None,
             compile: bool = False) -> Run:
    """One timed call; what it spent beside decoding (compiling, OSD's learning after the request:
    `off_clock_seconds`) is taken out of `seconds`. TORCH_AR is AR on the torch copy (`run_torch_copy_ar`)."""
    if method == TORCH_AR:
        return run_torch_copy_ar(pair, prompt_ids, params, seed, cache=cache, compile=compile)
    device = pair.device
    with quiet_gc():
        _sync(device)
        start = time.perf_counter()
        result = generate(pair, prompt_ids, method, **{**params, "seed": seed}, cache=cache, compile=compile)
        _sync(device)
        seconds = time.perf_counter() - start - result.off_clock_seconds
    return Run.of(result, seconds)


def run_torch_copy_ar(pair, prompt_ids: list[int], params: dict, seed: int, cache: str | None = None,
                      compile: bool = False) -> Run:
    """AR timed on the torch copy of a runtime target (TORCH_AR), its row labelled as the Playground labels
    its reference row: the reference of every method that ran on that copy."""
    run = run_ours(on_torch(pair), REFERENCE, prompt_ids, params, seed, cache=cache, compile=compile)
    run.stats["runtime"] = TORCH_COPY
    run.stats["runtime_reason"] = run.result.runtime_reason = TORCH_COPY_AR_REASON
    return run


def run_batch(pair, method: str, ids: list[list[int]], params: dict, seed: int) -> tuple[list[Run], float]:
    """One `generate_batch` call timed as a whole: a Run per row (its seconds its latency from the batch's
    start) and the batch's wall seconds. TORCH_AR is AR on the torch copy, each row labelled so."""
    on_copy = method == TORCH_AR
    with quiet_gc():
        _sync(pair.device)
        start = time.perf_counter()
        results = generate_batch(on_torch(pair) if on_copy else pair, ids, REFERENCE if on_copy else method,
                                 **{**params, "seed": seed})
        _sync(pair.device)
        seconds = time.perf_counter() - start
    runs = [Run.of(result, result.seconds) for result in results]
    for run in runs if on_copy else ():
        run.stats["runtime"] = TORCH_COPY
    return runs, seconds


class _AssistRecorder:
    """Wraps transformers' candidate generator to read what it drafted and what was kept.

    transformers builds the generator inside `generate`, so the model's factory method
    is shadowed on the instance for the duration of one call.
    """

    def __init__(self):
        self.rounds: list[tuple[int, int]] = []
        self.caps: list[int] = []
        self._drafted = 0

    @contextlib.contextmanager
    def attached(self, model):
        factory = model._get_candidate_generator

        def wrapped_factory(*args, **kwargs):
            generator = factory(*args, **kwargs)
            get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

            def recorded_get(input_ids, **kw):
                cap = getattr(generator, "num_assistant_tokens", getattr(generator, "num_output_tokens", None))
                if cap is not None:
                    self.caps.append(int(cap))
                candidates, logits = get_candidates(input_ids, **kw)
                self._drafted = candidates.shape[-1] - input_ids.shape[-1]
                return candidates, logits

            def recorded_update(input_ids, scores, num_matches):
                self.rounds.append((self._drafted, int(num_matches)))
                return update(input_ids, scores, num_matches)

            generator.get_candidates = recorded_get
            generator.update_candidate_strategy = recorded_update
            return generator

        model._get_candidate_generator = wrapped_factory
        try:
            yield self
        finally:
            del model._get_candidate_generator


# transformers' generate without a draft: one target token a round, like our AR.
HF_AR_METHODS = ("hf-generate", "hf-generate-static")
# Static caches are sized up to a multiple of this, so a compiled peer sees few cache shapes.
STATIC_LENGTH_STEP = 256


class HFRunner:
    """transformers' own decoders, fed exactly what ours are fed.

    hf-generate-static is `generate` with `cache_implementation="static"` and transformers'
    own compiled forward (`get_compiled_call`, used for the decode steps, not the prefill).
    transformers compiles by itself only on CUDA/XPU/TPU; elsewhere the runner asks for it
    through `CompileConfig._compile_all_devices`, in inductor's default mode (CUDA graphs,
    "reduce-overhead", need a GPU). `compile_static=False` keeps the static cache and runs
    the forward eagerly (quick tests). Its cache length is rounded up to
    `STATIC_LENGTH_STEP`, so later prompts reuse the shape compiled in the warm-up.
    """

    def __init__(self, pair, params: DecodeParams, compile_static: bool = True):
        from transformers import GenerationConfig

        self.pair = pair
        self.params = params
        self.compile_static = compile_static
        eos = sorted(pair.eos_ids)
        pad = eos[0] if eos else pair.tokenizer.pad_token_id
        sampled = not params.sampling.greedy
        settings: dict[str, Any] = dict(
            # min_new_tokens alone overrides any min_length of the checkpoint (both set, generate warns).
            max_new_tokens=params.max_new_tokens, min_new_tokens=0, num_beams=1, use_cache=True,
            do_sample=sampled, eos_token_id=eos or None, pad_token_id=pad, repetition_penalty=1.0,
            no_repeat_ngram_size=0,
        )
        if sampled:
            # Explicit values: unset ones would be filled from the checkpoint (e.g. top_k=50).
            settings.update(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, typical_p=1.0,
                            min_p=None, epsilon_cutoff=0.0, eta_cutoff=0.0)
        self.config = GenerationConfig(**settings)
        # Assisted generation's draft LM (a feature head is no LM and never runs here).
        draft_config = getattr(pair.draft, "generation_config", None)
        self.draft_config = copy.deepcopy(draft_config) if draft_config is not None else None

    def _config_for(self, method: str, max_new_tokens: int, prompt_length: int = 0):
        config = copy.deepcopy(self.config)
        config.max_new_tokens = max_new_tokens
        if method == "hf-generate-static":
            self._make_static(config, prompt_length)
        if method == "hf-prompt-lookup":
            config.prompt_lookup_num_tokens = self.params.gamma
            # Our n counts the predicted token; transformers' n-gram is the matched context only.
            config.max_matching_ngram_size = max(1, self.params.ngram_n - 1)
        return config

    def _make_static(self, config, prompt_length: int) -> None:
        from transformers import CompileConfig

        config.cache_implementation = "static"
        # Sized for the run's max_new_tokens (not a warm-up's shorter one), rounded up.
        needed = prompt_length + self.params.max_new_tokens
        length = -(-needed // STATIC_LENGTH_STEP) * STATIC_LENGTH_STEP
        limit = getattr(self.pair.target.config, "max_position_embeddings", None)
        config.max_cache_len = max(needed, min(length, limit)) if limit else length
        if not self.compile_static:
            config.disable_compile = True
            return
        cuda = self.pair.device.type == "cuda"
        compile_config = CompileConfig(mode="reduce-overhead" if cuda else "default")
        compile_config._compile_all_devices = True  # transformers compiles on its own on CUDA only
        config.compile_config = compile_config

    def _prepare_draft(self, method: str) -> None:
        # transformers 5 reads the schedule from the assistant's own generation_config
        # (and the heuristic schedule writes back into it), so set it per call and restore.
        if not method.startswith("hf-assisted"):
            return
        draft_config = copy.deepcopy(self.draft_config)
        if method == "hf-assisted":
            draft_config.num_assistant_tokens = self.params.gamma
            draft_config.num_assistant_tokens_schedule = "constant"
            draft_config.assistant_confidence_threshold = 0.0
        self.pair.draft.generation_config = draft_config

    def run(self, method: str, prompt_ids: list[int], seed: int, max_new_tokens: int | None = None) -> Run:
        pair, device = self.pair, self.pair.device
        config = self._config_for(method, max_new_tokens or self.params.max_new_tokens, len(prompt_ids))
        self._prepare_draft(method)
        extra = {"assistant_model": pair.draft} if method.startswith("hf-assisted") else {}
        recorder = _AssistRecorder()
        attach = recorder.attached(pair.target) if method not in HF_AR_METHODS else contextlib.nullcontext()
        torch.manual_seed(seed)
        try:
            with attach, quiet_gc():
                _sync(device)
                start = time.perf_counter()
                input_ids = torch.tensor([prompt_ids], device=device)
                output = pair.target.generate(
                    input_ids=input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config, **extra
                )
                _sync(device)
                seconds = time.perf_counter() - start
        finally:
            if self.draft_config is not None:
                pair.draft.generation_config = copy.deepcopy(self.draft_config)
        # A decoder-only output repeats the prompt; an encoder-decoder's starts with its decoder start token.
        skip = len(decoder_start(pair.target)) if getattr(pair, "is_encoder_decoder", False) else len(prompt_ids)
        new_ids = output[0, skip:].tolist()
        new_ids = cut_at_eos(new_ids, pair.eos_ids)
        if method in HF_AR_METHODS:
            rounds = [(0, 0)] * len(new_ids)
            gamma = 0.0
        else:
            rounds = recorder.rounds
            caps = recorder.caps
            gamma = sum(caps) / len(caps) if caps else math.nan
        stats = _round_stats(rounds, len(new_ids))
        stats.update(mean_gamma=gamma, draft_forwards=sum(d for d, _ in rounds) if extra else 0)
        stop = "eos" if new_ids and new_ids[-1] in pair.eos_ids else "max_new_tokens"
        stats.update(stop_reason=stop, engine_seconds=math.nan, ttft_s=math.nan, prefill_s=math.nan,
                     draft_seconds=math.nan, verify_seconds=math.nan, mean_entropy=math.nan,
                     cache="static" if method == "hf-generate-static" else "dynamic", compile_seconds=math.nan,
                     # Beside a runtime target, generate runs on its torch copy: set against that copy's AR.
                     runtime=TORCH_COPY if runs_peers_on_torch_copy(pair) else "torch")
        return Run(new_ids, seconds, stats, rounds)


def _round_stats(rounds: list[tuple[int, int]], new_tokens: int) -> dict[str, Any]:
    drafted = sum(d for d, _ in rounds)
    accepted = sum(a for _, a in rounds)
    return {
        "new_tokens": new_tokens, "rounds": len(rounds), "drafted": drafted, "accepted": accepted,
        "acceptance_rate": accepted / drafted if drafted else math.nan,
        "mean_accepted_tokens": new_tokens / len(rounds) if rounds else math.nan,
        "target_forwards": len(rounds),
        "target_forwards_per_token": len(rounds) / new_tokens if new_tokens else math.nan,
        "mean_drafted": drafted / len(rounds) if rounds else math.nan,
    }


def result_for_perplexity(method: str, params: DecodeParams, prompt_ids: list[int], ids: list[int]):
    result = GenerationResult(method, params.as_dict(), list(prompt_ids))
    result.tokens = [TokenRecord(t, "", "target", 0) for t in ids]
    return result
