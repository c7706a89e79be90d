"""A benchmark run: every method on every selected prompt, interleaved and repeated, into
one row per (repeat, prompt, method), a summary and the rounds counted.

May import the other bench modules, ``specdemo.engine`` and ``specdemo.models``; never gradio.
"""

from __future__ import annotations

import contextlib
import math
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
import torch

from ...engine.divergence import DIVERGENCE_COLUMNS, divergence_where_compared
from ...engine.targets.memory import MEMORY_STATS
from ...engine.trace import leviathan_alpha
from ...engine.methods import REFERENCE, is_lossless, matches_reference
from ...engine.params import DecodeParams, EngineOptions
from .runners import (HF_METHODS, RUNTIME_PEERS, TORCH_AR, HFRunner, Run, bench_methods, measured_on,
                      parse_bench_methods, result_for_perplexity, run_ours, with_torch_copy_reference)
from .quality import QUALITY_COLUMNS, reference_scores
from .runtime_peers import RuntimeRunner
from ...models.torch_copy import TORCH_COPY
from .schedule import WARM_UP_TOKENS, Turn, base_seed, check_count, play, schedule, warm_up_turn
from .statistics import summarize
from .batching import BATCH_COLUMNS, BATCH_SUMMARY_COLUMNS, parse_batch_sizes, summarize_batches
from .threads import ThreadPlan
from ..suite import SuitePrompt, as_prompts, conversation, encode_prompt, select_prompts
from . import tables
from .tables import target_perplexity
from .vs_float32 import AGREEMENT_COLUMNS, Float32Reference, agreement, runs_below_float32, target_is_float32

ROW_COLUMNS = [
    "repeat", "prompt_index", "prompt_id", "turn", "category", "method", "label", "drafter", "order", "seed", "threads", "prompt_tokens",
    "new_tokens", "seconds", "tokens_per_s", "engine_seconds", "ttft_s", "prefill_s", "rounds", "copied_rounds", "drafted",
    "accepted", "rejected_rounds", "acceptance_rate", "alpha", "mean_accepted_tokens", "target_forwards",
    "draft_forwards", "target_forwards_per_token",
    "draft_forwards_per_token", "target_flops_per_token", "draft_flops_per_token", "mean_gamma", "mean_drafted", "mean_entropy",
    "draft_seconds", "verify_seconds", "matches_ar", *DIVERGENCE_COLUMNS, "perplexity", *QUALITY_COLUMNS, "stop_reason",
    # runtime: what ran the row's target forwards; reference_runtime: what ran the AR its speedup is over (its
    # own runtime's AR, or the torch copy's AR for a row on the torch copy: transformers' peers beside a runtime).
    "cache", "runtime", "reference_runtime", "exactness", *MEMORY_STATS, "compile_seconds", "error", "note", "node", "device", "output_ids", "text",
    # Against float32 AR of the same target weights on the same prompt and repeat, where a model runs below
    # float32 (bench.vs_float32): that run's seconds and tokens (for speedup_vs_fp32_ar) and the agreement.
    "fp32_ar_seconds", "fp32_ar_new_tokens", *AGREEMENT_COLUMNS,
    # The batch the request ran in (bench.measure.batching): its size, index, the row's place, its wall seconds.
    *BATCH_COLUMNS,
]
ROUND_COLUMNS = ["category", "method", "drafted", "accepted", "count"]
# One row per drafted token of our methods' runs (transformers' peers do not say what decided theirs).
TOKEN_COLUMNS = ["repeat", "prompt_index", "category", *tables.TOKEN_COLUMNS]

Progress = Callable[[int, int, str], None]


