"""Statistics of a benchmark run: one summary row per (category, method) from the per-run rows.

Every method gets the same prompt token ids (chat template included), the same
max_new_tokens, the same EOS ids and min_new_tokens=0, and only new tokens are counted.
Methods are interleaved per prompt, their order rotated one place per prompt and per
repeat, so that drift of a shared machine hits all of them alike.

May import pandas and the other bench modules below the report; never gradio.

Definitions used in the tables (written into the report too):
  seconds         wall time of one call, prompt ids in → new ids out, the device
                  synchronised before both clock reads; our methods and transformers'
                  are timed the same way.
  tokens_per_s    per repeat Σ new tokens / Σ seconds over the category's prompts;
                  mean ± std over repeats.
  compile_seconds compile and graph warm-up inside a call (ours with --compile), taken
                  out of `seconds` and never counted in tokens/s; mean over runs. The
                  first compile of a model happens in the untimed warm-up run.
  cache           the KV cache our runs used (static or dynamic); transformers' peers
                  show theirs (hf-generate-static: static, the others: dynamic).
  speedup vs R    geometric mean over prompts of  t_R(p) / t_m(p),  where t_x(p) is the
                  time per new token of method x on prompt p (Σ seconds / Σ new tokens
                  over the repeats). When both produce the same tokens (greedy runs that
                  match) this is exactly the ratio of per-prompt times. Its std is over
                  repeats of the same statistic computed per repeat.
  speedup vs hf / hf_static   the same against transformers' hf-generate and
                  hf-generate-static (its static cache and compiled forward), only for a
                  method whose runs ran on the peer's runtime: beside a target on ONNX
                  Runtime the peers run on its torch copy, so there the torch copy's AR
                  (torch-ar) has these ratios and the runtime's methods have none.
  reference_runtime  what ran the AR that speedup_vs_ar is over: the method's own
                  runtime's AR, or, for a method on the torch copy of a runtime target
                  (transformers' peers, what the runtime cannot run), the torch copy's AR.
  α (alpha)       "α (Leviathan, per token)": Leviathan's per-token acceptance probability,
                  accepted / (accepted + rounds that ended in a rejection), the maximum-
                  likelihood estimate under their i.i.d. model (`engine.trace.leviathan_alpha`,
                  over the runs' summed counts). Not `acceptance_rate`, "acceptance
                  (accepted ÷ drafted)", which counts every drafted token.
  c (cost_ratio)  drafting time per draft token / time of one AR target step, both from
                  the traces of the same run (SD's draft_seconds / draft_forwards against
                  AR's verify_seconds / target_forwards, per category).
  matches_ar      greedy runs of lossless methods: the same tokens as AR (per turn); empty
                  for beam search and the draft alone, which are not meant to match.
  first_divergence  where a greedy run of a lossless method differs from AR: the index of its first new
                  token unlike AR's (empty where equal); in the summary, the earliest over the runs.
  divergence_margin  AR's top-1 minus top-2 logit at that index (engine.divergence): under
                  NEAR_TIE_MARGIN (0.5) a near-tie; in the summary, the largest over the runs that
                  differed, so a value under 0.5 says every divergence was a near-tie.
  exactness       what matches_ar can promise on this target (models.precision): "bit-exact",
                  "exact at float32", or "up to near-ties at bfloat16" (int4, ...), where a
                  mismatch is the precision's rounding, not a fault of the method.
  turn            a question of several turns (MT-bench) is answered turn by turn, each
                  method continuing its own conversation; every turn is a timed row.
  bleu, chrf, rouge1, rouge2, rougeL   against the suite's references (where a prompt has
                  them): sentence BLEU and chrF (sacrebleu), ROUGE F-measure × 100 with
                  stemming (rouge-score), best over several references; mean over runs.
  predicted       (1 − α^(γ+1)) / ((1 − α)(γc + 1)), against the measured speedup vs AR.
  predicted_v     the same with the measured verification cost v in place of 1:
                  (1 − α^(γ+1)) / ((1 − α)(γc + v)), v = time of one verification forward
                  (γ+1 tokens) / one AR step (`verify_cost_ratio`). Leviathan assume v = 1,
                  which holds on a memory-bound GPU and not on a compute-bound CPU.
  break_even_tokens  the tokens per round a drafting method of ours needs to match AR: its
                  round's cost in AR steps, γ̄c' + v', with c' its drafting seconds per drafted
                  token and v' its verification seconds per round, each ÷ one AR step
                  (acceptance.BreakEven); compare with mean_accepted_tokens, what it got.
  speedup_vs_fp32_ar  where a model runs below float32 (bfloat16, float16, int8, int4): the
                  speedup against float32 AR of the same target weights, the same geometric
                  mean over prompts, that run timed apart from every row (bench.vs_float32).
  token_match_vs_fp32, prefix_match_vs_fp32, chrf_vs_fp32, bleu_vs_fp32   the output against
                  float32 AR's on the same prompt: the share of positions with its token (over
                  the longer output), the share before the first difference, sentence chrF and
                  BLEU (0–100); first turns only; mean over runs.
  entropy_auc     how well the drafter's entropy ranks acceptances: the area under the ROC
                  curve of −entropy as a predictor that a judged draft is kept (0.5: not at
                  all), over entropy_auc_n drafts (acceptance.entropy_auc).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from .acceptance import BreakEven, entropy_auc
from .quality import QUALITY_COLUMNS
from .runners import TORCH_AR, bench_methods
from ...engine.divergence import DIVERGENCE_COLUMNS
from ...engine.targets.memory import MEMORY_STATS
from ...engine.trace import leviathan_alpha
from ...models.torch_copy import TORCH_COPY
from ..suite import ALL
from .vs_float32 import AGREEMENT_COLUMNS, VS_FLOAT32_COLUMNS
from ...engine.methods import FIXED_GAMMA, REFERENCE, TABLE_DRAFTING

# The fixed-γ chains (SD and NASD, and transformers' assisted generation), to which Leviathan's formula applies.
_PREDICTABLE = (FIXED_GAMMA, TABLE_DRAFTING, "hf-assisted")

SUMMARY_COLUMNS = [
    "category", "method", "label", "prompts", "runs", "errors", "new_tokens_mean", "tokens_per_s_mean",
    "tokens_per_s_std", "speedup_vs_ar", "speedup_vs_ar_std", "speedup_vs_hf", "speedup_vs_hf_std",
    "speedup_vs_hf_static", "speedup_vs_hf_static_std", "acceptance_rate", "alpha", "mean_accepted_tokens", "target_forwards_per_token", "mean_gamma",
    "mean_drafted", "copied_share", "exact_match_pct", *DIVERGENCE_COLUMNS, "perplexity", "cost_ratio", "verify_cost_ratio", "predicted_speedup",
    "predicted_speedup_v", "break_even_tokens", "entropy_auc", "entropy_auc_n", *QUALITY_COLUMNS, "cache",
    "runtime", "reference_runtime", "exactness", "compile_seconds", *MEMORY_STATS, *VS_FLOAT32_COLUMNS,
]


def distinct_values(rows: pd.DataFrame, column: str) -> str:
    """The column's values in these rows, each once in order of appearance, comma-joined ("" where the
    column is missing or empty)."""
    if column not in rows:
        return ""
    return ",".join(dict.fromkeys(value for value in rows[column].dropna().astype(str) if value))


def geomean(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


class _PerToken:
    """Seconds per new token by prompt in one category's rows, for each method over all its repeats and
    for each (method, repeat): the sums `speedup` divides, grouped once per category rather than again
    for every method and reference (the summary's slowest part otherwise). Prompts whose runs made no
    token are left out."""

    def __init__(self, sub: pd.DataFrame):
        self.repeats = sorted(sub.repeat.unique())
        # What ran each method's target forwards: a peer's ratio is like for like only on the same runtime.
        self.runtimes = ({m: distinct_values(g, "runtime") for m, g in sub.groupby("method", sort=False)}
                         if "runtime" in sub else {})
        self.overall = self._by_prompt(sub, ["method"])
        self.by_repeat = self._by_prompt(sub, ["method", "repeat"])

    @staticmethod
    def _by_prompt(sub: pd.DataFrame, keys: list[str]) -> dict[Any, dict[Any, float]]:
        grouped = sub.groupby([*keys, "prompt_index"])[["seconds", "new_tokens"]].sum()
        out: dict[Any, dict[Any, float]] = {}
        for key, seconds, tokens in zip(grouped.index, grouped.seconds.to_numpy(), grouped.new_tokens.to_numpy()):
            group = key[0] if len(keys) == 1 else key[:-1]
            prompts = out.setdefault(group, {})
            if tokens > 0:
                prompts[key[-1]] = seconds / np.float64(tokens)
        return out

    @staticmethod
    def _ratios(ref: dict[Any, float], mine: dict[Any, float]) -> list[float]:
        """The reference's time per token over the method's, prompt by prompt (in prompt order)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            ratios = [ref[prompt] / mine[prompt] for prompt in sorted(ref.keys() & mine.keys())]
        return [float(r) for r in ratios if not math.isnan(r)]

    def speedup(self, method: str, reference: str) -> tuple[float, float]:
        """Geometric mean over prompts of the reference's time per token / the method's (see module doc),
        and its spread over repeats."""
        if method not in self.overall or reference not in self.overall:
            return math.nan, math.nan
        overall = geomean(self._ratios(self.overall[reference], self.overall[method]))
        per_repeat = []
        for repeat in self.repeats:
            r = self._ratios(self.by_repeat.get((reference, repeat), {}), self.by_repeat.get((method, repeat), {}))
            if r:
                per_repeat.append(geomean(r))
        spread = float(pd.Series(per_repeat).std()) if len(per_repeat) > 1 else math.nan
        return overall, spread

    def same_runtime_speedup(self, method: str, reference: str) -> tuple[float, float]:
        """`speedup`, where both ran on one runtime; NaN where they did not (the runtime's AR against
        transformers' generate on the torch copy is no like-for-like ratio)."""
        if self.runtimes.get(method, "") != self.runtimes.get(reference, ""):
            return math.nan, math.nan
        return self.speedup(method, reference)


def ratio(numerator: float, denominator: float) -> float:
    try:
        return numerator / denominator if denominator and math.isfinite(denominator) and denominator > 0 else math.nan
    except TypeError:
        return math.nan


def leviathan_speedup(alpha: float, gamma: float, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Expected speedup of SD over AR: (1 − α^(γ+1)) / ((1 − α)(γc + v)), v = 1 in the paper."""
    if not all(math.isfinite(x) for x in (alpha, gamma, cost_ratio, verify_cost)):
        return math.nan
    tokens = gamma + 1 if alpha >= 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * cost_ratio + verify_cost)


def break_even(runs: pd.DataFrame, ar_step_seconds: float) -> BreakEven | None:
    """One method's break-even over its runs (ours only: transformers' do not time their phases)."""
    drafted = runs.drafted.sum() if "drafted" in runs else 0
    if runs.empty or not drafted or "draft_seconds" not in runs or runs.draft_seconds.isna().all():
        return None
    accepted, rejected = runs.accepted.sum(), runs.rejected_rounds.sum()
    return BreakEven.measure(
        draft_seconds=float(runs.draft_seconds.sum()), verify_seconds=float(runs.verify_seconds.sum()),
        rounds=int(runs.rounds.sum()), drafted=int(drafted), new_tokens=int(runs.new_tokens.sum()),
        alpha=leviathan_alpha(accepted, rejected), ar_step_seconds=ar_step_seconds)


def break_evens(rows: pd.DataFrame, summary: pd.DataFrame) -> dict[str, tuple[BreakEven, float]]:
    """Over all categories: each drafting method's break-even and its measured speedup vs AR."""
    ok = rows[rows.error.fillna("") == ""] if "error" in rows else rows
    ar = ok[ok.method == REFERENCE]
    if ar.empty:
        return {}
    ar_step = ratio(ar.verify_seconds.sum(), ar.target_forwards.sum())
    overall = summary[summary.category == ALL].set_index("method")
    out = {}
    for method in dict.fromkeys(ok.method):
        even = break_even(ok[ok.method == method], ar_step)
        if even is not None and method in overall.index:
            out[method] = (even, float(overall.loc[method, "speedup_vs_ar"]))
    return out


def summarize(rows: pd.DataFrame, gamma: int | None = None, tokens: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (category, method), plus every method over category 'all'; `tokens` (the
    benchmark's per-token frame) gives the entropy AUC."""
    ok = rows[rows.error.fillna("") == ""] if "error" in rows else rows
    out = []
    for category in list(dict.fromkeys(rows.category)) + [ALL]:
        sub = ok if category == ALL else ok[ok.category == category]
        per_token = _PerToken(sub)
        ar = sub[sub.method == REFERENCE]
        ar_step = ratio(ar.verify_seconds.sum(), ar.target_forwards.sum()) if not ar.empty else math.nan
        sd = sub[sub.method == FIXED_GAMMA]
        sd_cost = ratio(sd.draft_seconds.sum(), sd.draft_forwards.sum()) if not sd.empty else math.nan
        for method in dict.fromkeys(rows.method):
            mine = sub[sub.method == method]
            everything = rows[(rows.method == method) & ((rows.category == category) if category != ALL else True)]
            row = {"category": category, "method": method, **_measured(per_token, mine, everything, method)}
            if tokens is not None and not tokens.empty:
                drafts = tokens[(tokens.method == method) & ((tokens.category == category) if category != ALL else True)]
                row["entropy_auc"], row["entropy_auc_n"] = entropy_auc(drafts)
            even = break_even(mine, ar_step)
            row["break_even_tokens"] = even.needed if even is not None else math.nan
            if method in _PREDICTABLE and not mine.empty:
                row.update(_predicted(method, mine, sd, ar_step, sd_cost, gamma, row))
            out.append(row)
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def _memory(mine: pd.DataFrame) -> dict:
    """The most bytes each model's weights and KV cache held over a method's runs (NaN where its runs say
    nothing: transformers' peers)."""
    return {name: float(pd.to_numeric(mine[name]).max()) if name in mine and mine[name].notna().any() else math.nan
            for name in MEMORY_STATS}


def _divergences(mine: pd.DataFrame) -> dict:
    """Over a method's runs that differed from AR: the earliest first divergence, and the largest reference
    margin at a divergence (under `divergence.NEAR_TIE_MARGIN`: every divergence was a near-tie); NaN for none."""
    if "first_divergence" not in mine:
        return {"first_divergence": math.nan, "divergence_margin": math.nan}
    first, margins = pd.to_numeric(mine.first_divergence).dropna(), pd.to_numeric(mine.divergence_margin).dropna()
    return {"first_divergence": float(first.min()) if len(first) else math.nan,
            "divergence_margin": float(margins.max()) if len(margins) else math.nan}


def _measured(per_token: _PerToken, mine: pd.DataFrame, everything: pd.DataFrame, method: str) -> dict:
    """What one method's runs in one category measured: speed, its ratios, acceptance and quality."""
    per_repeat = mine.groupby("repeat")[["new_tokens", "seconds"]].sum()
    tps = per_repeat.new_tokens / per_repeat.seconds
    # A method that ran on the torch copy of a runtime target is set against the torch copy's AR.
    on_copy = method != TORCH_AR and not mine.empty and "runtime" in mine and (mine.runtime == TORCH_COPY).all()
    reference = TORCH_AR if on_copy else REFERENCE
    speed_ar, speed_ar_std = per_token.speedup(method, reference)
    speed_hf, speed_hf_std = per_token.same_runtime_speedup(method, "hf-generate")
    speed_hfs, speed_hfs_std = per_token.same_runtime_speedup(method, "hf-generate-static")
    drafted, accepted = mine.drafted.sum(), mine.accepted.sum()
    matches = mine.matches_ar.dropna()
    return {
        "label": bench_methods().get(method, method),
        "prompts": mine.prompt_index.nunique(), "runs": len(mine), "errors": len(everything) - len(mine),
        "new_tokens_mean": mine.new_tokens.mean(),
        "tokens_per_s_mean": tps.mean() if len(tps) else math.nan,
        "tokens_per_s_std": tps.std() if len(tps) > 1 else math.nan,
        "speedup_vs_ar": speed_ar, "speedup_vs_ar_std": speed_ar_std,
        "speedup_vs_hf": speed_hf, "speedup_vs_hf_std": speed_hf_std,
        "speedup_vs_hf_static": speed_hfs, "speedup_vs_hf_static_std": speed_hfs_std,
        "acceptance_rate": ratio(accepted, drafted) if drafted else math.nan,
        "alpha": leviathan_alpha(accepted, mine.rejected_rounds.sum()),
        "mean_accepted_tokens": ratio(mine.new_tokens.sum(), mine.rounds.sum()),
        "target_forwards_per_token": ratio(mine.target_forwards.sum(), mine.new_tokens.sum()),
        "mean_gamma": mine.mean_gamma.mean(),
        "mean_drafted": ratio(drafted, mine.rounds.sum()),
        # Rounds copied from the context (copy_n) of all rounds; transformers' peers never copy in this sense.
        "copied_share": (ratio(mine.copied_rounds.sum(), mine.rounds.sum())
                         if mine.copied_rounds.notna().any() else math.nan),
        "exact_match_pct": 100.0 * matches.astype(bool).mean() if len(matches) else math.nan,
        **_divergences(mine),
        **_memory(mine),
        "perplexity": mine.perplexity.mean() if mine.perplexity.notna().any() else math.nan,
        "cost_ratio": math.nan, "verify_cost_ratio": math.nan, "predicted_speedup": math.nan,
        "predicted_speedup_v": math.nan, "break_even_tokens": math.nan,
        "entropy_auc": math.nan, "entropy_auc_n": 0,
        "cache": distinct_values(everything, "cache"),
        # What ran the target's forwards ("torch", "onnx fp32"), per method: a torch-ar row beside onnx rows.
        "runtime": distinct_values(mine, "runtime"),
        "reference_runtime": per_token.runtimes.get(reference, ""),
        # What its greedy output promises against AR ("bit-exact", "up to near-ties at bfloat16"); empty for peers.
        "exactness": distinct_values(mine, "exactness"),
        "compile_seconds": mine.compile_seconds.mean() if "compile_seconds" in mine else math.nan,
        # Against the suite's references, over the runs that have them (see bench.quality).
        **{name: mine[name].mean() if name in mine and mine[name].notna().any() else math.nan
           for name in QUALITY_COLUMNS},
        "speedup_vs_fp32_ar": _speedup_vs_float32(mine),
        **{name: mine[name].mean() if name in mine and mine[name].notna().any() else math.nan
           for name in AGREEMENT_COLUMNS},
    }


def _speedup_vs_float32(mine: pd.DataFrame) -> float:
    """Geometric mean over prompts of float32 AR's time per token / the method's, over the runs
    that have a float32 AR reference (the rows' fp32_ar_seconds, fp32_ar_new_tokens)."""
    if "fp32_ar_seconds" not in mine or mine.fp32_ar_seconds.isna().all():
        return math.nan
    runs = mine[mine.fp32_ar_seconds.notna()]
    grouped = runs.groupby("prompt_index")[["seconds", "new_tokens", "fp32_ar_seconds", "fp32_ar_new_tokens"]].sum()
    ratio = ((grouped.fp32_ar_seconds / grouped.fp32_ar_new_tokens.where(grouped.fp32_ar_new_tokens > 0))
             / (grouped.seconds / grouped.new_tokens.where(grouped.new_tokens > 0)))
    return geomean(ratio.dropna().tolist())


def _predicted(method: str, mine: pd.DataFrame, sd: pd.DataFrame, ar_step: float, sd_cost: float,
               gamma: int | None, row: dict) -> dict:
    """Leviathan's predicted speedup from the measured α and draft cost (and with the measured verify cost)."""
    if method == TABLE_DRAFTING:
        slots = (mine.rounds * mine.mean_gamma).sum()
        cost = ratio(ratio(mine.draft_seconds.sum(), slots), ar_step)
    else:
        # transformers' assistant is our draft model: price its forward from our SD.
        cost = ratio(sd_cost, ar_step)
    g = gamma if gamma is not None else row["mean_gamma"]
    # transformers' verification is not timed apart; ours verifies the same γ+1 tokens.
    timed = sd if method == "hf-assisted" else mine
    verify = ratio(ratio(timed.verify_seconds.sum(), timed.target_forwards.sum()), ar_step)
    return {"cost_ratio": cost, "verify_cost_ratio": verify,
            "predicted_speedup": leviathan_speedup(row["alpha"], g, cost),
            "predicted_speedup_v": leviathan_speedup(row["alpha"], g, cost, verify)}
