"""Running a sweep: AR and every setting on every prompt, interleaved.

On each (prompt, repeat) AR and every setting run one after the other, the order rotated
one place per prompt and per repeat, so drift of a shared machine hits all alike and every
speedup is a ratio to AR on the same prompt in the same repeat. `iter_sweep` yields a
`SweepEvent` after each run (the page streams them); `run_sweep` runs to the end.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ...engine.methods import METHODS, REFERENCE
from ...engine.params import DecodeParams
from ..measure.schedule import WARM_UP_TOKENS, Step, Turn, base_seed, check_count, play, schedule, warm_up_turn
from ..measure.runners import measured_on, run_batch, run_ours
from ...engine.runtimes import refusal, runtime_reason
from ...models.torch_copy import TORCH_COPY_AR, on_torch
from ..measure.tables import tokens_frame
from ..suite import SuitePrompt, as_prompts, encode_prompt, select_prompts
from .grid import AR, TORCH_COPY_AR_SETTING, Setting
from .rows import group_rows, rows_frame
from .summary import SweepResult, merged_result, sweep_meta, sweep_result

Progress = Callable[[int, int, str], None]


@dataclass
class SweepEvent:
    """Progress of a sweep: yielded after every run, and once more at the end (finished)."""

    done: int
    total: int
    message: str
    rows: list[dict]  # every finished row so far (grows in place)
    new_rows: list[dict] = field(default_factory=list)  # the rows this event added
    tokens: list[dict] = field(default_factory=list)  # one per drafted token so far, TOKEN_COLUMNS (grows in place)
    finished: bool = False
    stopped: bool = False  # should_stop() ended the sweep early


def iter_sweep(
    pair,
    prompts: Sequence[SuitePrompt] | Sequence[str] | str | Path | None,
    settings: Sequence[Setting],
    *,
    repeats: int = 2,
    categories: str | Sequence[str] | None = None,
    limit: int | None = None,
    warmup: bool = True,
    should_stop: Callable[[], bool] | None = None,
    prompt_indices: Sequence[int] | None = None,
    batch: int = 1,
    **params: Any,
) -> Iterator[SweepEvent]:
    """Run AR and every setting on every prompt, `repeats` times; yield a SweepEvent after
    each run. Rows of a (prompt, repeat) are added once all of its runs finished (they
    need AR's). should_stop() is asked after each run: true ends the sweep there, and the
    finished runs of the current prompt are kept. params are the shared decode
    parameters (max_new_tokens, temperature, top_k, top_p, seed, chat, ...); each setting
    overrides its own. Closing the iterator stops after the run in progress.
    prompt_indices: each prompt's place in a larger sweep these prompts are a part of (a task of a
    cluster run), which sets its seed, its order and its rows' prompt_index.
    batch: requests decoded together; above 1 the prompts are cut into batches of that size, each run by AR
    and every setting in turn through `generate_batch` (`measure.runners.run_batch`); every row says its batch.
    """
    check_count("repeats", repeats)
    check_count("batch", batch)
    base = DecodeParams.from_values(**params)
    runs = sweep_runs(pair, settings, base)
    for setting in runs if batch > 1 else ():  # what a batch cannot run (a tree, a loop of its own) refused first
        refused = refusal(pair, setting.method, DecodeParams.from_values(**{**base.as_dict(), **setting.params()}),
                          batch=batch)
        if refused:
            raise ValueError(f"sweep: {setting.label} at a batch above 1: {refused}")
    items = select_prompts(as_prompts(prompts), categories, limit)
    encoded = []
    for item in items:
        try:
            ids = encode_prompt(pair, item, base.chat)
            pair.check_fits(ids, base.max_new_tokens)
        except ValueError as error:
            raise ValueError(f"prompt {item.id!r} ({item.category}): {error}") from None
        encoded.append(ids)
    return _sweep(pair, items, encoded, runs, repeats, warmup, should_stop, base, prompt_indices, batch)


def sweep_runs(pair, settings: Sequence[Setting], base: DecodeParams) -> list[Setting]:
    """AR, then each setting once, checked against the pair; where one runs on the torch copy of a runtime
    target (a tree the runtime cannot verify: `engine.runtimes.runtime_reason`, as the benchmark decides
    it), AR on that copy last, the reference its speedup and its tokens are set against."""
    runs = [AR] + [s for s in dict.fromkeys(settings) if s.method not in (REFERENCE, TORCH_COPY_AR)]
    on_copy = False
    for setting in runs:
        if setting.method not in METHODS:
            raise ValueError(f"sweep: unknown method {setting.method!r}")
        if METHODS[setting.method].needs_draft and pair.draft is None:
            raise ValueError(f"sweep: {setting.label} needs a draft model; load the pair with a draft or drop it")
        checked = DecodeParams.from_values(**{**base.as_dict(), **setting.params()})
        # What torch runs the runtime refuses runs on the torch copy, except torch's own loops: a sweep refuses those.
        copied = runtime_reason(pair, setting.method, checked)
        refused = refusal(pair, setting.method, checked) if METHODS[setting.method].torch_loop or not copied \
            else refusal(on_torch(pair), setting.method, checked)
        if refused:
            raise ValueError(f"sweep: {refused}")
        on_copy = on_copy or bool(copied)
    return [*runs, TORCH_COPY_AR_SETTING] if on_copy else runs


def _sweep(pair, items, encoded, runs, repeats, warmup, should_stop, base: DecodeParams,
           indices=None, batch: int = 1) -> Iterator[SweepEvent]:
    """Every run through `schedule.play`: a warm-up run of each method, then every (prompt, repeat), or every
    (batch, repeat) above batch 1, each setting once in its turn's order."""
    shared = {k: v for k, v in base.as_dict().items() if k != "seed"}
    seed = base_seed(base.seed)
    warm = list({s.method: s for s in reversed(runs)}.values())[::-1] if warmup else []  # one per method
    turns = itertools.chain([warm_up_turn(warm, seed)] if warm else [],
                            schedule(len(items), runs, repeats, seed, sizes=[batch] if batch > 1 else None,
                                     indices=indices))
    total = len(warm) + -(-len(items) // batch) * len(runs) * repeats  # a run a prompt, or a run a batch
    rows: list[dict] = []
    tokens: list[dict] = []
    where = measured_on(pair.device)  # each row names the node and device that measured it

    def run(turn: Turn, _: int, setting: Setting):
        """A Run per request of the turn (a setting on one prompt: `run_ours`; on a batch: `run_batch`), and
        the turn's wall seconds; a warm-up's run is short."""
        params = {**shared, **setting.params(), **({"max_new_tokens": min(WARM_UP_TOKENS, base.max_new_tokens)}
                                                   if turn.warm else {})}
        if turn.size == 1:
            alone = run_ours(pair, setting.method, encoded[turn.prompts[0]], params, turn.seed)
            return [alone], alone.seconds
        return run_batch(pair, setting.method, [encoded[i] for i in turn.prompts], params, turn.seed)

    done = 0
    for step in play(turns, run, should_stop):
        done += 1
        turn, label = step.turn, step.contender.label
        new: list[dict] = []
        if turn.warm:
            message = f"warm-up {label}"
        else:
            if step.last:
                new, drafted = _rows(step, items, encoded, runs, base, where)
                rows.extend(new)
                tokens.extend(drafted)
            message = (f"batch {turn.index + 1} {label} (batch {batch}, repeat {turn.repeat + 1}/{repeats})"
                       if batch > 1 else f"{items[turn.prompts[0]].id} {label} (repeat {turn.repeat + 1}/{repeats})")
        yield SweepEvent(done, total, message, rows, new, tokens=tokens)
        if step.stopped:
            yield SweepEvent(done, total, "stopped", rows, finished=True, stopped=True, tokens=tokens)
            return
    yield SweepEvent(done, total, "done", rows, finished=True, tokens=tokens)


def _rows(step: Step, items, encoded, runs, base: DecodeParams, where: dict) -> tuple[list[dict], list[dict]]:
    """A finished turn's rows (per request of the turn: every setting that ran, in grid order, marked with its
    batch) and its drafted tokens."""
    turn = step.turn
    ranked = sorted(step.ran, key=lambda ran: runs.index(ran[0]))
    seconds = {setting.key: outcome[1] for setting, _, outcome in ranked}
    rows, tokens = [], []
    for row_index, prompt in enumerate(turn.prompts):
        group = [(setting, position, outcome[0][row_index]) for setting, position, outcome in ranked]
        new = group_rows(items[prompt], turn.places[row_index], turn.repeat, turn.seed + row_index, encoded[prompt],
                         group, base.sampling.greedy)
        for row in new:
            row.update(where, temperature=base.temperature, batch=turn.size, batch_index=turn.index,
                       batch_row=row_index, batch_seconds=seconds[row["setting"]])
        rows += new
        tokens += _token_rows(group, items[prompt], turn.repeat)
    return rows, tokens


TOKEN_COLUMNS = ["setting", "label", "prompt_id", "repeat", *tokens_frame([]).columns]


def _token_rows(group, item, repeat) -> list[dict]:
    """The drafted tokens of one (prompt, repeat)'s runs, each marked with its setting."""
    out = []
    for setting, _, run in group:
        if run.result is not None and run.result.rounds:
            frame = tokens_frame([run.result])
            frame = frame.assign(setting=setting.key, label=setting.label, prompt_id=item.id, repeat=repeat)
            out += frame[TOKEN_COLUMNS].to_dict("records")
    return out


def run_sweep(
    pair,
    prompts: Sequence[SuitePrompt] | Sequence[str] | str | Path | None,
    settings: Sequence[Setting],
    *,
    repeats: int = 2,
    categories: str | Sequence[str] | None = None,
    limit: int | None = None,
    warmup: bool = True,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    cluster: "Cluster | str | None" = None,
    batch: int = 1,
    **params: Any,
) -> SweepResult:
    """iter_sweep to the end; progress(done, total, message) after each run.

    cluster ("ray", "ray://HOST:PORT" or a `bench.measure.cluster.Cluster`): the prompts are split into tasks
    that a pool of Ray workers runs, each worker with its own copy of the pair on one device, every
    task's prompts with AR and every setting interleaved as here; pair is then a `PairSpec` or a preset
    or target name, and progress counts tasks. The result is the one this run would leave, each row
    naming its node and device; tasks that failed are in `errors`."""
    if cluster is not None and batch != 1:
        raise ValueError("a batch above 1 runs on the pair loaded here; sweep it without --cluster")
    if cluster is not None:
        runs = [AR] + [s for s in dict.fromkeys(settings) if s.method != REFERENCE]
        return _run_on_cluster(pair, prompts, runs, cluster, repeats=repeats, categories=categories, limit=limit,
                               warmup=warmup, progress=progress, should_stop=should_stop, params=params)
    runs = sweep_runs(pair, settings, DecodeParams.from_values(**params))
    events = iter_sweep(pair, prompts, runs, repeats=repeats, categories=categories, limit=limit, warmup=warmup,
                        should_stop=should_stop, batch=batch, **params)
    event = None
    for event in events:
        if progress is not None:
            progress(event.done, event.total, event.message)
    assert event is not None
    return sweep_result(pair, event.rows, runs, repeats=repeats, warmup=warmup, stopped=event.stopped,
                        tokens=event.tokens, **params)


@dataclass(frozen=True)
class SweepPart:
    """A task of a cluster run: some of the sweep's prompts, with their places in the whole, run with
    AR and every setting interleaved on one worker's pair."""

    prompts: tuple[SuitePrompt, ...]
    indices: tuple[int, ...]
    settings: tuple[Setting, ...]
    repeats: int
    warmup: bool
    params: dict

    def run(self, pair, kept: dict) -> dict:
        """The part's rows, drafted tokens and the meta of the worker's pair; a worker warms up once."""
        events = iter_sweep(pair, self.prompts, self.settings, repeats=self.repeats,
                            warmup=self.warmup and not kept.get("warm"), prompt_indices=self.indices, **self.params)
        last = collections.deque(events, maxlen=1)[0]
        kept["warm"] = True
        meta = sweep_meta(pair, DecodeParams.from_values(**self.params), list(self.settings), rows_frame(last.rows),
                          self.repeats, self.warmup)
        return {"rows": last.rows, "tokens": last.tokens, "meta": meta}


def _run_on_cluster(pair, prompts, runs, cluster, *, repeats, categories, limit, warmup, progress, should_stop,
                    params) -> SweepResult:
    """run_sweep's prompts as tasks on a pool of Ray workers, merged into one SweepResult."""
    from ..measure.cluster import run_parts

    check_count("repeats", repeats)
    DecodeParams.from_values(**params)  # bad values fail before the cluster is reached
    tasks, outcome, on_cluster = run_parts(
        pair, cluster, select_prompts(as_prompts(prompts), categories, limit),
        lambda chunk, indices: SweepPart(chunk, indices, tuple(runs), repeats, warmup, dict(params)),
        progress, should_stop)
    failures = [(f.index, f.label, f.attempts, f.reason) for f in outcome.failures]
    return merged_result([([item.id for item in task.prompts], outcome.results.get(n)) for n, task in enumerate(tasks)],
                         failures, runs, repeats=repeats, stopped=outcome.stopped,
                         extra={"cluster": on_cluster})
