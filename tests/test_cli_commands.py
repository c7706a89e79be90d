"""Every command of the package is in `python -m specdemo --help`: each module with a `__main__`
guard, and each package with a `__main__.py`, found by walking the package, so a new one fails here
until it is registered in `specdemo.cli.commands`; the training modules form `train COMMAND`."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from specdemo.cli import commands

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "specdemo"


def _has_main_guard(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", '__name__ == "__main__"')
               for node in tree.body)


def entry_points() -> list[str]:
    """Every module `python -m` runs, but the command line's own (`specdemo.__main__`)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if path.name == "__main__.py":
            found.append(".".join(parts[:-1]))
        elif _has_main_guard(ast.parse(path.read_text(encoding="utf-8"))):
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return [name for name in found if name != "specdemo"]


def _help(*argv: str) -> str:
    out = subprocess.run([sys.executable, "-m", "specdemo", *argv, "--help"], cwd=ROOT, capture_output=True,
                         text=True, env={"COLUMNS": "120", "PATH": "", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.fixture(scope="module")
def top_help() -> str:
    return _help()


def test_the_walk_finds_the_package_entry_points():
    found = entry_points()
    assert "specdemo.bench.gpu_suite" in found and "specdemo.training.corpus" in found
    assert "specdemo.bench.gpu_suite.cli" not in found


def test_every_entry_point_is_a_registered_command():
    registered = set(commands.TOOLS.values()) | set(commands.TRAIN.values())
    assert sorted(set(entry_points()) - registered) == []
    assert sorted(registered - set(entry_points())) == []


def test_the_help_lists_every_command_and_its_module(top_help):
    listed = " ".join(top_help.split())
    for name in ("compare", "bench", "sweep", "train", *commands.TOOLS):
        assert f" {name} " in listed, name
    missing = [module for module in entry_points() if f"({module})" not in listed]
    assert not missing, f"python -m specdemo --help does not list {missing}"


def test_train_help_lists_the_training_commands():
    listed = " ".join(_help("train").split())
    for name, module in commands.TRAIN.items():
        assert f" {name} " in listed and f"({module})" in listed, name
    assert all(module.startswith("specdemo.training.") for module in commands.TRAIN.values())


def test_a_command_runs_its_module_with_the_rest_of_the_line(capsys):
    assert commands.dispatch(["rest", "--help"]) == 0
    assert "usage: python -m specdemo.bench.rest" in capsys.readouterr().out
    assert commands.dispatch(["rest", "no-such-action"]) == 2
    assert commands.dispatch(["compare", "--help"]) is None  # the CLI's own subcommands parse as before
    assert commands.dispatch(["train"]) is None  # the group's own help and error
