"""docs/drafters.md's "Adding a drafter": its example, put into a copy of the package, is a method in
`compare --methods`, in `sweep --methods` and in the page's method list, with nothing else edited."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.tiny import build_tiny_pair

ROOT = Path(__file__).resolve().parents[1]
MODULE_HEADER = re.compile(r"^# (specdemo/engine/drafters/(\w+)\.py)$")


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}\n")
    following = text.find("\n## ", start + 1)
    return text[start:following if following > 0 else None]


def example_files() -> dict[str, str]:
    """The section's code blocks whose first line names a file of the package: {path: source}."""
    section = _section((ROOT / "docs" / "drafters.md").read_text(), "Adding a drafter")
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    files = {}
    for block in blocks:
        first = block.splitlines()[0]
        if first.startswith("# specdemo/"):
            files[first[2:]] = block
    return files


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """A copy of the package with the example's files added, and a tiny pair's folders beside it."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(ROOT / "specdemo", root / "specdemo", ignore=shutil.ignore_patterns("__pycache__"))
    for path, source in example_files().items():
        target = root / path
        if target.exists():
            target.write_text(target.read_text() + "\n" + source)  # a line appended to an existing file
        else:
            target.write_text(source)
    build_tiny_pair(root / "models")
    return root


def _name() -> str:
    """The method the example registers."""
    registered = re.search(r'register\(Method\("([^"]+)"', "".join(example_files().values()))
    assert registered, "the example registers no method"
    return registered.group(1)


def _run(checkout: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(checkout), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, *args], cwd=checkout, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def _pair_flags(checkout: Path) -> list[str]:
    models = checkout / "models"
    return ["--target", str(models / "target"), "--draft", str(models / "draft"), "--device", "cpu",
            "--runtime", "torch"]


# In one process of the copy (importing torch, transformers and gradio costs seconds a process): where specdemo
# is imported from, whether the registry and the page hold the method, then the two commands as
# `python -m specdemo` runs them (`specdemo.cli.main`), each exiting 0.
IN_THE_COPY = """
import sys, specdemo, specdemo.engine.methods as methods
from specdemo.app import handlers
from specdemo.cli import main
name, flags, compare_csv, sweep_csv = sys.argv[1], sys.argv[2].split(), sys.argv[3], sys.argv[4]
print(specdemo.__file__, name in methods.METHODS, name in handlers.offered_methods(None))
assert main(["compare", *flags, "--methods", f"ar,{name}", "--prompt", "w5 w6 w7 w8 w5 w6 w7 w8 w5 w6",
             "--max-new-tokens", "12", "--no-vs-fp32", "--csv", compare_csv]) in (0, None)
assert main(["sweep", *flags, "--methods", name, "--gamma", "2,3", "--limit", "1", "--categories", "code",
             "--repeats", "1", "--no-warmup", "--max-new-tokens", "8", "--quiet", "--csv", sweep_csv]) in (0, None)
"""


@pytest.fixture(scope="module")
def ran(checkout, tmp_path_factory):
    """What the copy said and wrote: (its first line's words, compare's summary CSV, sweep's rows CSV)."""
    out = tmp_path_factory.mktemp("ran")
    compare_csv, sweep_csv = out / "summary.csv", out / "rows.csv"
    done = _run(checkout, "-c", IN_THE_COPY, _name(), " ".join(_pair_flags(checkout)), str(compare_csv),
                str(sweep_csv))
    said = next(line for line in done.stdout.splitlines() if line.endswith(("True", "False"))).split()
    return said, compare_csv, sweep_csv


def test_the_section_holds_a_module_that_registers_its_method():
    files = example_files()
    assert any(MODULE_HEADER.match(f"# {path}") for path in files)
    assert "register(Method(" in "".join(files.values())


def test_the_copy_registers_the_example_and_the_page_offers_it(checkout, ran):
    where, registered, offered = ran[0][-3:]
    assert Path(where).is_relative_to(checkout)  # the copy, not this checkout
    assert registered == "True" and offered == "True"


def test_compare_runs_the_new_method_and_it_equals_ar(ran):
    name = _name()
    table = pd.read_csv(ran[1]).set_index("method")
    assert name in table.index
    assert bool(table.loc[name, "matches_ar"])


def test_sweep_grids_the_new_method_on_its_axis(ran):
    name = _name()
    rows = pd.read_csv(ran[2])
    mine = rows[rows.method == name]
    assert sorted(mine.gamma.unique()) == [2, 3]
    assert mine.matches_ar.all()
