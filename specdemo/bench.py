"""`python -m specdemo bench`: our decoders against transformers' own, on a prompt suite.

Every method gets the same prompt token ids (chat template included), the same
max_new_tokens, the same EOS ids and min_new_tokens=0, and only new tokens are counted.
Methods are interleaved per prompt, their order rotated one place per prompt and per
repeat, so that drift of a shared machine hits all of them alike.

Definitions used in the tables (written into the report too):
  seconds         wall time of one call, prompt ids in → new ids out, the device
                  synchronised before both clock reads; our methods and transformers'
                  are timed the same way.
  tokens_per_s    per repeat Σ new tokens / Σ seconds over the category's prompts;
                  mean ± std over repeats.
  speedup vs R    geometric mean over prompts of  t_R(p) / t_m(p),  where t_x(p) is the
                  time per new token of method x on prompt p (Σ seconds / Σ new tokens
                  over the repeats). When both produce the same tokens (greedy runs that
                  match) this is exactly the ratio of per-prompt times. Its std is over
                  repeats of the same statistic computed per repeat.
  α (alpha)       Leviathan's per-token acceptance probability: accepted / (accepted +
                  rounds that ended in a rejection), the maximum-likelihood estimate
                  under their i.i.d. model. `acceptance_rate` is accepted / drafted.
  c (cost_ratio)  drafting time per draft token / time of one AR target step, both from
                  the traces of the same run (SD's draft_seconds / draft_forwards against
                  AR's verify_seconds / target_forwards, per category).
  predicted       (1 − α^(γ+1)) / ((1 − α)(γc + 1)), against the measured speedup vs AR.
  predicted_v     the same with the measured verification cost v in place of 1:
                  (1 − α^(γ+1)) / ((1 − α)(γc + v)), v = time of one verification forward
                  (γ+1 tokens) / one AR step (`verify_cost_ratio`). Leviathan assume v = 1,
                  which holds on a memory-bound GPU and not on a compute-bound CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import html
import json
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
import torch

from . import cli
from .decoding import generate
from .methods import METHODS
from .params import DecodeParams
from .tables import target_perplexity
from .trace import GenerationResult, TokenRecord

DEFAULT_SUITE = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "suite.jsonl"
SUITE_CATEGORIES = ("chat", "translation", "summarisation", "rag", "math", "code")
ALL = "all"

HF_METHODS: dict[str, tuple[str, str]] = {
    "hf-generate": ("HF generate", "transformers' model.generate (greedy or the same sampling settings)"),
    "hf-assisted": ("HF assisted (γ)", "assisted generation with our draft, γ tokens a round, constant, no confidence stop"),
    "hf-assisted-default": ("HF assisted (defaults)", "assisted generation with our draft and transformers' default schedule"),
    "hf-prompt-lookup": ("HF prompt lookup", "prompt-lookup decoding, γ tokens, matching up to n−1 tokens"),
}
DEFAULT_BENCH_METHODS = ("ar", "sd", "nasd", "egag", "hf-generate", "hf-assisted", "hf-prompt-lookup")
# Methods whose γ is fixed, so Leviathan's formula applies to them.
_PREDICTABLE = ("sd", "nasd", "hf-assisted")

ROW_COLUMNS = [
    "repeat", "prompt_index", "prompt_id", "category", "method", "label", "order", "seed", "prompt_tokens",
    "new_tokens", "seconds", "tokens_per_s", "engine_seconds", "ttft_s", "prefill_s", "rounds", "drafted",
    "accepted", "rejected_rounds", "acceptance_rate", "alpha", "mean_accepted_tokens", "target_forwards",
    "draft_forwards", "target_forwards_per_token", "mean_gamma", "mean_drafted", "mean_entropy",
    "draft_seconds", "verify_seconds", "matches_ar", "perplexity", "stop_reason", "error", "output_ids", "text",
]
SUMMARY_COLUMNS = [
    "category", "method", "label", "prompts", "runs", "errors", "new_tokens_mean", "tokens_per_s_mean",
    "tokens_per_s_std", "speedup_vs_ar", "speedup_vs_ar_std", "speedup_vs_hf", "speedup_vs_hf_std",
    "acceptance_rate", "alpha", "mean_accepted_tokens", "target_forwards_per_token", "mean_gamma",
    "mean_drafted", "exact_match_pct", "perplexity", "cost_ratio", "verify_cost_ratio", "predicted_speedup",
    "predicted_speedup_v",
]
ROUND_COLUMNS = ["category", "method", "drafted", "accepted", "count"]

Progress = Callable[[int, int, str], None]


# --------------------------------------------------------------------------- the suite

class SuiteError(ValueError):
    """A prompt suite is missing, malformed or selects nothing; the message says where."""


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    category: str
    prompt: str
    # Earlier turns of a multi-turn chat, the last one the user's; None for a single turn.
    messages: tuple[tuple[str, str], ...] | None = None


def load_suite(source: str | Path | Iterable[dict]) -> list[SuitePrompt]:
    """Read and validate a suite: a JSONL file (one {"prompt", "category"} object a line,
    optional "id" and "messages") or the same objects as an iterable."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise SuiteError(f"suite file not found: {path}")
        records = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    records.append((f"{path.name}:{number}", json.loads(line)))
                except json.JSONDecodeError as error:
                    raise SuiteError(f"{path.name}:{number}: not valid JSON ({error.msg})") from None
        name = path.name
    else:
        records = [(f"item {i + 1}", item) for i, item in enumerate(source)]
        name = "suite"
    if not records:
        raise SuiteError(f"{name}: the suite is empty; each line needs a JSON object with 'prompt' and 'category'")
    prompts, seen = [], set()
    for where, item in records:
        category = item.get("category") if isinstance(item, dict) else None
        number = 1 + sum(1 for p in prompts if p.category == (category.strip() if isinstance(category, str) else None))
        prompt = _suite_item(where, item, number)
        if prompt.id in seen:
            raise SuiteError(f"{where}: duplicate id {prompt.id!r}")
        seen.add(prompt.id)
        prompts.append(prompt)
    return prompts