@dataclass
class BenchResult:
    rows: pd.DataFrame  # one row per (repeat, prompt, method), ROW_COLUMNS
    summary: pd.DataFrame  # one row per (category, method) plus category "all", SUMMARY_COLUMNS
    rounds: pd.DataFrame  # rounds counted by (category, method, drafted, accepted), ROUND_COLUMNS
    meta: dict[str, Any] = field(default_factory=dict)
    tokens: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TOKEN_COLUMNS))  # TOKEN_COLUMNS
    # One row per (batch size, method): throughput, latencies, the ratio to AR (BATCH_SUMMARY_COLUMNS)
    batches: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=BATCH_SUMMARY_COLUMNS))


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
    threads: ThreadPlan | None = None,
    vs_float32: Float32Reference | None = None,
    prompt_indices: Sequence[int] | None = None,
    cluster: "Cluster | str | None" = None,
    batch: str | int | Sequence[int] | None = None,
    **params: Any,
) -> BenchResult:
    """Run every method on every selected prompt, `repeats` times, and summarise.

    decode is a validated `DecodeParams`; params, the same names as keywords, override it.
    cache and compile are the engine options of our runs (see `EngineOptions`); compile
    time is kept out of `seconds` and reported in `compile_seconds` (the warm-up's, where
    the first compile happens, in `meta["warmup_compile_seconds"]`). transformers' peers
    keep their own settings (hf-generate-static always compiles). threads, when given, sets
    torch's thread count per method for each run (else every run has the process's count);
    each row says which count ran.
    vs_float32, where either model runs below float32, sets every first-turn row against float32 AR
    of the target's weights on the same prompt and repeat (`bench.vs_float32`): AR's own run where
    the target is float32, else a run of vs_float32 after the prompt's methods, timed in no row
    (its total in `meta["fp32_reference_seconds"]`).
    progress(done, total, message) is called after each run; raising from it aborts.
    prompt_indices: these prompts' places in a larger run (a cluster task's): their seeds, order, prompt_index.
    cluster ("ray", "ray://HOST:PORT" or a `bench.measure.cluster.Cluster`): the prompts as tasks on Ray workers, each
    with its own pair (then a `PairSpec` or a name) on one device; the same result, each row naming its node
    and device, a failed task's rows with its reason in `error`; progress counts tasks (docs/cluster.md).
    batch: batch sizes ("1,2,4"): each batch through generate_batch, the methods in turn (`batch_runs`, `batches`).
    """
    decode, sizes = DecodeParams.resolve(decode, **params), _batch_sizes(batch, cluster)
    engine = EngineOptions.from_values(cache=cache, compile=compile)
    check_count("repeats", repeats)
    if cluster is not None:
        return _run_on_cluster(pair, select_prompts(as_prompts(suite), categories, limit), cluster, progress, BenchPart(
            (), (), methods, repeats, warmup, decode, engine.cache, engine.compile, threads, vs_float32 is not None))
    names = with_torch_copy_reference(parse_bench_methods(methods, pair), pair, decode, engine.compile)
    prompts = select_prompts(as_prompts(suite), categories, limit)
    encoded = [_first_turn_ids(pair, item, decode) for item in prompts]
    total = sum(p.turn_count for p in prompts) * len(names) * repeats + (len(names) if warmup else 0)
    session = _Session(pair, decode, engine, names, repeats, total, progress,
                       HFRunner(pair, decode) if any(n in HF_METHODS for n in names) else None, threads,
                       RuntimeRunner(pair, decode) if any(n in RUNTIME_PEERS and n != TORCH_AR for n in names) else None,
                       vs_float32 if vs_float32 is not None and runs_below_float32(pair) else None,
                       measured_on(pair.device), items=prompts, encoded=encoded)
    played = _play(session, prompts, encoded, sizes, warmup, prompt_indices)
    meta = {**_meta(pair, decode, names, prompts, repeats, warmup), **_run_meta(session, threads, names)}
    meta.update(cache=engine.cache_for(pair.device), compile=engine.compile, **played)
    return session.result(meta)


def _batch_sizes(batch, cluster) -> list[int]:
    sizes = parse_batch_sizes(batch)
    if cluster is not None and sizes != [1]:
        raise ValueError("batch sizes above 1 run on the pair loaded here; run them without --cluster")
    return sizes


def _play(session: "_Session", prompts, encoded, sizes: list[int], warmup: bool, indices) -> dict[str, Any]:
    """The warm-up and every timed run, one request at a time or in batches of each size; what the meta
    says of them (the warm-up's compile seconds per method, the batch sizes)."""
    seed = base_seed(session.decode.seed)
    warmup_compile = session.warm_up(encoded[0], seed) if warmup else {}
    if sizes == [1]:
        session.play(schedule(len(prompts), session.names, session.repeats, seed, indices=indices,
                              parts=lambda prompt: prompts[prompt].turn_count))
    else:
        _play_batches(session, prompts, encoded, sizes, seed, warmup)
    return {"warmup_compile_seconds": warmup_compile, **_batch_meta(session.names, sizes)}


def _play_batches(session: "_Session", prompts, encoded, sizes: list[int], base_seed: int, warmup: bool) -> None:
    from .batch_runs import play_batches, runs_planned, warm_up_batches

    session.total = runs_planned(len(prompts), sizes, session.names, session.repeats) + session.done
    if warmup:  # a batch's own shapes and allocations settle before the clock runs
        warm_up_batches(session, [encoded[i % len(encoded)] for i in range(2)], base_seed)
    play_batches(session, prompts, encoded, sizes, base_seed)


