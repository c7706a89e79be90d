"""The mutation check: six bugs a speculative decoder can have, each put into a copy of the engine in
turn, and the tests that must catch each one run against it. A mutant that any of its named tests
does not fail survives, and the check fails: that test would not notice the bug it is named for.

    python -m tests.mutations            # every mutant (three minutes of CPU)
    python -m tests.mutations M2 M5      # some of them

Each mutant is one textual replacement of a line that appears exactly once in its file
(`tests/test_mutations.py` checks that, so an edit to the engine cannot leave a mutant silently
matching nothing). The mutants go into a temporary copy of the package, never into the checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Mutant:
    name: str
    bug: str
    path: str  # relative to the repository root
    original: str  # a line's text, found exactly once in `path`
    mutated: str
    catchers: tuple[str, ...]  # the test node ids that must fail with this mutant in place (every one)


SAMPLING = "specdemo/engine/sampling.py"
MUTANTS = (
    Mutant("M1", "greedy verification keeps one draft past the first that differs from the target's argmax",
           SAMPLING,
           "accepted = torch.cumprod((target_tokens[:k] == drafts).long(), 0).sum()",
           "accepted = (torch.cumprod((target_tokens[:k] == drafts).long(), 0).sum() + 1).clamp(max=k)",
           ("tests/test_sampling.py::test_greedy_verification_keeps_the_argmax_prefix_and_returns_the_argmax",
            "tests/test_decoding.py::test_greedy_output_is_exactly_ars[sd-plain-dynamic]")),
    Mutant("M2", "the correction after a rejection is drawn from p, not from norm(max(p - q, 0))",
           SAMPLING,
           "residual = torch.clamp(p - draft_probs[at], min=0.0)",
           "residual = p.clone()",
           ("tests/test_sampling.py::test_model_draft_verification_samples_exactly_from_p",)),
    Mutant("M3", "the KV cache's rollback keeps one rejected position",
           "specdemo/engine/targets/lm.py",
           "self.cache.crop(-surplus)",
           "self.cache.crop(-(surplus - 1)) if surplus > 1 else None",
           ("tests/test_decoding.py::test_greedy_output_is_exactly_ars[sd-plain-dynamic]",
            "tests/test_decoding.py::test_greedy_output_is_exactly_ars[egag-repetitive-dynamic]")),
    Mutant("M4", "when every draft is kept, the bonus token is drawn from q at the last draft, not from p after it",
           SAMPLING,
           "dist = torch.where(accepted == k, target_probs[k], residual)",
           "dist = torch.where(accepted == k, draft_probs[k - 1] if draft_probs is not None else target_probs[k], "
           "residual)",
           ("tests/test_sampling.py::test_bonus_token_is_sampled_from_the_next_position_when_every_draft_is_kept",)),
    Mutant("M5", "a draft is kept with probability min(1, q/p) instead of min(1, p/q)",
           SAMPLING,
           "rejected = uniforms * q_of_drafts > p_of_drafts",
           "rejected = uniforms * p_of_drafts > q_of_drafts",
           ("tests/test_sampling.py::test_model_draft_verification_samples_exactly_from_p",
            "tests/test_sampling.py::test_point_mass_verification_samples_exactly_from_p[0]")),
    Mutant("M6", "the batch's target counts positions by slot (holes included), not by each row's own tokens",
           "specdemo/engine/targets/batched.py",
           "positions[i] = torch.arange(start, start + width, device=self.device)",
           "positions[i] = torch.arange(past, past + width, device=self.device)",
           ("tests/test_batch.py::test_greedy_rows_equal_ar_alone[sd]",)),
)


def occurrences(mutant: Mutant, root: Path = ROOT) -> int:
    return (root / mutant.path).read_text(encoding="utf-8").count(mutant.original)


def _copy_of_the_project(into: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for folder in ("specdemo", "tests"):
        shutil.copytree(ROOT / folder, into / folder, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", into / "pyproject.toml")
    return into


def _failed(copy: Path, node_ids: tuple[str, ...]) -> tuple[int, set[str], str]:
    """(pytest's exit status, the node ids that failed, its output's tail) for these tests in the copy."""
    env = {**os.environ, "PYTHONPATH": str(copy), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rf",
                           "-W", "ignore::pytest.PytestUnraisableExceptionWarning", *node_ids],
                          cwd=copy, env=env, capture_output=True, text=True)
    failed = set(re.findall(r"^FAILED (\S+)", done.stdout, flags=re.MULTILINE))
    return done.returncode, {node.split(" - ")[0] for node in failed}, done.stdout[-3000:] + done.stderr[-2000:]


def _imports_the_copy(copy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    where = subprocess.run([sys.executable, "-c", "import specdemo; print(specdemo.__file__)"], cwd=copy, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()
    if not Path(where).resolve().is_relative_to(copy.resolve()):
        raise SystemExit(f"the copy's tests would import specdemo from {where}, not from the copy")


def check(mutants: tuple[Mutant, ...]) -> int:
    """Runs each mutant's catchers against it; prints a table; 0 when every mutant is caught."""
    with tempfile.TemporaryDirectory(prefix="specdemo-mutants-") as folder:
        copy = _copy_of_the_project(Path(folder))
        _imports_the_copy(copy)
        catchers = tuple(dict.fromkeys(node for m in mutants for node in m.catchers))
        status, failed, tail = _failed(copy, catchers)
        if status != 0:
            print(tail)
            print(f"the catchers fail without any mutant ({sorted(failed)}): fix them first")
            return 2
        survivors = []
        for mutant in mutants:
            survivors += [] if _caught(copy, mutant) else [mutant.name]
    if survivors:
        print(f"survived: {', '.join(survivors)}: the tests above do not notice these bugs")
        return 1
    print(f"all {len(mutants)} mutants caught")
    return 0


def _caught(copy: Path, mutant: Mutant) -> bool:
    source = copy / mutant.path
    text = source.read_text(encoding="utf-8")
    if text.count(mutant.original) != 1:
        raise SystemExit(f"{mutant.name}: {mutant.original!r} is in {mutant.path} {text.count(mutant.original)} "
                         "times, not once: update the mutant to the code")
    try:
        source.write_text(text.replace(mutant.original, mutant.mutated), encoding="utf-8")
        status, failed, tail = _failed(copy, mutant.catchers)
    finally:
        source.write_text(text, encoding="utf-8")
    caught = [node for node in mutant.catchers if node in failed]
    missed = [node for node in mutant.catchers if node not in failed]
    if status not in (0, 1):  # an error, not a test's failure: collection, import, usage
        print(tail)
    print(f"{mutant.name}  {mutant.bug}", flush=True)
    print(f"    caught by {', '.join(caught)}" if caught else "    SURVIVED", flush=True)
    if missed and caught:
        print(f"    but not by {', '.join(missed)}, which is named as a catcher", flush=True)
    return not missed


def main(argv: list[str]) -> int:
    unknown = set(argv) - {m.name for m in MUTANTS}
    if unknown:
        raise SystemExit(f"no mutant named {', '.join(sorted(unknown))}; they are {', '.join(m.name for m in MUTANTS)}")
    return check(tuple(m for m in MUTANTS if not argv or m.name in argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
