"""The batch stage: where drafting stops paying as requests share the target's forward. AR, SD and EGAG
on the random-weight pair of real shapes (its first shape) with the planted oracle (`forced`), at batch
sizes 1, 8 and 32, each batch run by every method in turn through `generate_batch`; each size's
throughput, latencies and throughput over AR's with its interval, and the verdict.

A batch above 1 runs eager with a dynamic cache (the batched target's own), so the stage does too, at
every size; its draft LM drafts the batch's rows together, one forward a draft step (`engine.batch`).

May import torch, pandas and the other bench modules.
"""

from __future__ import annotations

from functools import partial

from ...engine.methods import DEFAULT_METHODS, METHODS, REFERENCE
from ..measure.batching import batch_verdict
from ..measure.benchmark import run_benchmark
from ..page import markdown
from .measure import deadline_progress, decode_params, write_files
from .pairs import SHAPES, TINY_SHAPES, forced_pair, suite_prompts, unit_tokens
from .plan import Cost, Workload, default_cost
from .stages import MODES, Settings, StageContext, Unit
from .summary import table_cell

BATCH_SIZES = (1, 8, 32)
# AR and the page's default methods that draft with the pair's draft model, whose answers the oracle plants.
BATCH_METHODS = [n for n in DEFAULT_METHODS if n == REFERENCE or METHODS[n].needs_draft]
EAGER = MODES[1]  # a batch's target keeps its own dynamic cache and runs eager
SHOWN = ["batch", "method", "throughput_tokens_per_s", "latency_p50_s", "latency_p95_s", "ttft_p50_s",
         "throughput_vs_ar", "throughput_vs_ar_low", "throughput_vs_ar_high", "acceptance_rate"]


def batch_rows(prompts: int, sizes=BATCH_SIZES) -> int:
    """Requests one repeat decodes per method: each size's batches, full (`batching.cut_into_batches`)."""
    return sum(-(-prompts // size) * size for size in sizes)


def batch_units(settings: Settings) -> list[Unit]:
    """One unit: the first shape (its tiny one under --tiny) at every batch size."""
    label, target_size, draft_size = (TINY_SHAPES if settings.tiny else SHAPES)[0]
    tokens, repeats, prompts = (8, 1, 1) if settings.tiny else (64, 3, 2)
    reference = Workload(len(BATCH_METHODS), tokens, repeats, batch_rows(prompts))
    work = Workload(len(BATCH_METHODS), unit_tokens(settings, EAGER), settings.repeats, batch_rows(settings.prompts))
    cost = default_cost(f"batch {label}", settings.rehearsal).for_work(work.size, reference.size)
    sizes = ",".join(map(str, BATCH_SIZES))
    return [Unit(f"{label} batch {sizes}", partial(run_batch_unit, shape=(label, target_size, draft_size)), cost)]


def run_batch_unit(ctx: StageContext, shape: tuple[str, str, str]) -> None:
    s, stem = ctx.settings, f"batch-{shape[0].replace('/', '-')}"
    decode = decode_params(ctx, chat=False, copy_n=0, max_new_tokens=unit_tokens(s, EAGER))
    with forced_pair(ctx, shape) as pair:  # acceptance set at s.rate in every row
        ctx.log(f"{stem}: {', '.join(BATCH_METHODS)} at batch {', '.join(map(str, BATCH_SIZES))} × {s.repeats}")
        result = run_benchmark(pair, suite_prompts(s.prompts), BATCH_METHODS, repeats=s.repeats, decode=decode,
                               cache=EAGER.cache, compile=EAGER.compile, batch=BATCH_SIZES,
                               progress=deadline_progress(ctx, stem))
    write_files(ctx, result, stem)
    path = s.out / f"{stem}.batch.csv"
    result.batches.to_csv(path, index=False)
    ctx.wrote(path)
    ctx.note(f"**{stem}** (eager+dynamic, forced acceptance {s.rate:.0%}): " + batch_verdict(result.batches))
    ctx.note("\n" + markdown(result.batches[SHOWN], cell=table_cell) + "\n")