def _batch_meta(names: list[str], sizes: list[int]) -> dict[str, Any]:
    from .batch_runs import batch_one_only

    return {"batch_sizes": sizes, **({"batch_one_only": batch_one_only(names, sizes)} if sizes != [1] else {})}


def _run_meta(session: "_Session", threads: ThreadPlan | None, names: list[str]) -> dict[str, Any]:
    """What this run's thread plan and float32 reference were, for the meta."""
    meta: dict[str, Any] = {}
    if threads is not None:
        meta["threads"] = {name: threads.for_method(name) for name in names}
    if session.float32 is not None:
        meta["fp32_reference"] = ("the run's own AR" if not session.float32.loaded_beside(session.pair)
                                  else "AR on a float32 copy of the target, timed in no row")
        meta["fp32_reference_seconds"] = session.float32.seconds
    return meta


def _first_turn_ids(pair, item: SuitePrompt, decode: DecodeParams) -> list[int]:
    try:
        return _turn_ids(pair, item, 1, [], decode)
    except ValueError as error:
        raise ValueError(f"prompt {item.id!r} ({item.category}): {error}") from None


@dataclass
class _Session:
    """One benchmark run's runner and what it has gathered so far."""

    pair: Any
    decode: DecodeParams
    engine: EngineOptions
    names: list[str]
    repeats: int
    total: int
    progress: Progress | None
    hf: HFRunner | None
    threads: ThreadPlan | None = None
    runtime: RuntimeRunner | None = None  # the target runtime's own decoders
    float32: Float32Reference | None = None  # where a model runs below float32
    where: dict[str, str] = field(default_factory=dict)  # the node and device every row names
    done: int = 0
    rows: list[dict] = field(default_factory=list)
    round_counts: dict[tuple[str, str, int, int], int] = field(default_factory=dict)
    token_frames: list[pd.DataFrame] = field(default_factory=list)
    items: list[SuitePrompt] = field(default_factory=list)  # the prompts run, and their first turns' ids
    encoded: list[list[int]] = field(default_factory=list)
    answers: dict[str, list[str]] = field(default_factory=dict)  # each method's answers so far to a question

    def run(self, method: str, ids: list[int], seed: int, max_new_tokens: int | None = None) -> Run:
        with self.threads.applied(method) if self.threads is not None else contextlib.nullcontext():
            if method in HF_METHODS:
                return self.hf.run(method, ids, seed, max_new_tokens)
            if method in RUNTIME_PEERS and method != TORCH_AR:
                return self.runtime.run(method, ids, seed, max_new_tokens)
            values = self.decode_values
            if max_new_tokens is not None:
                values["max_new_tokens"] = max_new_tokens
            return run_ours(self.pair, method, ids, values, seed, **self.engine.as_kwargs())

    def threads_of(self, method: str) -> int:
        return self.threads.for_method(method) if self.threads is not None else torch.get_num_threads()

    @property
    def decode_values(self) -> dict[str, Any]:
        """The decode parameters every run shares; each turn brings its own seed."""
        return {k: v for k, v in self.decode.as_dict().items() if k != "seed"}

    def tick(self, message: str) -> None:
        self.done += 1
        if self.progress:
            self.progress(self.done, self.total, message)

    def warm_up(self, ids: list[int], seed: int) -> dict[str, float]:
        """One short run each (`schedule.warm_up_turn`); the compile seconds each spent."""
        short = min(WARM_UP_TOKENS, self.decode.max_new_tokens)
        compiled = {}
        for step in play([warm_up_turn(self.names, seed)], lambda _, __, method: self.run(method, ids, seed, short)):
            compiled[step.contender] = step.outcome.stats.get("compile_seconds", math.nan)
            self.tick(f"warm-up {step.contender}")
        return compiled

    def play(self, turns: Iterable[Turn]) -> None:
        """Every turn of the interleaving, each method in its turn's order; a turn's rows once all ran."""
        for step in play(turns, self.answer):
            if step.last:
                turn = step.turn
                group = {method: outcome for method, _, outcome in step.ran}
                self.record(group, turn.repeat, turn.index, self.items[turn.prompts[0]], turn.part)

    def row(self, method: str, position: int, turn: Turn, row_index: int, item: SuitePrompt) -> dict:
        """A run's row before its outcome: where it ran in the schedule (row r of a batch seeded seed + r)."""
        return {"repeat": turn.repeat, "prompt_index": turn.places[row_index], "prompt_id": item.id,
                "turn": turn.part, "category": item.category, "method": method, "label": bench_methods()[method],
                "order": position, "seed": turn.seed + row_index, "threads": self.threads_of(method), "error": "",
                **self.where}

    def answer(self, turn: Turn, position: int, method: str) -> tuple[dict, Run | None, list[int]]:
        """One method's answer to one turn: its row so far, its run (None if it failed) and the prompt ids. A
        question of several turns: each method answers turn 1, then turn 2 after its own answer."""
        prompt, ids = turn.prompts[0], []
        item, answers = self.items[prompt], self.answers.setdefault(method, [])
        row = self.row(method, position, turn, 0, item)
        if turn.part == 1:
            answers.clear()
        try:
            ids = (self.encoded[prompt] if turn.part == 1
                   else _turn_ids(self.pair, item, turn.part, answers, self.decode))
            row["prompt_tokens"] = len(ids)
            result = self.run(method, ids, turn.seed)
            answers.append(_text(self.pair, result))
        except Exception as error:  # one broken baseline must not sink a long run
            row["error"] = f"{type(error).__name__}: {error}"
            result = None
        parts = f", turn {turn.part}/{item.turn_count}" if item.turn_count > 1 else ""
        self.tick(f"{item.id} {method} (repeat {turn.repeat + 1}/{self.repeats}{parts})")
        return row, result, ids

    def record(self, group: dict, repeat: int, index: int, item: SuitePrompt, turn: int) -> None:
        """One turn's rows, in the methods' order, each compared with AR's answer on the same turn."""
        reference = group.get(REFERENCE, (None, None, None))[1]
        torch_copy_ar = group.get(TORCH_AR, (None, None, None))[1]
        float32_ar = self.float32_ar(group, reference, turn)
        for method in (m for m in self.names if m in group):  # a batch above 1 leaves out batch-1-only peers
            row, result, ids = group[method]
            if result is not None:
                # A method that ran on the torch copy owes the torch copy's AR its tokens, not the runtime's.
                on_copy = result.stats.get("runtime") == TORCH_COPY and method != TORCH_AR
                ar = torch_copy_ar if on_copy else reference
                _fill_row(row, result, self.pair, self.decode, ids, ar, self.decode.sampling.greedy)
                row["reference_runtime"] = ar.stats.get("runtime", "") if ar is not None else ""
                row.update(reference_scores(row["text"], item.references_for(turn)))
                if float32_ar is not None:
                    row.update(fp32_ar_seconds=float32_ar.seconds, fp32_ar_new_tokens=len(float32_ar.token_ids),
                               **agreement(result.token_ids, row["text"], float32_ar.token_ids,
                                           _text(self.pair, float32_ar)))
                for drafted, accepted in result.rounds:
                    key = (item.category, method, drafted, accepted)
                    self.round_counts[key] = self.round_counts.get(key, 0) + 1
                if result.result is not None and result.result.rounds:
                    decided = tables.tokens_frame([result.result])
                    if not decided.empty:
                        self.token_frames.append(decided.assign(repeat=repeat, prompt_index=index,
                                                                category=item.category)[TOKEN_COLUMNS])
            self.rows.append(row)

    def float32_ar(self, group: dict, reference: Run | None, turn: int) -> Run | None:
        """float32 AR on this turn's prompt: AR's run where the target is float32, else a run on the
        float32 copy. First turns only: a later turn's prompt holds each method's own earlier answer."""
        if self.float32 is None or turn != 1:
            return None
        if target_is_float32(self.pair):
            return reference
        row, _, ids = next(iter(group.values()))
        if not ids:  # the prompt did not fit: every method failed before running
            return None
        values = self.decode_values
        with self.threads.applied(REFERENCE) if self.threads is not None else contextlib.nullcontext():
            model = self.float32.model_for(self.pair)
            if not self.float32.runs:  # its warm-up, as every method has one, untimed
                run_ours(model, REFERENCE, ids, {**values, "max_new_tokens": min(8, self.decode.max_new_tokens)},
                         row["seed"], **self.engine.as_kwargs())
            run = run_ours(model, REFERENCE, ids, values, row["seed"], **self.engine.as_kwargs())
        self.float32.seconds += run.seconds
        self.float32.runs += 1
        return run

    def result(self, meta: dict[str, Any]) -> BenchResult:
        frame = single_batches(pd.DataFrame(self.rows, columns=ROW_COLUMNS))
        rounds = pd.DataFrame([(*k, v) for k, v in self.round_counts.items()], columns=ROUND_COLUMNS)
        tokens = (pd.concat(self.token_frames, ignore_index=True) if self.token_frames
                  else pd.DataFrame(columns=TOKEN_COLUMNS))
        return result_of(frame, self.decode.gamma, rounds, meta, tokens)