def _suite_item(where: str, item: Any, number: int) -> SuitePrompt:
    if not isinstance(item, dict):
        raise SuiteError(f"{where}: expected a JSON object with 'prompt' and 'category', got {type(item).__name__}")
    missing = [key for key in ("prompt", "category") if key not in item]
    if missing:
        raise SuiteError(f"{where}: missing {' and '.join(repr(k) for k in missing)}")
    prompt, category = item["prompt"], item["category"]
    if not isinstance(prompt, str) or not prompt.strip():
        raise SuiteError(f"{where}: 'prompt' must be a non-empty string")
    if not isinstance(category, str) or not category.strip():
        raise SuiteError(f"{where}: 'category' must be a non-empty string")
    messages = item.get("messages")
    if messages is not None:
        ok = isinstance(messages, list) and messages and all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant", "system")
            and isinstance(m.get("content"), str) for m in messages
        )
        if not ok or messages[-1]["role"] != "user":
            raise SuiteError(f"{where}: 'messages' must be a list of {{'role', 'content'}} objects ending with a user turn")
        messages = tuple((m["role"], m["content"]) for m in messages)
    prompt_id = str(item.get("id") or f"{category.strip()}-{number}")
    return SuitePrompt(prompt_id, category.strip(), prompt, messages)


def select_prompts(
    suite: Sequence[SuitePrompt], categories: str | Sequence[str] | None = None, limit: int | None = None
) -> list[SuitePrompt]:
    """The suite's prompts in the given categories (all if None), the first `limit` of each."""
    present = list(dict.fromkeys(p.category for p in suite))
    if isinstance(categories, str):
        categories = [c.strip() for c in categories.split(",") if c.strip()]
    if categories:
        unknown = [c for c in categories if c not in present]
        if unknown:
            raise SuiteError(f"no prompts in categor{'y' if len(unknown) == 1 else 'ies'} "
                             f"{', '.join(map(repr, unknown))}; the suite has {', '.join(present)}")
        wanted = list(dict.fromkeys(categories))
    else:
        wanted = present
    if limit is not None and (isinstance(limit, bool) or int(limit) < 1):
        raise SuiteError(f"limit must be an integer ≥ 1 (prompts per category), got {limit!r}")
    chosen = []
    for category in wanted:
        items = [p for p in suite if p.category == category]
        chosen.extend(items[: int(limit)] if limit else items)
    return chosen


def encode_prompt(pair, item: SuitePrompt, chat: bool) -> list[int]:
    """Token ids every method is fed: through the chat template when chat is on."""
    if item.messages is None:
        return pair.encode(item.prompt, chat=chat)
    if chat:
        if not getattr(pair.tokenizer, "chat_template", None):
            raise ValueError("chat: this model's tokenizer has no chat template; turn chat off")
        text = pair.tokenizer.apply_chat_template(
            [{"role": r, "content": c} for r, c in item.messages], tokenize=False, add_generation_prompt=True
        )
        return pair.tokenizer(text, add_special_tokens=False)["input_ids"]
    transcript = "\n".join(f"{r.capitalize()}: {c}" for r, c in item.messages) + "\nAssistant:"
    return pair.encode(transcript, chat=False)


# --------------------------------------------------------------------------- methods

def bench_methods() -> dict[str, str]:
    """Every method the benchmark knows, name → label."""
    return {**{name: m.label for name, m in METHODS.items()}, **{n: label for n, (label, _) in HF_METHODS.items()}}


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
        needs = [n for n in names if (n in METHODS and METHODS[n].needs_draft) or n.startswith("hf-assisted")]
        if needs:
            raise ValueError(f"method(s) {', '.join(needs)} need a draft model; load the pair with a draft "
                             "or drop them")
    return names


