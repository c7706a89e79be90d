"""A recorded target: one greedy AR run kept, and any chain method's rounds replayed from it exactly.

Under greedy decoding a lossless method's output is AR's whatever it drafts, so every round starts on a
prefix of AR's text, and a drafter's proposal depends only on that prefix (for a feature head, on the
target's states over it, which AR's run computed). `record` runs AR once through the decode loop and keeps,
per position, what every verification of a later round can ask of the target there: its best ids and
logits, the normaliser of its softmax, and the states the pair's drafter reads. `replay` then runs the
same decode loop, the real drafter and the real γ policy, against a `RecordedTarget` that answers each
verification from the recording: the replay costs the draft steps alone.

Where a replay is exact, and where it refuses (`replay_refusal` says why, in the sentence the user reads):
- Rows of a verification after the first draft that leaves AR's path are never read by greedy
  verification (the round keeps the prefix before it and adds the target's token there, which is on the
  path). The recorded target answers them with NaN logits and zero states, so that a reader of them would
  show rather than silently agree.
- What the drafter is shown after a round (`RoundOutcome.shown_to_drafter`) is the kept rows: on the path.
  NASD's top-k filler reads the target's best ids there, which the recording holds up to its `top_k`;
  a filler wider than that is refused.
- Sampling is refused: a sampled output leaves AR's path, where nothing was recorded.
- A method that teaches its drafter from the target after the request (OSD) is refused: it would teach
  the shared drafter from a run that never happened. So are tree rounds (verified by another forward),
  methods not made of the loop's rounds (beam search), the draft alone and the cache-less AR, and a target
  KV policy that evicts (it changes what the target computes).
- On a pair whose verification is exact only up to near-ties (`Pair.exactness`: a reduced precision),
  a real run's verification can round a near-tie the other way; the replay follows AR's choice and is
  labelled an estimate (`ReplayedResult.estimate`). A bit-exact or full-precision float target (whose
  rows differ from AR's step in their last bits at most) replays as exact.

A replayed result is a `GenerationResult` (a `ReplayedResult`): tokens, rounds with their drafts,
accepted counts, γ, sources (copied or drafted), decisions, counts of what each model was fed, as a real
run fills them. Its time fields are NaN: nothing of the target was timed. The p of a draft in a round's
decisions is exact for the recording's `top_k` best tokens of each position and, for a rejected draft
below them, the mean of the rest (the recording keeps the softmax's normaliser, not the whole row).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from .decoding import check_stop, decode_rounds, iter_generate
from .drafters.base import Drafter, NoDrafter, Proposal, WrappedDrafter, top_ids
from .drafters.policies import FixedGamma
from .drafters.feature_head import FeatureHead
from .drafters.published import PublishedHead
from .methods import ENTROPY_GAMMA, FIXED_GAMMA, REFERENCE, get_method
from .pair import DRAFT_ROLE, TARGET_ROLE
from .params import PARAMS, DecodeParams, EngineOptions
from .runtimes import refusal
from .targets.seq2seq import is_encoder_decoder
from .tokens import common_prefix_length
from .rounds import cut_verdict_at_eos
from .trace import FedCounts, GenerationResult, Round, TokenRecord

# The target's best ids (and their logits) kept per position: NASD's top-k filler reads up to this many.
RECORDED_TOP_K = 8
# How a Pair.exactness label begins where rounding can flip a near-tie (models.precision.NEAR_TIES_AT,
# which this layer cannot import): there a real run may leave AR's path where the replay keeps to it.
NEAR_TIES_LABEL = "up to near-ties"
# Parameters that change what the target computes or what it is asked: a replay runs with the recording's.
TARGET_PARAMS = ("chat", "temperature", "top_k", "top_p", "target_kv", "kv_budget", "kv_sinks")
RECORDING_FORMAT = 1
PARAMS_DEFAULTS = {name: spec.default for name, spec in PARAMS.items()}


def pair_key(pair) -> dict[str, Any]:
    """What a recording checks a pair against before it replays on it: the target, its runtime, the draft."""
    config = getattr(pair.target, "config", None)
    return {TARGET_ROLE: getattr(config, "_name_or_path", "") or type(pair.target).__name__,
            "runtime": str(getattr(pair, "runtime", "")), DRAFT_ROLE: str(pair.drafter_name or "")}


@dataclass
class Recording:
    """One greedy AR run on a pair, kept for replays (`record` makes it, `replay` reads it).

    prompt_ids: the prompt as encoded; tokens: AR's new tokens (n of them);
    top_ids / top_logits [n, k]: the target's k best ids and their logits at the row that chose each
    new token, best first; log_normaliser [n]: that row's logsumexp; vocab: the row's width;
    margins [n]: AR's top-1 minus top-2 logit there (`GenerationResult.top2_margins`);
    features [len(prompt_ids) + n − 1, d] or None: the target's states at every position the run fed
    (the prompt's but the last from the prefill, then one per AR step), at `feature_layers` and the
    final state, as the pair's drafter reads them; params: the AR run's `DecodeParams.as_dict()`;
    cache, runtime, exactness: the AR run's; ar_seconds, ar_prefill_seconds: what AR's run measured;
    pair: the pair it was recorded on (not saved: `load` takes it again); ar_result: the AR run's own
    `GenerationResult` (not saved).
    """

    prompt_ids: list[int]
    tokens: list[int]
    top_ids: torch.Tensor
    top_logits: torch.Tensor
    log_normaliser: torch.Tensor
    vocab: int
    margins: list[float]
    features: torch.Tensor | None
    feature_layers: tuple[int, ...]
    params: dict[str, Any]
    cache: str
    runtime: str
    exactness: str
    stop_reason: str | None
    key: dict[str, Any]
    ar_seconds: float = math.nan
    ar_prefill_seconds: float = math.nan
    pair: Any = field(default=None, repr=False, compare=False)
    ar_result: GenerationResult | None = field(default=None, repr=False, compare=False)  # not saved
    rows: torch.Tensor | None = field(default=None, repr=False, compare=False)  # built once (`RecordedTarget`)

    @property
    def sequence(self) -> list[int]:
        """The prompt and AR's output: the path every replayed round stays on."""
        return list(self.prompt_ids) + list(self.tokens)

    @property
    def max_new_tokens(self) -> int:
        return int(self.params["max_new_tokens"])

    def save(self, path: str | Path) -> None:
        """One file (torch.save): the tensors and a JSON header; the pair is not saved."""
        header = {name: getattr(self, name) for name in (
            "prompt_ids", "tokens", "vocab", "margins", "params", "cache", "runtime", "exactness",
            "stop_reason", "key", "ar_seconds", "ar_prefill_seconds")}
        header["feature_layers"] = list(self.feature_layers)
        header["format"] = RECORDING_FORMAT
        torch.save({"header": json.dumps(header), "top_ids": self.top_ids, "top_logits": self.top_logits,
                    "log_normaliser": self.log_normaliser, "features": self.features}, Path(path))

    @classmethod
    def load(cls, path: str | Path, pair=None) -> "Recording":
        """A saved recording, attached to `pair` (the one it was recorded on: checked by `replay`)."""
        stored = torch.load(Path(path), map_location="cpu", weights_only=True)
        header = json.loads(stored["header"])
        if header.pop("format") != RECORDING_FORMAT:
            raise ValueError(f"{path}: a recording of another format")
        header["feature_layers"] = tuple(header["feature_layers"])
        return cls(**header, top_ids=stored["top_ids"], top_logits=stored["top_logits"],
                   log_normaliser=stored["log_normaliser"], features=stored["features"], pair=pair)


class _Recorder(NoDrafter):
    """AR's drafter (it drafts nothing) that keeps what the target showed it: the prompt's states from the
    prefill, then each AR step's row of logits and its state."""

    def __init__(self, device, feature_layers: tuple[int, ...] | None, top_k: int):
        super().__init__(device)
        self.reads_target_features = feature_layers is not None
        self.feature_layers = tuple(feature_layers or ())
        self.top_k = top_k
        self.states: list[torch.Tensor] = []
        self.rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.vocab = 0  # the width of the target's rows of logits

    def start(self, prompt_ids, features=None) -> None:
        if features is not None:
            self.states.append(features.detach().float().cpu())

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None) -> None:
        row = target_logits[-1:].float()
        self.vocab = row.shape[-1]
        self.rows.append((top_ids(row, self.top_k)[0].cpu(), row.topk(min(self.top_k, row.shape[-1]), dim=-1)
                          .values[0].cpu(), torch.logsumexp(row, dim=-1).double().cpu()))
        if target_features is not None:
            self.states.append(target_features[-1:].detach().float().cpu())


