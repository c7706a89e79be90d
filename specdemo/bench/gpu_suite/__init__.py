"""One command for a GPU's first minutes: `python -m specdemo.bench.gpu_suite --out DIR`.

Stages, in order, cut into units planned under one time budget (`--budget`, `plan`), each
catching its own failure into the markdown summary (`DIR/summary.md`, rewritten after every
unit): the CUDA-only calls checked (`checks`) and probed on a toy, random-weight pairs of real shapes with forced
acceptance (`forced`, `pairs`), the embedded pair, greedy losslessness (`lossless`), batch sizes
1, 8 and 32 with forced acceptance (`batch`), and optionally head data at scale (`head`). `--compile-cache` keeps torch.compile's artifacts for a
rerun on the same card (`compile_cache`). `--tiny` rehearses every stage on a CPU in minutes.
`docs/gpu.md` gives the whole sequence.

May import ``engine``, ``models`` and the other bench modules; runs ``training`` only as
subprocesses.
"""

from .cli import STAGES, main

__all__ = ["STAGES", "main"]
