"""A batch of requests through one target forward per round.

Every row is a request of its own: its drafter (with its own cache, γ policy and random stream),
its sequence, its trace and its stop. A round drafts for each row still running, verifies every
row's drafts in one forward of the batched target (`targets.batched.BatchedLM`), then settles each
row with the chain round's own verdict (`chain_round.settle_chain`), so a row accepts exactly what
it would accept alone. A row that stops (EOS or its limit) leaves the batch at once.

Timing: every row's clock starts with the batch, so a row's `seconds` is its latency (the prefill
included) and its first round's `end_seconds` its time to first token. In a round, a row's
`draft_seconds` is the round's drafting (every row's, which the row waits for before the shared
forward), and `verify_seconds` the rest of the round's wall time (the shared forward and the rows'
settling); `batch_rows_drafting` counts, round by round, the rows that proposed drafts.

Rows whose drafters declare a `batch_group` (the feature head and the draft LM on torch) draft together:
one forward a draft step over every row still drafting, each at its own position with its own cache (a
draft LM's rows share one batched cache, made at `join_batch`); a row whose γ policy stopped, or that
copies from its context this round, leaves the step. NASD and REST, which need no forward, propose row by row.

A batch of one is the single-request loop itself (`decoding.iter_generate`), unchanged.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from .chain_round import settle_chain
from .decoding import check_stop, learn_after_request, record_round, generate
from .drafters.base import Drafter, NoDrafter
from .methods import FIXED_GAMMA, get_method
from .params import DecodeParams
from .rounds import Decoding
from .runtimes import refusal
from .targets.batched import BatchedLM
from .targets.kv_policy import prepare_caches
from .trace import GenerationResult

# What a batch row promises against AR on a target whose rows were bit-exact alone: its attention runs
# over a masked slot axis, so its sums may differ from AR's step in their last bits.
BATCHED_EXACTNESS = "exact in a batch of {}"


def generate_batch(pair, prompts: Sequence[str | Sequence[int]], method: str = FIXED_GAMMA, limits=None,
                   decode: DecodeParams | None = None, **params) -> list[GenerationResult]:
    """Decode every prompt to its end, a batch of len(prompts) rows through one target forward per
    round; one `GenerationResult` per prompt, in order. Row i samples with the seed + i.

    Chain methods run in a batch (AR, SD, EGAG, NASD, REST, the adaptive stops); trees, beam search,
    AR without a cache, the draft alone, KV policies and encoder-decoder pairs are refused with the
    reason. Bad input raises a ValueError before anything is decoded.
    """
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts: give at least one prompt")
    decode_params = DecodeParams.resolve(decode, **params)
    if len(prompts) == 1:
        return [generate(pair, prompts[0], method, limits, decode_params)]
    spec = get_method(method)
    refused = refusal(pair, method, decode_params, batch=len(prompts))
    if refused:
        raise ValueError(refused)
    decode_params, note = spec.fit(decode_params)
    encoded = []
    for row, prompt in enumerate(prompts):
        try:
            ids = pair.encode(prompt, chat=decode_params.chat)
            encoded.append(ids)
            if limits is not None:
                limits.check_request(ids, decode_params.max_new_tokens)
            pair.check_fits(ids, decode_params.max_new_tokens)
        except ValueError as error:
            raise ValueError(f"prompt {row + 1} of {len(prompts)}: {error}") from error
    seed = decode_params.seed if decode_params.seed is not None else random.randrange(2**31)
    return _decode(pair, spec, decode_params, encoded, seed, note)


@dataclass
class _Row:
    """One request of the batch: its decoding (the row's view of the target as its writer), sequence and trace."""

    run: Decoding
    sequence: list[int]
    result: GenerationResult
    proposal: object = None
    draft_seconds: float = 0.0


class _RowWriter:
    """What a round's settling asks of its writer, for one row of the batched target."""

    def __init__(self, target: BatchedLM, row: int):
        self.target, self.row = target, row
        self.hidden: torch.Tensor | None = None

    def note_fed(self, ids: list[int]) -> None:
        self.target.note_fed(self.row, ids)


def _decode(pair, spec, params: DecodeParams, encoded: list[list[int]], seed: int, note: str) -> list[GenerationResult]:
    target = BatchedLM(pair.target, len(encoded), pair.vocab_size)
    rows = [_start_row(pair, spec, params, ids, seed + i, target, i, note) for i, ids in enumerate(encoded)]
    drafters = [row.run.drafter for row in rows]
    for group in _batch_groups(drafters).values():
        type(group[0]).join_batch(group)
    features = drafters[0].reads_target_features
    if features:
        target.read_features(drafters[0].feature_layers)
    try:
        with torch.inference_mode():
            started = time.perf_counter()
            states = target.prefill({i: row.sequence[:-1] for i, row in enumerate(rows)}, hidden=features)
            for i, row in enumerate(rows):
                row.run.drafter.start(row.sequence, states[i] if features else None)
            _wait(pair.device)
            prefill = time.perf_counter() - started
        for i, row in enumerate(rows):
            row.result.prefill_seconds = row.result.seconds = prefill
            row.result.memory["target_kv_bytes_peak"] = target.kv_bytes_peak
        running = dict(enumerate(rows))
        while running:
            _round(pair, params, target, running, started, features)
        for row in rows:
            learn_after_request(row.result, row.run.drafter, pair, row.sequence)
    finally:
        target.close()
        for drafter in drafters:
            drafter.close()
    return [row.result for row in rows]


def _start_row(pair, spec, params: DecodeParams, ids: list[int], seed: int, target: BatchedLM, index: int,
               note: str) -> _Row:
    drafter, policy = spec.build(pair, params)
    drafter = drafter or NoDrafter(pair.device)
    generator = torch.Generator(device=pair.device)
    generator.manual_seed(seed)
    drafter.use_cache("dynamic", None, buckets=(1, 2))
    writer = _RowWriter(target, index)
    run = Decoding(writer, drafter, policy, params.sampling, generator, None, pair.eos_ids)
    result = GenerationResult(spec.name, {**params.as_dict(), "seed": seed}, list(ids), note=note,
                              threads=torch.get_num_threads())
    result.memory = prepare_caches(params, pair, target, drafter)
    result.cache, result.drafter = "dynamic", drafter.describe(pair.drafter_name)
    result.exactness = _row_exactness(pair.exactness, target_rows=len(target.cached_ids))
    _mark_row(result, index, len(target.cached_ids))
    return _Row(run, list(ids), result)


def _round(pair, params: DecodeParams, target: BatchedLM, running: dict[int, _Row], started: float,
           features: bool) -> None:
    """One round of every running row: their drafts, one forward over all of them, each row settled."""
    with torch.inference_mode():
        begun = time.perf_counter()
        _propose(params, running)
        _wait(pair.device)
        drafting = time.perf_counter() - begun
        rows_drafting = sum(len(row.proposal.tokens) > 0 for row in running.values())
        for row in running.values():
            row.draft_seconds = drafting
            row.result.batch_rows_drafting.append(rows_drafting)
        n_out = {i: len(row.proposal.tokens) + 1 for i, row in running.items()}
        logits, states = target.forward({i: (row.sequence, row.proposal.tokens) for i, row in running.items()},
                                        n_out, hidden=features)
        finished = []
        for i, row in running.items():
            row.run.writer.hidden = states[i]
            outcome = settle_chain(row.run, row.proposal, logits[i], states[i])
            verified_from = len(row.sequence)
            row.sequence.extend(outcome.new_tokens)
            row.run.drafter.observe(row.sequence, verified_from, **outcome.shown_to_drafter())
            row.run.policy.update(len(outcome.drafts), outcome.accepted)
            _wait(pair.device)
            elapsed = time.perf_counter() - started
            record_round(row.result, outcome, [row.draft_seconds, elapsed - row.result.seconds - row.draft_seconds],
                    pair, row.sequence)
            row.result.target_forwards += 1
            row.result.draft_forwards = row.run.drafter.forwards
            row.result.memory["target_kv_bytes_peak"] = target.kv_bytes_peak
            check_stop(row.result, params.max_new_tokens, pair)
            if row.result.done:
                finished.append(i)
    target.drop(*finished)
    for i in finished:
        running.pop(i).run.drafter.close()


def _propose(params: DecodeParams, running: dict[int, _Row]) -> None:
    """Every running row's proposal: rows whose drafters share a batch group draft together (one forward
    a draft step for all of them), the others alone, each with its own γ policy and random stream."""
    groups = _batch_groups(list(running.values()), drafter_of=lambda row: row.run.drafter)
    for row in running.values():
        if row.run.drafter.batch_group is None:
            limit = params.max_new_tokens - len(row.result.tokens) - 1
            row.proposal = row.run.drafter.propose(row.sequence, row.run.policy, limit, row.run.sampling,
                                                   row.run.generator)
    for rows in groups.values():
        drafters = [row.run.drafter for row in rows]
        proposals = type(drafters[0]).propose_together(
            drafters, [row.sequence for row in rows], [row.run.policy for row in rows],
            [params.max_new_tokens - len(row.result.tokens) - 1 for row in rows], rows[0].run.sampling,
            [row.run.generator for row in rows])
        for row, proposal in zip(rows, proposals):
            row.proposal = proposal


def _batch_groups(items: list, drafter_of=lambda drafter: drafter) -> dict[tuple, list]:
    """The items whose drafters draft together, by their drafters' kind and shared batch_group."""
    groups: dict[tuple, list] = {}
    for item in items:
        drafter = drafter_of(item)
        if drafter.batch_group is not None:
            groups.setdefault((type(drafter), id(drafter.batch_group)), []).append(item)
    return groups


def _row_exactness(exactness: str, target_rows: int) -> str:
    return BATCHED_EXACTNESS.format(target_rows) if exactness == "bit-exact" else exactness


def _mark_row(result: GenerationResult, row: int, rows: int) -> GenerationResult:
    result.batch_row, result.batch_size = row, rows
    return result


def _wait(device: torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
