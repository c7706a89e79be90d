"""The package layout: each subpackage imports on its own, lower layers never import upper ones."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ["engine", "models", "bench", "training", "cli", "app"]
# What each layer must not pull in, directly or through what it imports.
FORBIDDEN = {
    "engine": ["gradio", "pandas", "plotly", "specdemo.models", "specdemo.app", "specdemo.bench", "specdemo.cli",
               "specdemo.training"],
    "models": ["gradio", "pandas", "plotly", "specdemo.app", "specdemo.bench", "specdemo.cli", "specdemo.training"],
    "bench": ["gradio", "specdemo.app", "specdemo.cli", "specdemo.training"],
    "training": ["gradio", "specdemo.app", "specdemo.bench", "specdemo.cli"],
    "cli": ["gradio", "specdemo.app", "specdemo.training"],
    "app": ["specdemo.cli", "specdemo.training"],
}


def _loaded_after_import(module: str) -> set[str]:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("name", SUBPACKAGES)
def test_each_subpackage_imports_alone_and_only_from_below(name):
    loaded = _loaded_after_import(f"specdemo.{name}")
    for forbidden in FORBIDDEN[name]:
        hits = sorted(m for m in loaded if m == forbidden or m.startswith(forbidden + "."))
        assert not hits, f"specdemo.{name} imports {hits}"


def test_the_top_level_api_needs_no_front_end():
    loaded = _loaded_after_import("specdemo")
    assert not any(m.split(".")[0] in ("gradio", "plotly") for m in loaded)
    import specdemo

    for name in ("load_pair", "generate", "iter_generate", "ModelLoadError", "DecodeParams"):
        assert hasattr(specdemo, name)


def test_every_subpackage_says_what_it_owns_and_may_import():
    import importlib

    for name in SUBPACKAGES:
        doc = importlib.import_module(f"specdemo.{name}").__doc__ or ""
        assert "import" in doc.lower(), f"specdemo.{name} has no import rule in its docstring"