def drafter_feature_layers(pair) -> tuple[int, ...] | None:
    """The target's layers the pair's drafter reads beside its final state, () for the final state alone;
    None where its drafter reads no states (a draft LM, or no draft)."""
    if isinstance(pair.draft, FeatureHead):
        return tuple(pair.draft.config.feature_layers)
    if isinstance(pair.draft, PublishedHead):
        drafter = pair.draft.drafter()
        try:
            return tuple(drafter.feature_layers) if drafter.reads_target_features else None
        finally:
            drafter.close()
    return None


def record(pair, prompt: str | Sequence[int], *, max_new_tokens: int = 128, chat: bool = False,
           top_k: int = RECORDED_TOP_K, seed: int = 0, cache: str | None = None, **params) -> Recording:
    """Run greedy AR once on `pair` through the decode loop, on whatever runtime runs the pair's target,
    and keep what replays need (`Recording`): per new token the target's `top_k` best ids and logits and
    its softmax's normaliser, AR's top-2 margins, and the target's states at every position fed, at the
    layers the pair's drafter reads (none where it reads no states). `params` are further `DecodeParams`
    (a target KV policy, ...); sampling is refused (a replay follows AR's greedy path).

    The AR run is the real one: its tokens are `generate(pair, prompt, "ar", ...)`'s, and its measured
    seconds are kept (`ar_seconds`) beside the recording.
    """
    spec = get_method(REFERENCE)
    decode = DecodeParams.resolve(None, max_new_tokens=max_new_tokens, chat=chat, seed=seed, **params)
    if not decode.sampling.greedy:
        raise ValueError(f"record: temperature {decode.temperature} samples; a replay follows greedy AR's path, "
                         "so record at temperature 0")
    iter_generate(pair, prompt, REFERENCE, decode=decode, cache=cache).close()  # the checks every run gets
    decode, _ = spec.fit(decode)
    if is_encoder_decoder(pair.target):
        raise ValueError("record: an encoder-decoder pair's decoder is not recorded; record a causal LM's pair")
    prompt_ids = pair.encode(prompt, chat=decode.chat)
    recorder = _Recorder(pair.device, drafter_feature_layers(pair), top_k)
    result = GenerationResult(REFERENCE, {**decode.as_dict(), "seed": seed}, prompt_ids,
                              threads=torch.get_num_threads())
    kind = EngineOptions.from_values(cache=cache, compile=False).cache_for(pair.device)
    for result in decode_rounds(pair, recorder, FixedGamma(0), decode, seed, result, cache=kind, method=spec):
        pass
    ids, logits, normaliser = (torch.stack(part) if part else torch.empty(0) for part in zip(*recorder.rows)) \
        if recorder.rows else (torch.empty(0, top_k, dtype=torch.long), torch.empty(0, top_k), torch.empty(0))
    features = torch.cat(recorder.states) if recorder.states else None
    return Recording(
        prompt_ids=list(prompt_ids), tokens=result.token_ids, top_ids=ids, top_logits=logits,
        log_normaliser=normaliser.reshape(-1),
        vocab=recorder.vocab or int(pair.vocab_size or pair.target.config.vocab_size),
        margins=[float(m) for m in result.top2_margins], features=features,
        feature_layers=recorder.feature_layers, params=dict(result.params), cache=result.cache,
        runtime=result.runtime, exactness=result.exactness, stop_reason=result.stop_reason, key=pair_key(pair),
        ar_seconds=result.seconds, ar_prefill_seconds=result.prefill_seconds, pair=pair, ar_result=result)


