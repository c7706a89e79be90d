"""A benchmark run: every method on every selected prompt, interleaved and repeated, into
one row per (repeat, prompt, method), a summary and the rounds counted.

May import the other bench modules, ``specdemo.engine`` and ``specdemo.models``; never gradio.
"""

from __future__ import annotations

import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
import torch

from ..engine.params import DecodeParams, EngineOptions
from .runners import HF_METHODS, HFRunner, Run, bench_methods, parse_bench_methods, result_for_perplexity, run_ours
from .statistics import summarize
from .suite import DEFAULT_SUITE, SuitePrompt, encode_prompt, load_suite, select_prompts
from .tables import target_perplexity

ROW_COLUMNS = [
    "repeat", "prompt_index", "prompt_id", "category", "method", "label", "drafter", "order", "seed", "prompt_tokens",
    "new_tokens", "seconds", "tokens_per_s", "engine_seconds", "ttft_s", "prefill_s", "rounds", "copied_rounds", "drafted",
    "accepted", "rejected_rounds", "acceptance_rate", "alpha", "mean_accepted_tokens", "target_forwards",
    "draft_forwards", "target_forwards_per_token", "mean_gamma", "mean_drafted", "mean_entropy",
    "draft_seconds", "verify_seconds", "matches_ar", "perplexity", "stop_reason", "cache", "compile_seconds",
    "error", "output_ids", "text",
]
ROUND_COLUMNS = ["category", "method", "drafted", "accepted", "count"]

Progress = Callable[[int, int, str], None]


@dataclass
class BenchResult:
    rows: pd.DataFrame  # one row per (repeat, prompt, method), ROW_COLUMNS
    summary: pd.DataFrame  # one row per (category, method) plus category "all", SUMMARY_COLUMNS
    rounds: pd.DataFrame  # rounds counted by (category, method, drafted, accepted), ROUND_COLUMNS
    meta: dict[str, Any] = field(default_factory=dict)


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
    decode: DecodeParams | None = None,
    cache: str | None = None,
    compile: bool = False,
    **params: Any,
) -> BenchResult:
    """Run every method on every selected prompt, `repeats` times, and summarise.

    decode is a validated `DecodeParams`; params, the same names as keywords, override it.
    cache and compile are the engine options of our runs (see `EngineOptions`); compile
    time is kept out of `seconds` and reported in `compile_seconds` (the warm-up's, where
    the first compile happens, in `meta["warmup_compile_seconds"]`). transformers' peers
    keep their own settings (hf-generate-static always compiles).
    progress(done, total, message) is called after each run; raising from it aborts.
    """
    decode = DecodeParams.resolve(decode, **params)
    engine = EngineOptions.from_values(cache=cache, compile=compile)
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
    hf = HFRunner(pair, decode) if any(n in HF_METHODS for n in names) else None
    base_seed = decode.seed if decode.seed is not None else 1234
    greedy = decode.sampling.greedy

    def run(method, ids, seed, max_new_tokens=None) -> Run:
        if method in HF_METHODS:
            return hf.run(method, ids, seed, max_new_tokens)
        values = our_params if max_new_tokens is None else {**our_params, "max_new_tokens": max_new_tokens}
        return run_ours(pair, method, ids, values, seed, **engine.as_kwargs())

    total = len(prompts) * len(names) * repeats + (len(names) if warmup else 0)
    done = 0
    warmup_compile: dict[str, float] = {}
    if warmup:
        # One short run each: allocator pools, lazy imports, kernel choices and compiled graphs settle first.
        for method in names:
            warm = run(method, encoded[0], base_seed, max_new_tokens=min(8, decode.max_new_tokens))
            warmup_compile[method] = warm.stats.get("compile_seconds", math.nan)
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
            group: dict[str, tuple[dict, Run | None]] = {}
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
    meta.update(cache=engine.cache_for(pair.device), compile=engine.compile, warmup_compile_seconds=warmup_compile)
    return BenchResult(frame, summarize(frame, decode.gamma), rounds, meta)


def _fill_row(row: dict, run: Run, pair, decode: DecodeParams, prompt_ids, reference: Run | None, greedy: bool):
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
        result = run.result or result_for_perplexity(row["method"], decode, prompt_ids, run.token_ids)
        row["perplexity"] = target_perplexity(pair, result)
    row["output_ids"] = " ".join(map(str, run.token_ids))
    row["text"] = run.result.text if run.result is not None else pair.tokenizer.decode(
        run.token_ids, skip_special_tokens=True)


def _meta(pair, decode: DecodeParams, names, prompts, repeats, warmup) -> dict[str, Any]:
    import transformers

    device = pair.device
    return {
        "pair": getattr(pair, "name", ""), "target": getattr(pair, "target_ref", ""),
        "draft": getattr(pair, "draft_ref", None), "drafter": getattr(pair, "drafter_name", None),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(next(pair.target.parameters()).dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "methods": list(names), "prompts": len(prompts), "categories": list(dict.fromkeys(p.category for p in prompts)),
        "repeats": repeats, "warmup": warmup, "params": decode.as_dict(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
