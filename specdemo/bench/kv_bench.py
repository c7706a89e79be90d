"""KV-cache policies measured on the long suite, and peak KV memory against generated length.

    python -m specdemo.bench.kv_bench policies --lengths 2048 --budgets 256 --max-new-tokens 128
    python -m specdemo.bench.kv_bench growth --budget 256 --new-tokens 256,512,1024,2048

`policies`: on each long prompt, full-cache AR is the reference; SD with the draft's cache under
each policy and budget (lossless: acceptance, speed and the draft's peak KV bytes), and AR with
the target's cache under each (lossy: token match against full-cache AR and perplexity under
the full-cache target). `growth`: AR's peak KV bytes as it writes more tokens, full against
streaming (end-of-sequence ignored, so every run writes its length). Greedy, one thread by
default; --csv writes the table, --html the growth chart.
"""

from __future__ import annotations

import argparse
import dataclasses

import pandas as pd
import torch

from ..engine.decoding import generate
from ..models.loading import load_pair
from .long_suite import long_suite
from .precision import show_table, token_match
from .suite import encode_prompt
from .measure.tables import target_perplexity
from ..engine.methods import FIXED_GAMMA, REFERENCE, get_method


def _settings(budgets: list[int]) -> list[tuple[str, str, str, int]]:
    """(label, method, which cache, policy, budget) rows of the policies table, reference first."""
    ar, sd = get_method(REFERENCE).label, get_method(FIXED_GAMMA).label
    rows = [(f"{ar}, full caches", REFERENCE, "target_kv", "full", 0),
            (f"{sd}, full caches", FIXED_GAMMA, "draft_kv", "full", 0)]
    for budget in budgets:
        for kind in ("streaming", "l2"):
            rows.append((f"{sd}, draft {kind} {budget}", FIXED_GAMMA, "draft_kv", kind, budget))
            rows.append((f"{ar}, target {kind} {budget}", REFERENCE, "target_kv", kind, budget))
    return rows


def measure_policies(pair_name: str, lengths: list[int], budgets: list[int], max_new_tokens: int,
                     per_length: int = 1) -> pd.DataFrame:
    pair = load_pair(pair_name, device="cpu", runtime="torch")
    prompts = [encode_prompt(pair, p, chat=True) for p in long_suite(pair.tokenizer, tuple(lengths), per_length)]
    rows = []
    for ids in prompts:
        generate(pair, ids[:256], method=FIXED_GAMMA, max_new_tokens=8)  # warm the kernels up
        reference = None
        for label, method, cache, kind, budget in _settings(budgets):
            params = {cache: kind, "kv_budget": budget or 256}
            result = generate(pair, ids, method=method, max_new_tokens=max_new_tokens, copy_n=0, **params)
            reference = reference or result
            stats = result.stats
            rows.append({"prompt_tokens": len(ids), "setting": label,
                         "acceptance_rate": stats["acceptance_rate"],
                         "decode_tokens_per_s": len(result.tokens) / (result.seconds - result.prefill_seconds),
                         "prefill_s": result.prefill_seconds,
                         "target_kv_bytes_peak": stats["target_kv_bytes_peak"],
                         "draft_kv_bytes_peak": stats["draft_kv_bytes_peak"],
                         "token_match_vs_full_ar": token_match(result.token_ids, reference.token_ids),
                         "perplexity_under_full_target": target_perplexity(pair, result)})
    frame = pd.DataFrame(rows)
    return frame.groupby("setting", sort=False).mean(numeric_only=True).reset_index()


def measure_growth(pair_name: str, budget: int, new_tokens: list[int]) -> pd.DataFrame:
    """AR's peak KV bytes after each length of output, full against streaming."""
    pair = load_pair(pair_name, device="cpu", runtime="torch")
    pair = dataclasses.replace(pair, eos_ids=frozenset({-1}))  # write every token asked for
    ids = pair.encode("Tell me a long story about a lighthouse keeper.", chat=True)
    rows = []
    for n in new_tokens:
        for kind in ("full", "streaming"):
            result = generate(pair, ids, method=REFERENCE, max_new_tokens=n, target_kv=kind, kv_budget=budget)
            rows.append({"new_tokens": n, "target_kv": kind, "target_kv_bytes_peak": result.stats["target_kv_bytes_peak"],
                         "decode_tokens_per_s": n / (result.seconds - result.prefill_seconds)})
    return pd.DataFrame(rows)


def growth_chart(frame: pd.DataFrame, path: str) -> None:
    import plotly.express as px

    figure = px.line(frame, x="new_tokens", y="target_kv_bytes_peak", color="target_kv", markers=True,
                     labels={"new_tokens": "generated tokens", "target_kv_bytes_peak": "peak KV bytes (target)"},
                     title="Peak KV memory against generated length")
    figure.write_html(path, include_plotlyjs="cdn")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdemo.bench.kv_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("policies", "growth"))
    parser.add_argument("--pair", default="embedded-lm", help="a pair whose draft is an LM (default: embedded-lm)")
    parser.add_argument("--lengths", default="2048", help="policies: long-suite prompt lengths in tokens")
    parser.add_argument("--per-length", type=int, default=1, help="policies: prompts per length")
    parser.add_argument("--budgets", default="256", help="policies: comma-separated kv_budget values")
    parser.add_argument("--budget", type=int, default=256, help="growth: the streaming cache's kv_budget")
    parser.add_argument("--new-tokens", default="256,512,1024,2048", help="growth: output lengths")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="policies: new tokens per run")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--csv", default=None)
    parser.add_argument("--html", default=None, help="growth: write the chart here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    if args.what == "policies":
        frame = measure_policies(args.pair, ints(args.lengths), ints(args.budgets), args.max_new_tokens,
                                 args.per_length)
    else:
        frame = measure_growth(args.pair, args.budget, ints(args.new_tokens))
        if args.html:
            growth_chart(frame, args.html)
    show_table(frame, args.csv)
    return 0


if __name__ == "__main__": raise SystemExit(main())