class RecordedTarget:
    """The target's calls the decode loop makes (`CachedLM`'s feed / score / roll back, its states and its
    counts), answered from a `Recording`. It keeps which ids "its cache" holds as a `CachedLM` does, so
    what it counts as fed is what the real target would have been fed."""

    torch_threads = None

    def __init__(self, recording: Recording, model: torch.nn.Module):
        self.recording = recording
        self.model = model  # the pair's torch target: the trace's weight count and exactness read it
        self.kind = recording.cache
        self.path = recording.sequence
        self.prompt_length = len(recording.prompt_ids)
        self.cached_ids: list[int] = []
        self.counts = FedCounts()
        self.hidden: torch.Tensor | None = None
        self.feature_layers: tuple[int, ...] = ()
        self.kv_bytes_peak = 0
        if recording.rows is None:
            recording.rows = self._synthetic_rows()
        self._rows = recording.rows

    @property
    def forwards(self) -> int:
        return self.counts.forwards

    def _synthetic_rows(self) -> torch.Tensor:
        """[n, vocab] logits whose argmax, top-k (ids, order, logits) and logsumexp are the recorded ones:
        the top-k in place, every other entry the one value that gives the row its normaliser (never above
        the k-th logit, since it is the log of a mean of entries that were not)."""
        r = self.recording
        n, k = r.top_ids.shape if r.top_ids.dim() == 2 else (0, 0)
        rows = torch.empty(n, r.vocab)
        if not n:
            return rows
        kept = torch.logsumexp(r.top_logits.double(), dim=-1)
        rest = torch.log(torch.clamp(-torch.expm1(kept - r.log_normaliser.double()), min=0.0)) + r.log_normaliser
        rest = rest - math.log(max(r.vocab - k, 1))
        rest = torch.minimum(rest, r.top_logits[:, -1].double())
        rows[:] = rest.float().view(-1, 1)
        rows.scatter_(1, r.top_ids.long(), r.top_logits.float())
        return rows

    def read_features(self, layers: tuple[int, ...]) -> None:
        recorded = self.recording.feature_layers
        if self.recording.features is None or tuple(layers) != tuple(recorded):
            raise ValueError(f"the drafter reads the target's layers {list(layers)} and its final state; the "
                             "recording kept " + ("no states" if self.recording.features is None else
                                                  f"layers {list(recorded)}") + ": record again for this drafter")
        self.feature_layers = tuple(layers)

    def prefill(self, sequence: list[int], hidden: bool = False) -> torch.Tensor | None:
        self._check_on_path(sequence, len(sequence))
        self.cached_ids = list(sequence)
        if sequence:
            self.counts.add(len(sequence), 1)
        if hidden and sequence:
            return self.recording.features[: len(sequence)]
        return None

    def logits(self, sequence: list[int], n_logits: int = 1, n_hidden: int = 0,
               then: torch.Tensor | None = None) -> torch.Tensor:
        """The rows a verification asks for: row i after `sequence` and the first i drafts of `then`; the
        recorded row where those drafts are AR's tokens, NaN after the first that is not."""
        drafts = [] if then is None else [int(t) for t in then.tolist()]
        k = len(drafts)
        self.count_verification(sequence, k, n_logits, n_hidden)
        full = list(sequence) + drafts
        last = len(full) - 1
        on_path = len(sequence) + common_prefix_length(drafts, self.path[len(sequence):len(sequence) + k])
        positions = range(last - n_logits + 1, last + 1)
        rows = torch.full((n_logits, self.recording.vocab), math.nan)
        for row, position in enumerate(positions):
            chosen = position - (self.prompt_length - 1)  # the new token this row chooses
            if position < on_path and 0 <= chosen < len(self._rows):
                rows[row] = self._rows[chosen]
        if n_hidden:
            features = self.recording.features
            self.hidden = torch.zeros(n_hidden, features.shape[-1])
            for row, position in enumerate(range(last - n_hidden + 1, last + 1)):
                if position < min(on_path, features.shape[0]):
                    self.hidden[row] = features[position]
        return rows

    def count_verification(self, sequence: list[int], k: int, n_logits: int, n_hidden: int = 0) -> None:
        """What a verification of k drafts after `sequence` feeds the target, as a `CachedLM` counts it:
        the sequence beyond what "its cache" holds, and the drafts."""
        keep = min(common_prefix_length(self.cached_ids, sequence), len(sequence) + k - max(n_logits, n_hidden))
        del self.cached_ids[keep:]
        self.counts.add(len(sequence) - keep + k, n_logits)
        self.cached_ids.extend(sequence[keep:])
        self._check_on_path(sequence, len(sequence))

    def _check_on_path(self, sequence: list[int], length: int) -> None:
        if list(sequence[:length]) != self.path[:length]:
            raise RuntimeError("a replayed round left the recorded path: the recording is not this pair's AR run")

    def note_fed(self, ids: list[int]) -> None:
        self.cached_ids.extend(ids)

    def warm_up(self) -> float:
        return 0.0

    def close(self) -> None:
        self.hidden = None


