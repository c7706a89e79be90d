"""The package's other commands, under `python -m specdemo`: the suites of `specdemo.bench` and,
as the group `python -m specdemo train <command>`, the training modules.

Each is a module with its own argparse `main`; a command here runs that module as
`python -m <module>` would, with the rest of the command line as its own, so its flags and its
`--help` are the module's. Nothing is imported until a command runs (the training modules are a
layer the command line never imports); the one-line summaries come from the modules' docstrings,
read from their files.
"""

from __future__ import annotations

import argparse
import ast
import runpy
import sys
import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent


def by_command(modules: tuple[str, ...], renamed: dict[str, str] | None = None) -> dict[str, str]:
    """command → module: each module under its own name, dashed (gpu_suite → gpu-suite), or as `renamed` says."""
    return {(renamed or {}).get(module) or module.rsplit(".", 1)[1].replace("_", "-"): module for module in modules}


# command → module, each run as `python -m <module>`.
TOOLS = by_command(("specdemo.bench.page", "specdemo.bench.ab", "specdemo.bench.gpu_suite", "specdemo.bench.precision",
                    "specdemo.bench.kv_bench", "specdemo.bench.rest", "specdemo.bench.synthetic",
                    "specdemo.bench.runtime_round"))
TRAIN = by_command(("specdemo.training.corpus", "specdemo.training.passages", "specdemo.training.layers",
                    "specdemo.training.eagle", "specdemo.training.evaluate", "specdemo.training.curve",
                    "specdemo.training.card", "specdemo.training.install", "specdemo.training.carve",
                    "specdemo.training.at_scale", "specdemo.training.train_draft",
                    "specdemo.training.specdecpp", "specdemo.training.osd"),
                   renamed={"specdemo.training.train_draft": "draft-lm"})


def summary(module: str) -> str:
    """The first paragraph of the module's docstring (a package's from its __init__.py), and where it lives."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return f"{first} ({module})"


def run_module(module: str, argv: list[str]) -> int:
    """`python -m <module> <argv>`, in this process: its exit status."""
    saved = sys.argv
    sys.argv = [module, *argv]
    try:
        with warnings.catch_warnings():  # a module this process imported already runs afresh, as under -m
            warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0


def add_to(subparsers) -> None:
    """Each tool, and the train group, as a subcommand in `python -m specdemo --help`."""
    for name, module in TOOLS.items():
        subparsers.add_parser(name, help=summary(module), add_help=False)
    train = subparsers.add_parser("train", help="the drafts' training: python -m specdemo train COMMAND --help",
                                  description="The drafts' training, one command each; each takes its module's "
                                              "own flags (python -m specdemo train COMMAND --help).")
    group = train.add_subparsers(dest="train_command", metavar="COMMAND", required=True)
    for name, module in TRAIN.items():
        group.add_parser(name, help=summary(module), add_help=False)


def epilog() -> str:
    return "training commands (python -m specdemo train COMMAND):\n" + "\n".join(
        f"  {name:14s}{summary(module)}" for name, module in TRAIN.items())


def dispatch(argv: list[str]) -> int | None:
    """Runs a tool or a training command named by argv, or None when argv names neither."""
    if argv and argv[0] in TOOLS:
        return run_module(TOOLS[argv[0]], argv[1:])
    if len(argv) > 1 and argv[0] == "train" and argv[1] in TRAIN:
        return run_module(TRAIN[argv[1]], argv[2:])
    return None


def formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=28, width=120)
