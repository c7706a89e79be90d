"""AR decode tokens/s, static vs dynamic KV cache (and compiled static), interleaved on one CPU thread.

Usage: python scripts/cache_ratio.py tiny|embedded MAX_NEW_TOKENS REPS [compile]
Run from the repository root with PYTHONPATH=. (it builds the tiny pair with tests/tiny.py); the ratio is reported, never asserted.
"""
import statistics
import sys
import tempfile

import torch
torch.set_num_threads(1)
import specdemo
from pathlib import Path
from tests.tiny import build_tiny_pair
which = sys.argv[1]
pair = specdemo.load_pair("embedded") if which == "embedded" else build_tiny_pair(Path(tempfile.gettempdir()) / "specdemo-cache-ratio-pair", dtype="float32")
prompt = "Explain why the sky is blue in two sentences." if which == "embedded" else "w5 w6 w7 w8"
n = int(sys.argv[2]); reps = int(sys.argv[3])
configs = [("dynamic", False), ("static", False)] + ([("static", True)] if len(sys.argv) > 4 else [])
tps = {c: [] for c in configs}
for c in configs:  # warm-up (and compile)
    r = specdemo.generate(pair, prompt, method="ar", max_new_tokens=n, cache=c[0], compile=c[1], seed=0)
    print(c, "warm-up compile_seconds", round(r.compile_seconds, 1), flush=True)
for rep in range(reps):
    for c in configs:
        r = specdemo.generate(pair, prompt, method="ar", max_new_tokens=n, cache=c[0], compile=c[1], seed=0)
        tps[c].append(r.stats["new_tokens"] / (r.seconds - r.prefill_seconds))
base = statistics.median(tps[configs[0]])
for c in configs:
    print(which, c, "median decode tok/s %.1f" % statistics.median(tps[c]), "ratio to dynamic %.3f" % (statistics.median(tps[c]) / base),
          "per-rep ratios", [round(a / b, 3) for a, b in zip(tps[c], tps[configs[0]])])