@dataclass
class ReplayedResult(GenerationResult):
    """A `GenerationResult` whose rounds were replayed from a `Recording`, not decoded: its time fields are
    NaN (nothing of the target ran); `estimate` is True where the pair's verification is exact only up to
    near-ties (a real run can round one the other way), and `replayed` says so in one line."""

    replayed: str = ""
    estimate: bool = False


def replay_refusal(recording: Recording, method: str, params: DecodeParams) -> str:
    """Why this method with these parameters cannot be replayed from this recording, in the sentence the
    user reads; "" where it can (exactly, or as an estimate on a pair that is not bit-exact)."""
    spec = get_method(method)
    if spec.run is not None or spec.decoder != TARGET_ROLE or not spec.cached:
        return (f"{spec.label} is not made of the decode loop's rounds over the target with its cache, so "
                "a recorded target cannot stand in for it")
    if not params.sampling.greedy:
        return (f"temperature {params.temperature} samples: a sampled output leaves greedy AR's path, where "
                "nothing was recorded, so the replay would have to guess the target's answers")
    if params.max_new_tokens > recording.max_new_tokens:
        return (f"max_new_tokens {params.max_new_tokens} runs past the recording's {recording.max_new_tokens}: "
                "record a longer run")
    for name in TARGET_PARAMS:
        if name in recording.params and getattr(params, name) != recording.params[name]:
            return (f"{name}={getattr(params, name)!r} changes what the target computes or is asked; the "
                    f"recording ran with {name}={recording.params[name]!r}")
    return ""


def _drafter_refusal(drafter, recording: Recording, label: str) -> str:
    if drafter.drafts_trees:
        return f"{label} verifies a tree of drafts in another forward, which the recorded target does not answer"
    if drafter.learns_online:
        return (f"{label} teaches its drafter from the target after each request, and a replay would teach "
                "the shared drafter from a run that never happened")
    if drafter.target_top_k > recording.top_ids.shape[-1]:
        return (f"{label} reads the target's {drafter.target_top_k} best ids at each kept position; the "
                f"recording kept {recording.top_ids.shape[-1]}: record with top_k={drafter.target_top_k}")
    return ""


def replay(recording: Recording, method: str, *, pair=None, **params) -> ReplayedResult:
    """The rounds `generate(pair, prompt, method, **params)` would decode, replayed from `recording`: the
    decode loop, the method's real drafter and γ policy run against a `RecordedTarget`, so only the draft
    steps run. `params` are `DecodeParams` names (γ, γ_max, EMA, copy_n, ...); those the recording does
    not set come from its AR run (max_new_tokens, chat, seed), and those that change the target must equal
    the recording's. `pair` defaults to the recording's own (a loaded recording needs one).

    Raises ValueError with the reason where the replay would not be exact by design (`replay_refusal`,
    and the runtime's own `refusal` for the method on this pair). The result's rounds, tokens, sources
    and counts are the real run's; its times are NaN; `replayed` and `note` say it was replayed.
    """
    return _replay(recording, method, pair, params)


