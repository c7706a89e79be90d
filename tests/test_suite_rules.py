"""The suite's own rules. Only a test marked `runtime` exports a model for ONNX Runtime (tests/conftest.py).
The mutation check (`python -m tests.mutations`) stays in step with the engine: each mutant's line is
in its file exactly once, so an edit to the engine cannot leave a mutant that changes nothing or
changes the wrong line, and each mutant names tests that exist. The mutants themselves run only in
that command (each needs its own test run)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdemo.engine.runtimes import onnx_export
from tests import conftest
from tests.mutations import MUTANTS, ROOT, occurrences


def test_a_test_not_marked_runtime_cannot_export(request):
    with pytest.raises(pytest.fail.Exception, match=r"exports .*not marked @pytest.mark.runtime: load its pair"):
        onnx_export.export(Path("no-model"), "float32")
    request.node.stash[conftest._UNMARKED_EXPORTS].clear()  # refused as it should be: not this test's failure


@pytest.mark.runtime
def test_a_test_marked_runtime_reaches_the_export(monkeypatch):
    monkeypatch.setattr(onnx_export, "onnx_runtime_missing", lambda: "the runtime is missing here")
    with pytest.raises(onnx_export.ModelLoadError, match="the runtime is missing here"):
        onnx_export.export(Path("no-model"), "float32")


def test_six_named_mutants_each_a_change_of_one_line():
    assert [m.name for m in MUTANTS] == [f"M{i}" for i in range(1, 7)]
    for mutant in MUTANTS:
        assert mutant.original != mutant.mutated and "\n" not in mutant.original + mutant.mutated


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutants_line_is_in_its_source_file_exactly_once(mutant):
    assert occurrences(mutant) == 1, (f"{mutant.name}: {mutant.original!r} is in {mutant.path} "
                                      f"{occurrences(mutant)} times; update tests/mutations.py to the code")


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutants_catchers_are_tests_that_exist(mutant):
    for node in mutant.catchers:
        path, _, name = node.partition("::")
        function = name.split("[")[0]
        assert (ROOT / path).is_file(), node
        assert f"def {function}(" in (ROOT / path).read_text(encoding="utf-8"), node
