"""Losslessness on the device: every greedy method's output against AR's, and for each output
that differs, whether the target itself was at a near-tie there.

At the first token where a method leaves AR, the target is scored once more on the common
prefix (eager, no cache). If its logits for AR's token and for the method's token are within
a few units of the dtype's rounding, the two paths (different kernels, different row counts)
may round the tie either way: a near-tie, not a bug. Anything wider is a real difference.

May import torch, pandas and the other bench modules.
"""

from __future__ import annotations

import pandas as pd
import torch

from ...engine.methods import FIXED_GAMMA, METHODS, REFERENCE, TABLE_DRAFTING
from ...engine.runtimes import refusal
from ...models.loading import load_pair
from .measure import bench, decode_params, prompt_ids
from .pairs import suite_prompts
from .stages import MODES, StageContext

HF_GREEDY = {"embedded": ["hf-generate", "hf-generate-static", "hf-prompt-lookup"],
             "embedded-lm": ["hf-assisted", "hf-assisted-default"]}
ULPS = 4  # a tie within this many units in the last place of the larger logit
LOSSLESS_COLUMNS = ["pair", "mode", "method", "prompt_id", "repeat", "matches_ar", "first_difference", "ar_token",
                    "method_token", "logit_gap", "tolerance", "explanation"]


def lossless_methods(pair, pair_name: str, with_peers: bool, tiny: bool = False) -> list[str]:
    ours = [n for n, m in METHODS.items() if m.lossless and refusal(pair, n) is None]
    if tiny:  # a rehearsal checks the stage's machinery on a few: a model's chain, the table's, a tree, a peer
        tree = next(n for n in ours if METHODS[n].tree)
        return [REFERENCE, FIXED_GAMMA, TABLE_DRAFTING, tree, HF_GREEDY[pair_name][0]]
    return ours + (HF_GREEDY[pair_name] if with_peers else [])


def tolerance(a: float, b: float, dtype: torch.dtype) -> float:
    """ULPS units of rounding at the larger of two logits in `dtype`."""
    return ULPS * torch.finfo(dtype).eps * max(abs(a), abs(b), 1.0)


@torch.inference_mode()
def explain(pair, context: list[int], ar_next: int | None, other_next: int | None) -> tuple[float, float, str]:
    """(logit gap, tolerance, a sentence) at the first token where an output leaves AR's."""
    if ar_next is None or other_next is None:
        which = "AR" if ar_next is None else "the method"
        return float("nan"), float("nan"), f"{which} stopped here and the other went on: lengths differ"
    logits = pair.target(input_ids=torch.tensor([context], device=pair.device)).logits[0, -1]
    dtype = logits.dtype
    a, b = float(logits[ar_next]), float(logits[other_next])
    gap, tol = a - b, tolerance(a, b, dtype)
    name = str(dtype).replace("torch.", "")
    if abs(gap) <= tol:
        return gap, tol, f"near-tie in {name}: the target's logits for both tokens differ by {gap:.4g} (≤ {tol:.3g})"
    return gap, tol, f"REAL difference: the target prefers AR's token by {gap:.4g} (> {tol:.3g} of {name} rounding)"


def compare_rows(pair, rows: pd.DataFrame, encoded: dict[int, list[int]], pair_name: str, mode: str) -> list[dict]:
    ok = rows[rows.error.fillna("") == ""]
    reference = {(r.prompt_index, r.repeat): [int(t) for t in str(r.output_ids).split()]
                 for r in ok[ok.method == REFERENCE].itertuples()}
    out = []
    for r in ok[(ok.method != REFERENCE) & ok.matches_ar.notna()].itertuples():
        record = {"pair": pair_name, "mode": mode, "method": r.method, "prompt_id": r.prompt_id, "repeat": r.repeat,
                  "matches_ar": bool(r.matches_ar)}
        if not r.matches_ar:
            ar = reference[(r.prompt_index, r.repeat)]
            mine = [int(t) for t in str(r.output_ids).split()]
            first = next((i for i, (x, y) in enumerate(zip(ar, mine)) if x != y), min(len(ar), len(mine)))
            ar_next = ar[first] if first < len(ar) else None
            my_next = mine[first] if first < len(mine) else None
            gap, tol, sentence = explain(pair, encoded[r.prompt_index] + ar[:first], ar_next, my_next)
            record.update(first_difference=first, ar_token=ar_next, method_token=my_next, logit_gap=gap,
                          tolerance=tol, explanation=sentence)
        out.append(record)
    return out


def run_lossless(ctx: StageContext) -> None:
    s = ctx.settings
    prompts = suite_prompts(s.prompts)
    decode = decode_params(ctx, chat=True)
    records: list[dict] = []
    for index, mode in enumerate(MODES[:1] if s.tiny else MODES):  # a rehearsal checks one mode
        for pair_name in ("embedded",) if s.tiny else ("embedded", "embedded-lm"):
            ctx.check_time(f"{pair_name} {mode.name}")
            pair = load_pair(pair_name, device=s.device, dtype=s.dtype, runtime="torch")
            try:
                # transformers' peers ignore our mode: they run in the first one only.
                methods = lossless_methods(pair, pair_name, with_peers=index == 0, tiny=s.tiny)
                result = bench(ctx, pair, prompts, methods, mode, decode, f"lossless-{pair_name}-{mode.name}",
                               repeats=1, warmup=False, roofline=False)
                encoded = dict(enumerate(ids for _, ids in prompt_ids(pair, prompts, True)))
                records += compare_rows(pair, result.rows, encoded, pair_name, mode.name)
            finally:
                pair.close()
    table = pd.DataFrame(records, columns=LOSSLESS_COLUMNS)
    path = s.out / "lossless.csv"
    table.to_csv(path, index=False)
    ctx.wrote(path)
    _summarise(ctx, table)


def _summarise(ctx: StageContext, table: pd.DataFrame) -> None:
    differ = table[~table.matches_ar.astype(bool)]
    ties = differ[[str(e).startswith("near-tie") for e in differ.explanation]]
    real = differ.drop(ties.index)
    ctx.note(f"- {len(table) - len(differ)} of {len(table)} greedy outputs equal AR's; {len(ties)} differ at a "
             f"near-tie of the target; {len(real)} differ otherwise")
    for row in real.itertuples():
        ctx.note(f"  - {row.pair} {row.mode} {row.method} on {row.prompt_id}: {row.explanation}")
    if len(real):
        ctx.status = f"{len(real)} output(s) differ from AR beyond rounding"