@dataclass
class _Run:
    token_ids: list[int]
    seconds: float
    stats: dict[str, Any]
    rounds: list[tuple[int, int]]  # (drafted, accepted) per round
    result: GenerationResult | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _quiet_gc():
    """Collect before a timed call and not during it: a collection mid-run is noise."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run_ours(pair, method: str, prompt_ids: list[int], params: dict, seed: int) -> _Run:
    device = pair.device
    with _quiet_gc():
        _sync(device)
        start = time.perf_counter()
        result = generate(pair, prompt_ids, method, **{**params, "seed": seed})
        _sync(device)
        seconds = time.perf_counter() - start
    stats = dict(result.stats)
    stats["engine_seconds"] = stats.pop("seconds")
    stats["prefill_s"] = result.prefill_seconds
    rounds = [(len(r.drafted), r.accepted) for r in result.rounds]
    return _Run(result.token_ids, seconds, stats, rounds, result)


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


class _HFRunner:
    """transformers' own decoders, fed exactly what ours are fed."""

    def __init__(self, pair, params: DecodeParams):
        from transformers import GenerationConfig

        self.pair = pair
        self.params = params
        eos = sorted(pair.eos_ids)
        pad = eos[0] if eos else pair.tokenizer.pad_token_id
        sampled = not params.sampling.greedy
        settings: dict[str, Any] = dict(
            max_new_tokens=params.max_new_tokens, min_new_tokens=0, min_length=0, num_beams=1, use_cache=True,
            do_sample=sampled, eos_token_id=eos or None, pad_token_id=pad, repetition_penalty=1.0,
            no_repeat_ngram_size=0,
        )
        if sampled:
            # Explicit values: unset ones would be filled from the checkpoint (e.g. top_k=50).
            settings.update(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, typical_p=1.0,
                            min_p=None, epsilon_cutoff=0.0, eta_cutoff=0.0)
        self.config = GenerationConfig(**settings)
        self.draft_config = copy.deepcopy(pair.draft.generation_config) if pair.draft is not None else None

    def _config_for(self, method: str, max_new_tokens: int):
        config = copy.deepcopy(self.config)
        config.max_new_tokens = max_new_tokens
        if method == "hf-prompt-lookup":
            config.prompt_lookup_num_tokens = self.params.gamma
            # Our n counts the predicted token; transformers' n-gram is the matched context only.
            config.max_matching_ngram_size = max(1, self.params.ngram_n - 1)
        return config

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

    def run(self, method: str, prompt_ids: list[int], seed: int, max_new_tokens: int | None = None) -> _Run:
        pair, device = self.pair, self.pair.device
        config = self._config_for(method, max_new_tokens or self.params.max_new_tokens)
        self._prepare_draft(method)
        extra = {"assistant_model": pair.draft} if method.startswith("hf-assisted") else {}
        recorder = _AssistRecorder()
        attach = recorder.attached(pair.target) if method != "hf-generate" else contextlib.nullcontext()
        torch.manual_seed(seed)
        try:
            with attach, _quiet_gc():
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
        new_ids = output[0, len(prompt_ids):].tolist()
        new_ids = _cut_at_eos(new_ids, pair.eos_ids)
        if method == "hf-generate":
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
                     draft_seconds=math.nan, verify_seconds=math.nan, mean_entropy=math.nan)
        return _Run(new_ids, seconds, stats, rounds)


def _cut_at_eos(ids: list[int], eos_ids) -> list[int]:
    for i, token in enumerate(ids):
        if token in eos_ids:
            return ids[: i + 1]
    return ids


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


def _result_for_perplexity(method: str, params: DecodeParams, prompt_ids: list[int], ids: list[int]):
    result = GenerationResult(method, params.as_dict(), list(prompt_ids))
    result.tokens = [TokenRecord(t, "", "target", 0) for t in ids]
    return result


# --------------------------------------------------------------------------- the run

@dataclass
class BenchResult:
    rows: pd.DataFrame  # one row per (repeat, prompt, method), ROW_COLUMNS
    summary: pd.DataFrame  # one row per (category, method) plus category "all", SUMMARY_COLUMNS
    rounds: pd.DataFrame  # rounds counted by (category, method, drafted, accepted), ROUND_COLUMNS
    meta: dict[str, Any] = field(default_factory=dict)
    _figures: dict | None = field(default=None, repr=False)

    @property
    def figures(self) -> dict[str, Any]:
        """Plotly figures by name: speedup_vs_ar, speedup_vs_hf, tokens_per_s, acceptance,
        acceptance_by_category, predicted_vs_measured."""
        if self._figures is None:
            self._figures = make_figures(self)
        return self._figures


