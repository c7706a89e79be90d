"""A non-editable install works outside the checkout: the wheel carries the trained draft and
the prompt suite, and from another directory the embedded pair loads and `bench` runs on its
default suite; after the README's own install, its Python snippet and command lines run from any folder."""

import os
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGED = [
    "specdemo/models/assets/smollm2-draft/config.json",
    "specdemo/models/assets/smollm2-draft/model.safetensors",
    "specdemo/models/assets/smollm2-head/feature_head.json",
    "specdemo/models/assets/smollm2-head/feature_head.safetensors",
    "specdemo/models/assets/specdecpp-head/head.json",  # SpecDec++'s acceptance head (engine.drafters.acceptance_head)
    "specdemo/models/assets/specdecpp-head/head.pt",
    "specdemo/bench/suite.jsonl",
    "specdemo/training/data/train_prompts.jsonl",
    "specdemo/training/data/heldout_prompts.jsonl",
]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Build from a clean copy: a stale build/ folder in the checkout could leak old files into the wheel.
    source = tmp_path_factory.mktemp("source") / "specdemo"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".venv",
                                                                 "tests", ".pytest_cache"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source),
                    "-w", str(out)], check=True, capture_output=True, cwd=out)
    (path,) = out.glob("specdemo-*.whl")
    return path


def test_the_wheel_carries_the_draft_and_the_suite(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in PACKAGED if name not in names]
    assert not missing, f"not in the wheel: {missing}"
    assert not any(name.startswith(("tests/", "assets/")) for name in names)


@pytest.mark.slow
@pytest.mark.runtime  # the default path from the wheel: auto puts the embedded target on the runtime
def test_installed_wheel_loads_the_embedded_pair_and_benches_from_elsewhere(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
    bench = ["bench", "--limit", "1", "--categories", "chat", "--max-new-tokens", "4", "--methods", "ar", "--repeats",
             "1", "--no-warmup", "--quiet", "--csv", "runs.csv"]
    # One interpreter loads the pair, then runs `python -m specdemo bench` as -m does (runpy, as __main__):
    # importing the package and its libraries is most of a start, and this pays it once.
    check = ("import runpy, sys, specdemo, specdemo.models.embedded as e; "
             f"assert specdemo.__file__.startswith({str(site)!r}), specdemo.__file__; "
             "pair = specdemo.load_pair('embedded'); "
             "assert pair.draft is not None and str(e.DRAFT_DIR).startswith(" + repr(str(site)) + "); print('ok'); "
             f"del pair; sys.argv = ['specdemo', *{bench!r}]; "
             "runpy.run_module('specdemo', run_name='__main__', alter_sys=True)")
    done = subprocess.run([sys.executable, "-c", check], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
    assert (elsewhere / "runs.csv").is_file()


def readme_examples() -> tuple[str, list[str]]:
    """The README's Python snippet (its first ```python block) and the command lines of the ```bash block after it."""
    from tests.test_docs import FENCE, README

    fences = FENCE.findall(README.read_text(encoding="utf-8"))
    first = next(i for i, block in enumerate(fences) if block.startswith("```python\n"))
    commands = next(block for block in fences[first + 1:] if block.startswith("```bash\n"))

    def body(block: str) -> str:
        return block.split("\n", 1)[1].rsplit("```", 1)[0]
    return body(fences[first]), [line for line in body(commands).splitlines() if line.strip()]


def test_the_readme_examples_are_a_snippet_and_three_commands_that_write_under_results():
    snippet, commands = readme_examples()
    assert "import specdemo" in snippet and len(commands) == 3
    assert [shlex.split(line)[:4] for line in commands] == [
        ["python", "-m", "specdemo", name] for name in ("compare", "bench", "sweep")]
    assert [shlex.split(line)[shlex.split(line).index("--csv") + 1] for line in commands[1:]] == [
        "results/runs.csv", "results/sweep.csv"]


@pytest.mark.slow
@pytest.mark.runtime  # the default path: the examples load the embedded pair with its target on the runtime
def test_the_readmes_python_and_command_line_examples_run_from_a_folder_outside_the_checkout(tmp_path):
    """After the README's install, from any folder: the Python snippet and the three commands exit 0, and the
    CSVs land under that folder's results/, nothing else in it."""
    snippet, commands = readme_examples()
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    runs = [[sys.executable, "-c", snippet]] + [[sys.executable, *shlex.split(line)[1:]] for line in commands]
    for argv in runs:
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{argv[1:4]}: {done.stderr[-2000:]}"
    results = tmp_path / "results"
    assert (results / "runs.csv").is_file() and (results / "runs.summary.csv").is_file()
    assert (results / "sweep.csv").is_file() and (results / "sweep.summary.csv").is_file()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["results"]