def _replay(recording: Recording, method: str, pair, params: dict[str, Any], swap=None) -> ReplayedResult:
    """`replay`, with swap(drafter, decode) -> drafter putting another drafter in the built one's place (a
    `ChainBook`'s, which reads its drafts from shared chains) after the refusals have been asked."""
    pair, spec, decode, seed, drafter, policy, result = _replay_setup(recording, method, pair, params, swap)
    writer = RecordedTarget(recording, pair.target)
    for result in decode_rounds(pair, drafter, policy, decode, seed, result, cache=recording.cache, method=spec,
                                writer=writer):
        pass
    _unmeasured(result)
    return result


def _replay_setup(recording: Recording, method: str, pair, params: dict[str, Any], swap=None):
    """The checks every replay gets, then (pair, spec, decode, seed, drafter, policy, an empty result)."""
    pair = pair if pair is not None else recording.pair
    if pair is None:
        raise ValueError("replay: this recording was loaded without its pair: Recording.load(path, pair)")
    if pair_key(pair) != recording.key:
        raise ValueError(f"replay: the recording was made on {recording.key}, not on {pair_key(pair)}")
    spec = get_method(method)
    inherited = {name: value for name, value in recording.params.items() if name != "seed"}
    decode = DecodeParams.resolve(None, **{**inherited, **params})
    refused = replay_refusal(recording, method, decode) or refusal(pair, method, decode)
    if refused:
        raise ValueError(refused)
    decode, note = spec.fit(decode)
    seed = decode.seed if decode.seed is not None else int(recording.params.get("seed") or 0)
    drafter, policy = spec.build(pair, decode)
    if drafter is not None:
        refused = _drafter_refusal(drafter, recording, spec.label)
        if refused:
            drafter.close()
            raise ValueError(refused)
        if swap is not None:
            drafter = swap(drafter, decode)
    estimate = recording.exactness.startswith(NEAR_TIES_LABEL)
    replayed = (f"replayed from a recorded AR run on {recording.runtime} (draft steps only, no time measured)"
                + (f"; an estimate: this target is exact {recording.exactness}, so a real run may round a "
                   "near-tie the other way" if estimate else ""))
    result = ReplayedResult(method, {**decode.as_dict(), "seed": seed}, list(recording.prompt_ids),
                            note=" ".join(filter(None, (note, replayed + "."))), threads=torch.get_num_threads(),
                            replayed=replayed, estimate=estimate)
    return pair, spec, decode, seed, drafter, policy, result


def _unmeasured(result: GenerationResult) -> None:
    """No time figure of a replay was measured on the target: NaN, never a draft-only time passed as a run's."""
    result.prefill_seconds = result.seconds = math.nan
    for round_ in result.rounds:
        round_.draft_seconds = round_.verify_seconds = round_.end_seconds = math.nan


# --------------------------------------------------------------------------- chains shared across settings


@dataclass
class Chain:
    """The drafter's greedy chain from one position of the recorded path, drafted once to its longest:
    per step the draft, its normalised entropy and q (tensors, as a proposal carries them), and the
    (entropy, top probability) a γ policy's `keep_drafting` reads there (the floats it would be handed);
    round_entropy: what `round_gamma` reads (the first position's entropy); vocab: q's width."""

    tokens: torch.Tensor
    entropies: torch.Tensor
    q: torch.Tensor
    stats: list[tuple[float, float]]
    q_floats: list[float]
    round_entropy: float
    vocab: int

    def __len__(self) -> int:
        return len(self.stats)


class ChainTooShort(Exception):
    """A setting asked for more drafts at a position than its chain holds (its γ beyond the book's)."""


class _WholeChain:
    """The policy a chain is drafted under: γ = the book's longest, never stopped, every statistic kept."""

    needs_first_entropy = needs_token_stats = reads_first_token = True
    budget = 0

    def __init__(self, gamma: int):
        self.gamma = gamma
        self.first_entropy = math.nan
        self.stats: list[tuple[float, float]] = []
        self.vocab = 0

    def round_gamma(self, first_entropy: float | None) -> int:
        self.first_entropy = float(first_entropy)
        return self.gamma

    def keep_drafting(self, entropy: float, top_prob: float, position: int = 0, vocab: int = 0, **where) -> bool:
        self.stats.append((entropy, top_prob))
        self.vocab = vocab
        return True

    def update(self, drafted: int, accepted: int) -> None:
        pass

    def early_stop(self):
        return None


def _is_chain_drafter(drafter) -> bool:
    """A drafter whose greedy chain from a position of the path depends on that prefix alone, and whose
    drafting is `draft_round` over a model's q: a draft LM or a feature head."""
    from .drafters.feature_drafter import FeatureDrafter
    from .drafters.model import ModelDrafter
    from .drafters.online import OnlineDrafter
    return isinstance(drafter, (FeatureDrafter, ModelDrafter)) and not isinstance(drafter, OnlineDrafter)