def run_benchmark(
    pair,
    suite: str | Path | Iterable[dict] | Sequence[SuitePrompt] | None = None,
    methods: str | Sequence[str] | None = None,
    *,
    repeats: int = 3,
    categories: str | Sequence[str] | None = None,
    limit: int | None = None,
    warmup: bool = True,
    progress: Progress | None = None,
    **params: Any,
) -> BenchResult:
    """Run every method on every selected prompt, `repeats` times, and summarise.

    params are decoding parameters (max_new_tokens, temperature, top_k, top_p, seed,
    gamma, gamma_min, gamma_max, ema, ngram_n, ngram_storage, top_k_filler, chat).
    progress(done, total, message) is called after each run; raising from it aborts.
    """
    decode = DecodeParams.from_values(**params)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer ≥ 1, got {repeats!r}")
    names = parse_bench_methods(methods, pair)
    items = suite if suite is not None else DEFAULT_SUITE
    if not (isinstance(items, Sequence) and items and all(isinstance(p, SuitePrompt) for p in items)):
        items = load_suite(items)
    prompts = select_prompts(items, categories, limit)
    encoded = []
    for index, item in enumerate(prompts):
        try:
            ids = encode_prompt(pair, item, decode.chat)
            pair.check_fits(ids, decode.max_new_tokens)
        except ValueError as error:
            raise ValueError(f"prompt {item.id!r} ({item.category}): {error}") from None
        encoded.append(ids)
    our_params = {k: v for k, v in decode.as_dict().items() if k != "seed"}
    hf = _HFRunner(pair, decode) if any(n in HF_METHODS for n in names) else None
    base_seed = decode.seed if decode.seed is not None else 1234
    greedy = decode.sampling.greedy

    def run(method, ids, seed, max_new_tokens=None) -> _Run:
        if method in HF_METHODS:
            return hf.run(method, ids, seed, max_new_tokens)
        values = our_params if max_new_tokens is None else {**our_params, "max_new_tokens": max_new_tokens}
        return _run_ours(pair, method, ids, values, seed)

    total = len(prompts) * len(names) * repeats + (len(names) if warmup else 0)
    done = 0
    if warmup:
        # One short run each: allocator pools, lazy imports and kernel choices settle first.
        for method in names:
            run(method, encoded[0], base_seed, max_new_tokens=min(8, decode.max_new_tokens))
            done += 1
            if progress:
                progress(done, total, f"warm-up {method}")

    rows: list[dict] = []
    round_counts: dict[tuple[str, str, int, int], int] = {}
    for repeat in range(repeats):
        for index, (item, ids) in enumerate(zip(prompts, encoded)):
            shift = (repeat + index) % len(names)
            order = names[shift:] + names[:shift]
            seed = base_seed + 1000 * repeat + index
            group: dict[str, tuple[dict, _Run | None]] = {}
            for position, method in enumerate(order):
                row = {"repeat": repeat, "prompt_index": index, "prompt_id": item.id, "category": item.category,
                       "method": method, "label": bench_methods()[method], "order": position, "seed": seed,
                       "prompt_tokens": len(ids), "error": ""}
                try:
                    result = run(method, ids, seed)
                except Exception as error:  # one broken baseline must not sink a long run
                    row["error"] = f"{type(error).__name__}: {error}"
                    result = None
                group[method] = (row, result)
                done += 1
                if progress:
                    progress(done, total, f"{item.id} {method} (repeat {repeat + 1}/{repeats})")
            reference = group.get("ar", (None, None))[1]
            for method in names:
                row, result = group[method]
                if result is not None:
                    _fill_row(row, result, pair, decode, ids, reference, greedy)
                    for drafted, accepted in result.rounds:
                        key = (item.category, method, drafted, accepted)
                        round_counts[key] = round_counts.get(key, 0) + 1
                rows.append(row)

    frame = pd.DataFrame(rows, columns=ROW_COLUMNS)
    rounds = pd.DataFrame([(*k, v) for k, v in round_counts.items()], columns=ROUND_COLUMNS)
    meta = _meta(pair, decode, names, prompts, repeats, warmup)
    return BenchResult(frame, summarize(frame, decode.gamma), rounds, meta)


def _fill_row(row: dict, run: _Run, pair, decode: DecodeParams, prompt_ids, reference: _Run | None, greedy: bool):
    stats = run.stats
    for name in ROW_COLUMNS:
        if name in stats and name not in row:
            row[name] = stats[name]
    row["new_tokens"] = len(run.token_ids)
    row["seconds"] = run.seconds
    row["tokens_per_s"] = len(run.token_ids) / run.seconds if run.seconds > 0 else math.nan
    rejected = sum(1 for d, a in run.rounds if a < d)
    row["rejected_rounds"] = rejected
    trials = row["accepted"] + rejected
    row["alpha"] = row["accepted"] / trials if trials else math.nan
    row["matches_ar"] = (run.token_ids == reference.token_ids) if greedy and reference is not None else None
    if greedy:
        row["perplexity"] = math.nan
    else:
        result = run.result or _result_for_perplexity(row["method"], decode, prompt_ids, run.token_ids)
        row["perplexity"] = target_perplexity(pair, result)
    row["output_ids"] = " ".join(map(str, run.token_ids))
    row["text"] = run.result.text if run.result is not None else pair.tokenizer.decode(
        run.token_ids, skip_special_tokens=True)


