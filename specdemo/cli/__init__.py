"""`python -m specdemo <command>`: the command line.

Subcommands are listed explicitly in `SUBCOMMANDS` (name → (add_arguments, run)); adding one
is writing a module with those two functions and adding its entry here. The package's other
commands (the bench suites, and the training modules as `train COMMAND`) are modules with their
own `main`, listed in `commands.py` and run as `python -m <module>` would run them. May import
every layer below it (engine, models, bench), and names the training modules only to run them;
nothing imports it but ``specdemo.__main__``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable

from ..models.errors import ModelLoadError
from . import bench, commands, compare, sweep

AddArguments = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

SUBCOMMANDS: dict[str, tuple[AddArguments, Run]] = {
    "compare": (compare.add_arguments, compare.run),
    "bench": (bench.add_arguments, bench.run),
    "sweep": (sweep.add_arguments, sweep.run),
}


def build_parser(subcommands: dict[str, tuple[AddArguments, Run]] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdemo", description="Compare AR, SD, NASD and EGAG decoding.",
                                     epilog=commands.epilog(), formatter_class=commands.formatter)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, (add_arguments, run) in (subcommands or SUBCOMMANDS).items():
        summary = (run.__doc__ or "").strip().splitlines()[0] if run.__doc__ else None
        sub = subparsers.add_parser(name, help=summary, description=summary)
        add_arguments(sub)
        sub.set_defaults(run=run)
    commands.add_to(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    status = commands.dispatch(argv)
    if status is not None:
        return status
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, ModelLoadError, FileNotFoundError, ConnectionError) as error:  # ConnectionError: --cluster
        print(f"error: {error}", file=sys.stderr)
        return 2