def _leaf(drafter):
    """(the wrapper holding it or None, the innermost drafter)."""
    parent = None
    while isinstance(drafter, WrappedDrafter):
        parent, drafter = drafter, drafter.inner
    return parent, drafter


def draft_chains(recording: Recording, drafter, longest: int) -> dict[int, Chain | None]:
    """The chain of `drafter` (freshly built, a `_is_chain_drafter`) from every position of the recording's
    path, each up to min(longest, the room left there), keyed by the context's length. The drafter sees
    the path one position at a time, as AR's rounds would show it (None: a position it cannot draft from,
    a one-token prompt's first)."""
    path, start = recording.sequence, len(recording.prompt_ids)
    decode = DecodeParams.resolve(None, **{n: v for n, v in recording.params.items() if n != "seed"})
    sampling, features = decode.sampling, recording.features
    target = RecordedTarget(recording, recording.pair.target if recording.pair is not None else None)
    drafter.use_cache(recording.cache, len(path) + longest + 1, buckets=(1, 2))
    chains: dict[int, Chain | None] = {}
    with torch.inference_mode():
        drafter.start(path[:start], features[: start - 1] if drafter.reads_target_features else None)
        for n in range(start, len(path)):
            room = recording.max_new_tokens - (n - start) - 1
            policy = _WholeChain(min(longest, max(room, 0)))
            proposal = drafter.propose(path[:n], policy, max(room, 0), sampling, None)
            if math.isnan(policy.first_entropy):
                chains[n] = None  # the drafter proposed without asking its policy (nothing to draft from)
            else:
                k = len(proposal.tokens)
                q = proposal.q_of_drafts if k else torch.empty(0)
                chains[n] = Chain(proposal.tokens, proposal.entropies if k else torch.empty(0), q,
                                  policy.stats[:k], q.tolist(), policy.first_entropy, policy.vocab)
            shown = target._rows[n - start : n - start + 1]
            drafter.observe(path[: n + 1], n, shown, features[n - 1 : n] if drafter.reads_target_features else None,
                            None)
    drafter.close()
    return chains


class ChainDrafter(Drafter):
    """A drafter whose proposals are read from shared chains: what `draft_round` would propose under the
    setting's own γ policy, asked the same questions with the same figures, from a chain drafted once.
    Its counts are those the replaced drafter's own draft steps would have made (a feature head reads the
    verified states in one forward a round, a draft LM catches its cache up in one)."""

    drafts_tokens = True

    def __init__(self, replaced, chains: dict[int, Chain | None], prompt_length: int):
        from .drafters.feature_drafter import FeatureDrafter
        self.chains = chains
        self.reads_target_features = replaced.reads_target_features
        self.feature_layers = replaced.feature_layers
        self.device = torch.device("cpu")
        self._describe = replaced.describe
        self.head_like = isinstance(replaced, FeatureDrafter)
        # A draft LM prefills the prompt but its last token at start; a head's first read is its prefill.
        self._counts = FedCounts()
        self._prefill_forwards = 0 if self.head_like else int(prompt_length > 1)
        if not self.head_like and prompt_length > 1:
            self._counts.add(prompt_length - 1, 1)
        self.cached = prompt_length - 1  # path positions the replaced drafter's cache holds
        self.fed = 0
        replaced.close()

    @property
    def forwards(self) -> int:
        return self._counts.forwards + (self._prefill_forwards if self.head_like else 0)

    @property
    def counts(self) -> FedCounts:
        return self._counts

    def describe(self, model_name: str | None) -> str:
        return self._describe(model_name)

    def propose(self, context, policy, limit, sampling, generator) -> Proposal:
        n = len(context)
        chain = self.chains.get(n)
        if chain is None:
            if n not in self.chains:
                raise ChainTooShort(f"no chain at position {n}")
            return Proposal.empty(0, self.device)
        round_entropy = chain.round_entropy if policy.needs_first_entropy else None
        gamma = policy.round_gamma(round_entropy)
        budget = min(gamma, limit)
        if budget > len(chain):
            raise ChainTooShort(f"γ {budget} at position {n}, the chain holds {len(chain)}")
        kept = 0
        for i in range(budget):
            if policy.needs_token_stats and (i > 0 or policy.reads_first_token):
                entropy, top_prob = chain.stats[i]
                if not policy.keep_drafting(entropy, top_prob, position=i, vocab=chain.vocab,
                                            last_q=chain.q_floats[i - 1] if i else None):
                    break
            kept += 1
        self.fed = min(kept, budget - 1) if budget else 0
        self._count_round(n)
        if not kept:
            return Proposal.empty(gamma, self.device, round_entropy)
        return Proposal(gamma, chain.tokens[:kept], None, chain.entropies[:kept], round_entropy,
                        q_of_drafts=chain.q[:kept])

    def _count_round(self, n: int) -> None:
        if self.head_like:
            if self._prefill_forwards:
                self._counts.add(n - 1 - self.cached, 1)
            else:
                self._prefill_forwards = 1
            self.cached = n - 1
        else:
            self._counts.add(n - self.cached, 1)
            self.cached = n
        for _ in range(self.fed):
            self._counts.add(1, 1)

    def observe(self, sequence, verified_from, target_logits, target_features=None, target_top=None) -> None:
        if not self.head_like:  # a draft LM keeps the drafts it fed that the target accepted
            self.cached += min(self.fed, target_logits.shape[0] - 1)
        self.fed = 0


