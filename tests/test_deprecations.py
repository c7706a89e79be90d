"""Deprecated names fail the test run, not users: the run turns deprecation warnings that
our calls provoke into errors (pyproject.toml's `filterwarnings`), and no call in specdemo
uses the cache's old argument name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parent.parent


def test_a_model_called_with_a_deprecated_argument_fails_the_run(tiny_pair):
    ids = torch.tensor([[1, 2, 3]])
    # The current name raises nothing.
    tiny_pair.target(input_ids=ids, cache=DynamicCache(config=tiny_pair.target.config), use_cache=True)
    # transformers warns about the old one from its own frames, not ours; the run's filters still catch it.
    with pytest.raises(FutureWarning, match="past_key_values"):
        tiny_pair.target(input_ids=ids, past_key_values=DynamicCache(config=tiny_pair.target.config), use_cache=True)


def test_a_deprecation_warned_from_specdemo_fails_the_run():
    import warnings

    code = compile("warnings.warn('old name', DeprecationWarning)", "specdemo/fake.py", "exec")
    with pytest.raises(DeprecationWarning):
        exec(code, {"__name__": "specdemo.fake", "warnings": warnings})


def test_no_specdemo_call_passes_or_reads_the_cache_by_its_old_name():
    old = []
    for path in sorted((ROOT / "specdemo").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "past_key_values":
                old.append(f"{path.relative_to(ROOT)}:{node.value.lineno} past_key_values=")
            elif isinstance(node, ast.Attribute) and node.attr == "past_key_values":
                old.append(f"{path.relative_to(ROOT)}:{node.lineno} .past_key_values")
    assert not old, "use `cache`: " + ", ".join(old)