def _meta(pair, decode: DecodeParams, names, prompts, repeats, warmup) -> dict[str, Any]:
    import transformers

    device = pair.device
    return {
        "pair": getattr(pair, "name", ""), "target": getattr(pair, "target_ref", ""),
        "draft": getattr(pair, "draft_ref", None), "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(next(pair.target.parameters()).dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "methods": list(names), "prompts": len(prompts), "categories": list(dict.fromkeys(p.category for p in prompts)),
        "repeats": repeats, "warmup": warmup, "params": decode.as_dict(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


# --------------------------------------------------------------------------- the summary

def _geomean(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _speedup(sub: pd.DataFrame, method: str, reference: str) -> tuple[float, float]:
    """Geometric mean over prompts of the reference's time per token / the method's (see module doc)."""
    def per_token(frame):
        grouped = frame.groupby("prompt_index")[["seconds", "new_tokens"]].sum()
        return grouped["seconds"] / grouped["new_tokens"].where(grouped["new_tokens"] > 0)

    mine, ref = sub[sub.method == method], sub[sub.method == reference]
    if mine.empty or ref.empty:
        return math.nan, math.nan
    ratio = (per_token(ref) / per_token(mine)).dropna()
    overall = _geomean(ratio.tolist())
    per_repeat = []
    for repeat in sorted(sub.repeat.unique()):
        r = (per_token(ref[ref.repeat == repeat]) / per_token(mine[mine.repeat == repeat])).dropna()
        if len(r):
            per_repeat.append(_geomean(r.tolist()))
    spread = float(pd.Series(per_repeat).std()) if len(per_repeat) > 1 else math.nan
    return overall, spread


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator and math.isfinite(denominator) and denominator > 0 else math.nan


def leviathan_speedup(alpha: float, gamma: float, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Expected speedup of SD over AR: (1 − α^(γ+1)) / ((1 − α)(γc + v)), v = 1 in the paper."""
    if not all(math.isfinite(x) for x in (alpha, gamma, cost_ratio, verify_cost)):
        return math.nan
    tokens = gamma + 1 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * cost_ratio + verify_cost)


def summarize(rows: pd.DataFrame, gamma: int | None = None) -> pd.DataFrame:
    """One row per (category, method), plus every method over category 'all'."""
    ok = rows[rows.error.fillna("") == ""] if "error" in rows else rows
    methods = list(dict.fromkeys(rows.method))
    categories = list(dict.fromkeys(rows.category)) + [ALL]
    out = []
    for category in categories:
        sub = ok if category == ALL else ok[ok.category == category]
        ar = sub[sub.method == "ar"]
        ar_step = _ratio(ar.verify_seconds.sum(), ar.target_forwards.sum()) if not ar.empty else math.nan
        sd = sub[sub.method == "sd"]
        sd_cost = _ratio(sd.draft_seconds.sum(), sd.draft_forwards.sum()) if not sd.empty else math.nan
        for method in methods:
            mine = sub[sub.method == method]
            everything = rows[(rows.method == method) & ((rows.category == category) if category != ALL else True)]
            per_repeat = mine.groupby("repeat")[["new_tokens", "seconds"]].sum()
            tps = per_repeat.new_tokens / per_repeat.seconds
            speed_ar, speed_ar_std = _speedup(sub, method, "ar")
            speed_hf, speed_hf_std = _speedup(sub, method, "hf-generate")
            drafted, accepted = mine.drafted.sum(), mine.accepted.sum()
            trials = accepted + mine.rejected_rounds.sum()
            matches = mine.matches_ar.dropna()
            row = {
                "category": category, "method": method, "label": bench_methods().get(method, method),
                "prompts": mine.prompt_index.nunique(), "runs": len(mine), "errors": len(everything) - len(mine),
                "new_tokens_mean": mine.new_tokens.mean(),
                "tokens_per_s_mean": tps.mean() if len(tps) else math.nan,
                "tokens_per_s_std": tps.std() if len(tps) > 1 else math.nan,
                "speedup_vs_ar": speed_ar, "speedup_vs_ar_std": speed_ar_std,
                "speedup_vs_hf": speed_hf, "speedup_vs_hf_std": speed_hf_std,
                "acceptance_rate": _ratio(accepted, drafted) if drafted else math.nan,
                "alpha": _ratio(accepted, trials) if trials else math.nan,
                "mean_accepted_tokens": _ratio(mine.new_tokens.sum(), mine.rounds.sum()),
                "target_forwards_per_token": _ratio(mine.target_forwards.sum(), mine.new_tokens.sum()),
                "mean_gamma": mine.mean_gamma.mean(),
                "mean_drafted": _ratio(drafted, mine.rounds.sum()),
                "exact_match_pct": 100.0 * matches.astype(bool).mean() if len(matches) else math.nan,
                "perplexity": mine.perplexity.mean() if mine.perplexity.notna().any() else math.nan,
                "cost_ratio": math.nan, "verify_cost_ratio": math.nan, "predicted_speedup": math.nan,
                "predicted_speedup_v": math.nan,
            }
            if method in _PREDICTABLE and not mine.empty:
                if method == "nasd":
                    slots = (mine.rounds * mine.mean_gamma).sum()
                    cost = _ratio(_ratio(mine.draft_seconds.sum(), slots), ar_step)
                else:
                    # transformers' assistant is our draft model: price its forward from our SD.
                    cost = _ratio(sd_cost, ar_step)
                g = gamma if gamma is not None else row["mean_gamma"]
                row["cost_ratio"] = cost
                # transformers' verification is not timed apart; ours verifies the same γ+1 tokens.
                timed = sd if method == "hf-assisted" else mine
                verify = _ratio(_ratio(timed.verify_seconds.sum(), timed.target_forwards.sum()), ar_step)
                row["verify_cost_ratio"] = verify
                row["predicted_speedup"] = leviathan_speedup(row["alpha"], g, cost)
                row["predicted_speedup_v"] = leviathan_speedup(row["alpha"], g, cost, verify)
            out.append(row)
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


# --------------------------------------------------------------------------- figures and report

def _category_order(summary: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(summary.category))


def make_figures(result: BenchResult) -> dict[str, Any]:
    import plotly.graph_objects as go

    summary = result.summary
    categories = _category_order(summary)
    methods = list(dict.fromkeys(summary.method))
    figures: dict[str, Any] = {}

    def bars(column: str, std: str | None, title: str, ytitle: str, skip: tuple[str, ...] = (), line: float | None = None):
        fig = go.Figure()
        for method in methods:
            if method in skip:
                continue
            part = summary[summary.method == method].set_index("category").reindex(categories)
            if part[column].notna().sum() == 0:
                continue
            fig.add_bar(name=bench_methods().get(method, method), x=categories, y=part[column],
                        error_y=dict(type="data", array=part[std].fillna(0)) if std else None)
        if line is not None:
            fig.add_hline(y=line, line_dash="dot", line_color="grey")
        fig.update_layout(title=title, barmode="group", xaxis_title="category", yaxis_title=ytitle,
                          legend_title="method", template="plotly_white")
        return fig

    figures["speedup_vs_ar"] = bars("speedup_vs_ar", "speedup_vs_ar_std", "Speedup over our AR, per category",
                                    "speedup (× AR)", skip=("ar",), line=1.0)
    figures["speedup_vs_hf"] = bars("speedup_vs_hf", "speedup_vs_hf_std", "Speedup over transformers' generate",
                                    "speedup (× hf-generate)", skip=("hf-generate",), line=1.0)
    figures["tokens_per_s"] = bars("tokens_per_s_mean", "tokens_per_s_std", "Throughput", "new tokens / s")

    # Distribution of accepted drafts per round, over rounds that drafted something.
    rounds = result.rounds[result.rounds.drafted > 0]
    fig = go.Figure()
    for method in methods:
        part = rounds[rounds.method == method]
        if part.empty:
            continue
        counts = part.groupby("accepted")["count"].sum()
        fig.add_bar(name=bench_methods().get(method, method), x=counts.index.tolist(),
                    y=(counts / counts.sum()).tolist())
    fig.update_layout(title="Accepted drafts per round (rounds that drafted)", barmode="group",
                      xaxis_title="drafts accepted in the round", yaxis_title="fraction of rounds",
                      legend_title="method", template="plotly_white")
    figures["acceptance"] = fig

    runs = result.rows[(result.rows.error.fillna("") == "") & result.rows.acceptance_rate.notna()]
    fig = go.Figure()
    for method in methods:
        part = runs[runs.method == method]
        if part.empty:
            continue
        fig.add_box(name=bench_methods().get(method, method), x=part.category, y=part.acceptance_rate,
                    boxpoints="all", jitter=0.3)
    fig.update_layout(title="Acceptance rate per run, by category", boxmode="group", xaxis_title="category",
                      yaxis_title="accepted / drafted", legend_title="method", template="plotly_white")
    figures["acceptance_by_category"] = fig

    fig = go.Figure()
    predicted = summary[summary.predicted_speedup.notna() & summary.speedup_vs_ar.notna()]
    for method in dict.fromkeys(predicted.method):
        part = predicted[predicted.method == method]
        fig.add_scatter(name=bench_methods().get(method, method), x=part.predicted_speedup, y=part.speedup_vs_ar,
                        mode="markers+text", text=part.category, textposition="top center", marker_size=10,
                        customdata=part[["alpha", "cost_ratio"]].to_numpy(),
                        hovertemplate="%{text}<br>predicted %{x:.2f}×, measured %{y:.2f}×"
                                      "<br>α=%{customdata[0]:.2f}, c=%{customdata[1]:.3f}<extra></extra>")
        fig.add_scatter(name=f"{bench_methods().get(method, method)}, measured verify cost",
                        x=part.predicted_speedup_v, y=part.speedup_vs_ar, mode="markers", text=part.category,
                        marker=dict(size=10, symbol="circle-open"), customdata=part[["verify_cost_ratio"]].to_numpy(),
                        hovertemplate="%{text}<br>predicted with v=%{customdata[0]:.2f}: %{x:.2f}×, "
                                      "measured %{y:.2f}×<extra></extra>")
    values = pd.concat([predicted.predicted_speedup, predicted.predicted_speedup_v, predicted.speedup_vs_ar]).dropna()
    low, high = (min(0.5, values.min()), max(1.5, values.max())) if len(values) else (0.5, 1.5)
    fig.add_scatter(name="measured = predicted", x=[low, high], y=[low, high], mode="lines",
                    line=dict(dash="dot", color="grey"))
    fig.update_layout(title="Leviathan predicted vs measured speedup over AR", xaxis_title="predicted (× AR)",
                      yaxis_title="measured (× AR)", legend_title="method", template="plotly_white")
    figures["predicted_vs_measured"] = fig
    return figures


_REPORT_SECTIONS = [
    ("speedup_vs_ar", "Speedup over our AR"),
    ("speedup_vs_hf", "Speedup over transformers' generate"),
    ("tokens_per_s", "Throughput"),
    ("acceptance", "Acceptance distribution"),
    ("acceptance_by_category", "Acceptance by category"),
    ("predicted_vs_measured", "Predicted vs measured speedup"),
]


def report_html(result: BenchResult, path: str | Path | None = None, plotlyjs: str = "inline") -> str:
    """A single HTML page with the summary tables and the figures; written to path if given.

    plotlyjs="inline" embeds plotly.js (works offline, ~4 MB); "cdn" links to it.
    """
    if plotlyjs not in ("inline", "cdn"):
        raise ValueError(f"plotlyjs must be 'inline' or 'cdn', got {plotlyjs!r}")
    meta, summary = result.meta, result.summary
    parts = []
    for i, (name, title) in enumerate(_REPORT_SECTIONS):
        fig = result.figures[name]
        include = (True if plotlyjs == "inline" else "cdn") if i == 0 else False
        parts.append(f'<h2>{html.escape(title)}</h2>\n'
                     + fig.to_html(full_html=False, include_plotlyjs=include, div_id=f"fig-{name}"))
    pivot = summary.pivot_table(index="category", columns="method", values="speedup_vs_ar", sort=False)
    shown = ["category", "method", "runs", "tokens_per_s_mean", "tokens_per_s_std", "speedup_vs_ar",
             "speedup_vs_hf", "acceptance_rate", "alpha", "mean_accepted_tokens", "target_forwards_per_token",
             "mean_gamma", "exact_match_pct", "perplexity", "cost_ratio", "verify_cost_ratio", "predicted_speedup",
             "predicted_speedup_v", "errors"]
    table = summary[shown].to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="–", border=0,
                                   classes="summary")
    params = ", ".join(f"{k}={v}" for k, v in meta.get("params", {}).items())
    info = (f"pair <b>{html.escape(str(meta.get('pair')))}</b> (target {html.escape(str(meta.get('target')))}, "
            f"draft {html.escape(str(meta.get('draft')))}) on {html.escape(str(meta.get('device')))} "
            f"({html.escape(str(meta.get('device_name')))}, {meta.get('threads')} threads), "
            f"dtype {meta.get('dtype')}; torch {meta.get('torch')}, transformers {meta.get('transformers')}; "
            f"{meta.get('prompts')} prompts × {meta.get('repeats')} repeats; {html.escape(params)}; {meta.get('time')}")
    definitions = html.escape(__doc__.split("Definitions used in the tables (written into the report too):")[1])
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>specdemo benchmark</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }}
table.summary, table.pivot {{ border-collapse: collapse; font-size: 13px; }}
table.summary td, table.summary th, table.pivot td, table.pivot th {{ padding: 3px 8px; border-bottom: 1px solid #ddd; text-align: right; }}
pre {{ background: #f6f6f6; padding: 1em; white-space: pre-wrap; font-size: 13px; }}
</style></head><body>
<h1>Speculative decoding benchmark</h1>
<p>{info}</p>
<h2>Speedup over our AR (geometric mean over prompts)</h2>
{pivot.to_html(float_format=lambda v: f"{v:.2f}", na_rep="–", border=0, classes="pivot")}
{''.join(parts)}
<h2>Summary</h2>
{table}
<h2>Definitions</h2>
<pre>{definitions}</pre>
</body></html>
"""
    if path is not None:
        Path(path).write_text(page, encoding="utf-8")
    return page


def write_outputs(result: BenchResult, csv: str | Path | None = None, summary_csv: str | Path | None = None,
                  report: str | Path | None = None, plotlyjs: str = "inline") -> list[Path]:
    """The rows CSV (plus, beside it, *.rounds.csv and *.meta.json so `load_result` can
    rebuild the report), the summary CSV and the HTML report; each only if a path is given."""
    written = []
    extras = []
    if csv:
        stem = str(Path(csv).with_suffix(""))
        extras = [(stem + ".rounds.csv", result.rounds)]
    for target, frame in ((csv, result.rows), (summary_csv, result.summary), *extras):
        if target:
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            frame.to_csv(target, index=False)
            written.append(Path(target))
    if csv:
        meta_path = Path(str(Path(csv).with_suffix("")) + ".meta.json")
        meta_path.write_text(json.dumps(result.meta, indent=1, default=str), encoding="utf-8")
        written.append(meta_path)
    if report:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        report_html(result, report, plotlyjs)
        written.append(Path(report))
    return written


def load_result(csv: str | Path) -> BenchResult:
    """Rebuild a BenchResult (summary and figures recomputed) from what write_outputs wrote."""
    stem = str(Path(csv).with_suffix(""))
    rows = pd.read_csv(csv, keep_default_na=True)
    rows["error"] = rows["error"].astype(object).where(rows["error"].notna(), "")
    rounds_path, meta_path = Path(stem + ".rounds.csv"), Path(stem + ".meta.json")
    rounds = pd.read_csv(rounds_path) if rounds_path.is_file() else pd.DataFrame(columns=ROUND_COLUMNS)
    meta = json.loads(meta_path.read_text(encoding="utf-8")) if meta_path.is_file() else {}
    gamma = meta.get("params", {}).get("gamma")
    return BenchResult(rows, summarize(rows, gamma), rounds, meta)


# --------------------------------------------------------------------------- the command

def _arguments(parser: argparse.ArgumentParser) -> None:
    suite = parser.add_argument_group("suite")
    suite.add_argument("--suite", default=str(DEFAULT_SUITE),
                       help="JSONL, one {\"prompt\": ..., \"category\": ...} a line (optional \"id\", \"messages\")")
    suite.add_argument("--categories", default=None, help="comma-separated categories to run (default: all of them)")
    suite.add_argument("--limit", type=int, default=None, help="at most this many prompts per category")
    suite.add_argument("--repeats", type=int, default=3, help="timed runs of every (prompt, method)")
    suite.add_argument("--no-warmup", dest="warmup", action="store_false", help="skip the untimed warm-up runs")
    suite.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (default: torch's choice); 1 is steadier on a busy shared CPU")
    cli.add_model_arguments(parser)
    cli.add_decoding_arguments(parser)
    for action in parser._actions:
        if action.dest == "methods":
            action.default = ",".join(DEFAULT_BENCH_METHODS)
            action.help = f"comma-separated, from: {', '.join(bench_methods())}"
    out = parser.add_argument_group("output")
    out.add_argument("--csv", help="one row per (prompt, method, repeat)")
    out.add_argument("--summary-csv", help="one row per (category, method); default: next to --csv as *.summary.csv")
    out.add_argument("--report", help="HTML report with the figures")
    out.add_argument("--plotlyjs", choices=("inline", "cdn"), default="inline",
                     help="embed plotly.js in the report (offline) or link it from a CDN")
    out.add_argument("--quiet", action="store_true", help="no progress bar")


def _bench(args: argparse.Namespace) -> int:
    """Benchmark our decoders against transformers' on a prompt suite."""
    chat_default = not args.target and (args.pair or "embedded") == "embedded"
    params = cli.decoding_params(args, chat_default=chat_default)
    DecodeParams.from_values(**params)  # fail on bad values before loading models
    if args.repeats < 1:
        raise ValueError(f"repeats must be an integer ≥ 1, got {args.repeats}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"threads must be an integer ≥ 1, got {args.threads}")
    methods = parse_bench_methods(args.methods)
    suite = select_prompts(load_suite(args.suite), args.categories, args.limit)
    threads = torch.get_num_threads()
    if args.threads:
        # Spin-waiting worker threads collapse when another process holds a core, so a
        # shared machine often runs faster, and far steadier, on fewer threads.
        torch.set_num_threads(args.threads)
    try:
        return _bench_with(args, params, methods, suite)
    finally:
        torch.set_num_threads(threads)


def _bench_with(args, params, methods, suite) -> int:
    from tqdm.auto import tqdm

    pair = cli.pair_from_args(args)
    bar = None if args.quiet else tqdm(total=1, unit="run", dynamic_ncols=True)

    def progress(done: int, total: int, message: str) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)
            bar.set_postfix_str(message, refresh=False)

    try:
        result = run_benchmark(pair, suite, methods, repeats=args.repeats, warmup=args.warmup,
                               progress=progress, **params)
    finally:
        if bar is not None:
            bar.close()
    summary_csv = args.summary_csv
    if args.csv and not summary_csv:
        summary_csv = str(Path(args.csv).with_suffix("")) + ".summary.csv"
    _print_summary(result)
    for path in write_outputs(result, args.csv, summary_csv, args.report, args.plotlyjs):
        print(f"wrote {path}")
    return 0


def _print_summary(result: BenchResult) -> None:
    shown = ["category", "method", "tokens_per_s_mean", "tokens_per_s_std", "speedup_vs_ar", "speedup_vs_hf",
             "acceptance_rate", "mean_accepted_tokens", "exact_match_pct", "predicted_speedup", "errors"]
    with pd.option_context("display.max_columns", None, "display.width", 200, "display.float_format", "{:.3f}".format):
        print(result.summary[result.summary.category == ALL][shown].to_string(index=False))
    errors = result.rows[result.rows.error.fillna("") != ""]
    for _, row in errors.drop_duplicates("method").iterrows():
        print(f"warning: {row.method} failed on {len(errors[errors.method == row.method])} run(s): {row.error}")


cli.SUBCOMMANDS["bench"] = (_arguments, _bench)