# Parameters that change what the drafter computes, not how a policy cuts its chain: a chain is shared
# only by settings that leave them at the book's values.
DRAFTER_PARAMS = ("draft_kv",)


class ChainBook:
    """Chains drafted once from every position of a recording, and any chain method's replay made of
    bookkeeping over them: `replay(method, **params)` equals `engine.replay.replay(recording, method,
    **params)` round by round (drafts, accepted counts, γ, sources, counts), without a draft step.

    A method shares the chains where its drafter is the pair's draft LM or feature head (alone, or behind
    the context copy, whose copies are the path's own n-grams and are replayed live). Every γ policy and
    stop rule reads, from the chain, the figures the real drafter would have handed it. The rest replays
    setting by setting (`replay`), still exact but drafting again: NASD's and REST's tables (cheap, no
    model steps), published heads (Medusa drafts from its own heads), a draft KV policy (it changes what
    the draft computes), and a setting whose γ runs past the book's `max_gamma`.

    Exact up to float rounding of the drafter's own cache: a real run reads the verified states (or
    tokens) in chunks of a round's accepted count, the book one position at a time, so a q can differ in
    its last bits; only a γ rule that sits on its threshold to those bits, or a draft argmax tied to
    them, could round the other way (the tests hold the rounds equal on the tiny and the embedded pair).
    """

    def __init__(self, recording: Recording, pair=None, methods: Sequence[str] = (FIXED_GAMMA, ENTROPY_GAMMA),
                 max_gamma: int = 8):
        self.recording = recording
        self.pair = pair if pair is not None else recording.pair
        if self.pair is None:
            raise ValueError("chain_book: this recording was loaded without its pair: Recording.load(path, pair)")
        self.max_gamma = max_gamma
        self.methods = tuple(methods)
        self._chains: dict[type, dict[int, Chain | None]] = {}
        self._of_method: dict[str, dict[int, Chain | None] | None] = {}
        self._parameters: dict[str, int] | None = None
        for method in self.methods:
            self._prepare(method)

    def _prepare(self, method: str) -> dict[int, Chain | None] | None:
        """The chains of the method's drafter (drafted the first time a method needs them), or None."""
        if method not in self._of_method:
            self._of_method[method] = self._chains_for(method)
        return self._of_method[method]

    def _chains_for(self, method: str) -> dict[int, Chain | None] | None:
        spec = get_method(method)
        if spec.run is not None or not spec.needs_draft:
            return None
        decode = DecodeParams.resolve(None, **{n: v for n, v in self.recording.params.items() if n != "seed"})
        try:
            drafter, _ = spec.build(self.pair, spec.fit(decode)[0])
        except Exception:  # noqa: BLE001 — a method this pair cannot build replays by itself, and says why
            return None
        if drafter is None:
            return None
        _, leaf = _leaf(drafter)
        key = type(leaf)
        if _is_chain_drafter(leaf) and not drafter.drafts_trees and key not in self._chains:
            self._chains[key] = draft_chains(self.recording, leaf, self.max_gamma)
        drafter.close()
        return self._chains.get(key) if _is_chain_drafter(leaf) and not drafter.drafts_trees else None

    def shares(self, method: str, **params) -> bool:
        """Whether `replay(method, **params)` reads the shared chains (else it drafts again)."""
        return self._prepare(method) is not None and all(
            params.get(name, PARAMS_DEFAULTS[name]) == self.recording.params.get(name, PARAMS_DEFAULTS[name])
            for name in DRAFTER_PARAMS)

    def replay(self, method: str, *, full: bool = False, **params) -> ReplayedResult:
        """The method's replay at these parameters, bookkeeping over the shared chains where it shares them,
        else `replay` itself (see the class); refused settings raise as `replay` does.

        By default the rounds are kept by `_bookkeeping` (no tensor of the vocabulary's width is made): each
        round's γ, drafts, entropies, accepted count, next token, source and stop note, the tokens with
        their origins (no text: the output is AR's, `result.text`), and the counts; not the per-draft
        decisions (p, q). full=True runs the decode loop over the chains instead, for the whole trace."""
        if not self.shares(method, **params):
            return replay(self.recording, method, pair=self.pair, **params)
        chains = self._prepare(method)
        prompt_length = len(self.recording.prompt_ids)

        def swap(drafter, decode):
            parent, leaf = _leaf(drafter)
            if not _is_chain_drafter(leaf) or drafter.drafts_trees:
                return drafter
            chained = ChainDrafter(leaf, chains, prompt_length)
            if parent is None:
                return chained
            parent.inner = chained
            return parent

        try:
            if full:
                return _replay(self.recording, method, self.pair, params, swap=swap)
            return self._bookkeeping(*_replay_setup(self.recording, method, self.pair, params, swap))
        except ChainTooShort:
            return replay(self.recording, method, pair=self.pair, **params)

    def _bookkeeping(self, pair, spec, decode, seed, drafter, policy, result) -> ReplayedResult:
        """The decode loop's greedy chain rounds, kept in lists: a draft is kept while it is the recorded
        path's token, and the target's own token is the path's next (what the loop's verification reads
        from the recorded rows, which are the path's argmax)."""
        recording, path, eos = self.recording, self.recording.sequence, pair.eos_ids
        sequence = list(recording.prompt_ids)
        writer = RecordedTarget(recording, pair.target)
        writer.prefill(sequence[:-1])
        drafter.start(sequence, None)
        before = (writer.counts.copy(), drafter.counts.copy())
        hidden = drafter.reads_target_features
        while not result.done:
            proposal = drafter.propose(sequence, policy, decode.max_new_tokens - len(result.tokens) - 1,
                                       decode.sampling, None)
            drafted, n = proposal.tokens.tolist(), len(sequence)
            writer.count_verification(sequence, len(drafted), len(drafted) + 1, len(drafted) + 1 if hidden else 0)
            writer.note_fed(drafted)
            accepted = common_prefix_length(drafted, path[n:n + len(drafted)])
            drafts, accepted, next_token = cut_verdict_at_eos(
                drafted, accepted, path[n + accepted] if n + accepted < len(path) else None, eos)
            new = drafts[:accepted] + ([] if next_token is None else [next_token])
            sequence.extend(new)
            drafter.observe(sequence, n, torch.empty(accepted + 1, 0))
            policy.update(len(drafts), accepted)
            entropies = proposal.entropies.tolist()[: len(drafts)] if proposal.entropies is not None else []
            round_ = Round(index=len(result.rounds), gamma=proposal.gamma, entropy=proposal.round_entropy,
                           drafted=drafts, accepted=accepted, next_token=next_token, draft_entropies=entropies,
                           draft_seconds=math.nan, verify_seconds=math.nan, end_seconds=math.nan, new_tokens=new,
                           source=proposal.source if drafts else "", early_stop=policy.early_stop())
            origins = ["accepted"] * len(new)
            if next_token is not None:
                origins[-1] = round_.next_origin
            result.tokens += [TokenRecord(token, "", origin, round_.index) for token, origin in zip(new, origins)]
            result.rounds.append(round_)
            check_stop(result, decode.max_new_tokens, pair)
        target, draft = writer.counts.since(before[0]), drafter.counts.since(before[1])
        result.target_forwards, result.draft_forwards = target.forwards, drafter.forwards
        result.fed = {TARGET_ROLE: target, DRAFT_ROLE: draft}
        result.cache, result.drafter = recording.cache, drafter.describe(pair.drafter_name)
        result.runtime, result.exactness, result.parameters = recording.runtime, recording.exactness, self.parameters
        drafter.close()
        _unmeasured(result)
        return result

    @property
    def parameters(self) -> dict[str, int]:
        """The pair's matmul weights (the trace's FLOPs read them), counted once for the book."""
        if self._parameters is None:
            from .flops import matmul_parameters
            self._parameters = {TARGET_ROLE: matmul_parameters(self.pair.target),
                                DRAFT_ROLE: matmul_parameters(self.pair.draft)}
        return self._parameters