def single_batches(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows that ran one request at a time marked as batches of one: each its own batch, numbered per
    (repeat, method) in the run's order, so that each method's n-th batch is AR's n-th."""
    if "batch" not in rows:
        rows = rows.assign(**{c: float("nan") for c in BATCH_COLUMNS})
    alone = rows.batch.isna()
    if alone.any():
        rows = rows.copy()
        rows.loc[alone, "batch"] = 1
        rows.loc[alone, "batch_row"] = 0
        rows.loc[alone, "batch_index"] = rows[alone].groupby(["repeat", "method"]).cumcount()
        rows.loc[alone, "batch_seconds"] = rows.loc[alone, "seconds"]
    return rows


def result_of(rows: pd.DataFrame, gamma: int | None, rounds: pd.DataFrame, meta: dict[str, Any],
              tokens: pd.DataFrame) -> BenchResult:
    """A BenchResult from its rows: the summary over the smallest batch size's rows, and every size's."""
    rows = single_batches(rows)
    smallest = rows[rows.batch == rows.batch.min()] if rows.batch.notna().any() else rows
    return BenchResult(rows, summarize(smallest, gamma, tokens), rounds, meta, tokens, summarize_batches(rows))


def _text(pair, run: Run) -> str:
    return run.result.text if run.result is not None else pair.tokenizer.decode(run.token_ids, skip_special_tokens=True)


def _turn_ids(pair, item: SuitePrompt, turn: int, answers: list[str], decode: DecodeParams) -> list[int]:
    if len(answers) < turn - 1:
        raise ValueError(f"turn {turn - 1} failed, so turn {turn} has no conversation to continue")
    ids = encode_prompt(pair, conversation(item, turn, answers), decode.chat)
    pair.check_fits(ids, decode.max_new_tokens)
    return ids


def _fill_row(row: dict, run: Run, pair, decode: DecodeParams, prompt_ids, reference: Run | None, greedy: bool):
    stats = run.stats
    for name in ROW_COLUMNS:
        if name in stats and name not in row:
            row[name] = stats[name]
    row["new_tokens"] = len(run.token_ids)
    row["seconds"] = run.seconds
    row["tokens_per_s"] = len(run.token_ids) / run.seconds if run.seconds > 0 else math.nan
    # A peer that reports totals only (the runtime's speculative loop) says how many rounds it rejected.
    rejected = stats.get("rejected_rounds", sum(1 for d, a in run.rounds if a < d))
    row["rejected_rounds"] = rejected
    row["alpha"] = leviathan_alpha(row["accepted"], rejected)
    compared = greedy and reference is not None and is_lossless(row["method"])
    ran_with = run.result.params if run.result is not None else {}
    row["matches_ar"] = matches_reference(run.token_ids, ran_with, reference.token_ids) if compared else None
    margins = reference.result.top2_margins if reference is not None and reference.result is not None else []
    row["first_divergence"], row["divergence_margin"] = divergence_where_compared(
        row["matches_ar"], run.token_ids, reference.token_ids if reference is not None else [], margins)
    if greedy:
        row["perplexity"] = math.nan
    else:
        result = run.result or result_for_perplexity(row["method"], decode, prompt_ids, run.token_ids)
        row["perplexity"] = target_perplexity(pair, result)
    row["output_ids"] = " ".join(map(str, run.token_ids))
    row["text"] = _text(pair, run)


def _target_precision(pair) -> str | None:
    """The target's precision as loaded, with the runtime that runs it where that is not torch
    ("onnx fp32"): an int4 runtime target is another model than the fp32 one, never compared as the same."""
    name = getattr(getattr(pair, "target_precision", None), "name", None)
    runtime = getattr(pair, "target_runtime", None)
    return f"{pair.runtime} {runtime.precision}" if runtime is not None else name


def _meta(pair, decode: DecodeParams, names, prompts, repeats, warmup) -> dict[str, Any]:
    import transformers

    device = pair.device
    return {
        "pair": getattr(pair, "name", ""), "target": getattr(pair, "target_ref", ""),
        "draft": getattr(pair, "draft_ref", None), "drafter": getattr(pair, "drafter_name", None),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(next(pair.target.parameters()).dtype).replace("torch.", ""),
        # Each model's precision as loaded: an int8 target computes in float32 and is still not float32's model.
        "target_dtype": _target_precision(pair),
        "draft_dtype": getattr(getattr(pair, "draft_precision", None), "name", None),
        # What greedy output promises against AR on this target (models.precision.verification_exactness).
        "exactness": getattr(pair, "exactness", ""),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "transformers": transformers.__version__,
        "methods": list(names), "prompts": len(prompts), "categories": list(dict.fromkeys(p.category for p in prompts)),
        "repeats": repeats, "warmup": warmup, "params": decode.as_dict(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


@dataclass(frozen=True)
class BenchPart:
    """A task of a cluster run: some of the benchmark's prompts, with their places in the whole, every
    method interleaved on one worker's pair as run_benchmark does."""

    prompts: tuple[SuitePrompt, ...]
    indices: tuple[int, ...]
    methods: str | Sequence[str] | None
    repeats: int
    warmup: bool
    decode: DecodeParams
    cache: str | None
    compile: bool
    threads: ThreadPlan | None
    vs_float32: bool

    def run(self, pair, kept: dict) -> dict:
        """The part's rows, rounds and drafted tokens, and its meta; a worker warms up and loads its
        float32 copy once."""
        reference = kept.setdefault("float32", Float32Reference()) if self.vs_float32 else None
        result = run_benchmark(pair, self.prompts, self.methods, repeats=self.repeats,
                               warmup=self.warmup and not kept.get("warm"), decode=self.decode, cache=self.cache,
                               compile=self.compile, threads=self.threads, vs_float32=reference,
                               prompt_indices=self.indices)
        kept["warm"] = True
        return {"rows": result.rows, "rounds": result.rounds, "tokens": result.tokens, "meta": result.meta}


def _run_on_cluster(pair, prompts: list[SuitePrompt], cluster, progress, part: BenchPart) -> BenchResult:
    """run_benchmark's prompts as tasks on a pool of Ray workers, merged into one BenchResult."""
    from dataclasses import replace

    from .cluster import run_parts

    tasks, outcome, on_cluster = run_parts(pair, cluster, prompts, lambda chunk, indices: replace(
        part, prompts=chunk, indices=indices), progress)
    done = [outcome.results[n] for n in sorted(outcome.results)]
    names = done[0]["meta"]["methods"] if done else parse_bench_methods(part.methods)
    records = [row for d in done for row in d["rows"].to_dict("records")]
    records += [row for f in outcome.failures for row in _failed_rows(tasks[f.index], names, f.reason)]
    records.sort(key=lambda row: (row["repeat"], row["prompt_index"]))  # stable: the run's order within
    rows = pd.DataFrame(records, columns=ROW_COLUMNS)
    counted = [d["rounds"] for d in done if not d["rounds"].empty]
    rounds = (pd.concat(counted).groupby(ROUND_COLUMNS[:-1], sort=False, as_index=False)["count"].sum()
              if counted else pd.DataFrame(columns=ROUND_COLUMNS))
    drafted = [d["tokens"] for d in done if not d["tokens"].empty]
    tokens = (pd.concat(drafted).sort_values(["repeat", "prompt_index"], kind="stable", ignore_index=True)
              if drafted else pd.DataFrame(columns=TOKEN_COLUMNS))
    meta = dict(done[0]["meta"]) if done else {"methods": part.methods, "repeats": part.repeats}
    meta.update(prompts=len(prompts), categories=list(dict.fromkeys(p.category for p in prompts)),
                stopped=outcome.stopped, cluster=on_cluster,
                errors=[{"task": f.label, "attempts": f.attempts, "reason": f.reason} for f in outcome.failures])
    return result_of(rows, part.decode.gamma, rounds, meta, tokens)


def _failed_rows(part: BenchPart, names: list[str], reason: str) -> list[dict]:
    """The rows a failed part would have written, each with the reason in `error`."""
    return [{"repeat": repeat, "prompt_index": index, "prompt_id": item.id, "turn": turn, "category": item.category,
             "method": method, "label": bench_methods().get(method, method), "error": reason}
            for repeat in range(part.repeats) for index, item in zip(part.indices, part.prompts)
            for turn in range(1, item.turn_count + 1) for method in names]
