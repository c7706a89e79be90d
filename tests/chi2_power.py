"""How surely the χ² cases of test_lossless_sampling catch mutant M2 (the correction drawn from p) at
a given number of runs: each case's p-value in four blocks of seeds, with M2 in a copy of the engine.
The tests fail a case below 1e-3; a block above it is a run in which the bug would pass. NASD's drafts
are point masses, whose corrections do not go through M2's line, so its cases pass with or without it.

    python -m tests.chi2_power          # the cases' own sizes
    python -m tests.chi2_power 300      # every case at 300 runs (about two minutes of CPU)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.mutations import MUTANTS, _copy_of_the_project

BLOCKS = 4
PROBE = """
import sys, tempfile
from pathlib import Path
import torch
from tests.test_lossless_sampling import CASES, build_far_draft_pair, build_small_vocab_pair, case_pair, joint_p_value
torch.set_num_threads(1)
root, runs, blocks = Path(tempfile.mkdtemp()), int(sys.argv[1]), int(sys.argv[2])
small, far = build_small_vocab_pair(root / "small"), build_far_draft_pair(root / "far")
for method, sampling, size in CASES:
    n = runs or size
    p_values = [joint_p_value(case_pair(method, small, far), method, sampling, n, first_seed=block * n)
                for block in range(blocks)]
    print(f"{method} {sampling} at {n} runs:", ", ".join(f"{p:.1e}" for p in p_values), flush=True)
"""


def main(argv: list[str]) -> int:
    runs = int(argv[0]) if argv else 0
    mutant = next(m for m in MUTANTS if m.name == "M2")
    with tempfile.TemporaryDirectory(prefix="specdemo-power-") as folder:
        copy = _copy_of_the_project(Path(folder))
        source = copy / mutant.path
        text = source.read_text(encoding="utf-8")
        if text.count(mutant.original) != 1:
            raise SystemExit(f"M2's line is not once in {mutant.path}: update tests/mutations.py to the code")
        source.write_text(text.replace(mutant.original, mutant.mutated), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": str(copy), "HF_HUB_OFFLINE": "1"}
        return subprocess.run([sys.executable, "-c", PROBE, str(runs), str(BLOCKS)], cwd=copy, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