def chain_book(recording: Recording, pair=None, methods: Sequence[str] = (FIXED_GAMMA, ENTROPY_GAMMA),
               max_gamma: int = 8) -> ChainBook:
    """A `ChainBook` over `recording`: the pair's draft chains from every position, drafted once up to
    `max_gamma` (the draft steps of about one replay), for `methods` and every method sharing their drafter."""
    return ChainBook(recording, pair, methods, max_gamma)


def replay_grid(recording: Recording, settings: Sequence[tuple[str, dict[str, Any]]], *,
                pair=None, max_gamma: int | None = None) -> list[ReplayedResult]:
    """`replay(recording, method, **params)` for each (method, params) of `settings`, in order: one result
    each, equal to that setting's own replay round by round. The draft's chains are drafted once for the
    whole grid (a `ChainBook` up to the largest γ any setting asks, or `max_gamma`), and each setting
    replays as bookkeeping over them; a method that cannot share them replays alone (`ChainBook`), and a
    refused setting raises as `replay` does."""
    longest = max_gamma or max([_longest_gamma(params) for _, params in settings] + [1])
    book = chain_book(recording, pair, methods=tuple(dict.fromkeys(m for m, _ in settings)), max_gamma=longest)
    return [book.replay(method, **params) for method, params in settings]


def _longest_gamma(params: dict[str, Any]) -> int:
    """The most drafts a setting's round can ask for: its γ or γ_max (the schema's defaults otherwise)."""
    return max(int(params.get(name, PARAMS_DEFAULTS[name])) for name in ("gamma", "gamma_max"))
