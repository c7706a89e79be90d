"""What specdemo imports when it loads is what it declares: a Space installs requirements.txt and
nothing else, and a pip install reads pyproject's dependencies."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {_name(r) for r in project["dependencies"]}


def required_by_the_space() -> set[str]:
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return {_name(line) for line in lines if line.strip() and not line.lstrip().startswith("#")}


def imported_at_load() -> dict[str, set[str]]:
    """Third-party top-level modules imported at module level (lazy imports are optional extras)."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "specdemo").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "specdemo":
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_module_imported_at_load_comes_from_a_declared_dependency():
    distributions = packages_distributions()
    wanted = declared()
    for module, files in imported_at_load().items():
        names = {d.lower().replace("_", "-") for d in distributions.get(module, [module])}
        assert names & wanted, f"{module} (imported by {sorted(files)}) is not in pyproject's dependencies"


def test_the_space_installs_what_pyproject_declares():
    assert required_by_the_space() == declared()
