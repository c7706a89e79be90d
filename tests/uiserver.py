"""Serve the playground on 127.0.0.1 with a tiny local model pair, for the UI and browser tests."""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from specdemo.models.loading import Preset, load_pair
from tests.tiny import build_tiny_pair, write_tiny_head

TINY = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_presets(root: Path) -> dict[str, Preset]:
    build_tiny_pair(root, draft_noise=0.3)
    return {TINY: Preset(TINY, str(root / "target"), str(root / "draft"), "tiny random Llama pair for tests")}


TINY_HEAD = "tiny-head"


def tiny_head_presets(root: Path) -> dict[str, Preset]:
    """The tiny target drafted by a feature-level head first (like the embedded default pair), then the tiny pair."""
    presets = tiny_presets(root)
    head = root / "head"
    if not head.exists():
        write_tiny_head(head, root / "target")
    return {TINY_HEAD: Preset(TINY_HEAD, str(root / "target"), str(head), "tiny target + a feature head"), **presets}


def tiny_loader(target, draft=None, device=None, dtype=None, **precisions):
    """The pair in float64 on the CPU, but for a precision chosen on the page (target_dtype, draft_dtype), on
    the torch target but for a runtime chosen on the page (the page passes auto as no runtime)."""
    precisions.setdefault("runtime", "torch")
    return load_pair(target, draft, device="cpu", dtype="float64", **precisions)


@contextmanager
def serve(root: Path, presets=None, loader=tiny_loader, defaults=None, **options) -> Iterator[tuple[str, object]]:
    """options go to `ui.build_demo` (e.g. limits=Limits(public=True, ...))."""
    from specdemo.app import ui

    demo = ui.build_demo(pair_loader=loader, presets=presets if presets is not None else tiny_presets(root),
                         defaults=defaults, **options)
    port = free_port()
    ui.launch(demo, prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True)
    try:
        yield f"http://127.0.0.1:{port}/", demo
    finally:
        demo.close()
        demo.specdemo_cache.clear()



@contextmanager
def counting_target_forwards(demo, pause_s: float = 0.0) -> Iterator[list[int]]:
    """calls[0] counts the forwards of the served pairs' targets while the block runs.

    pause_s slows every forward down, so a run lasts long enough to be interrupted on any machine."""
    calls = [0]

    def count(*_):
        calls[0] += 1
        if pause_s:
            time.sleep(pause_s)

    handles = [pair.target.register_forward_hook(count) for pair in demo.specdemo_cache._pairs.values()]
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def watching_decodes() -> Iterator[tuple[list[bool], threading.Event]]:
    """Watches every decode the page starts: `ended` gets one entry as each stops (True if it ran to
    its end, False if it was closed before), and `stopped` is set at the first stop."""
    from specdemo.app import handlers

    original = handlers.iter_generate
    ended: list[bool] = []
    stopped = threading.Event()

    def watched(*args, **kwargs):
        rounds = original(*args, **kwargs)

        def relay():
            finished = False
            try:
                yield from rounds
                finished = True
            finally:  # closing this generator closes the decode's too
                ended.append(finished)
                stopped.set()

        return relay()

    handlers.iter_generate = watched
    try:
        yield ended, stopped
    finally:
        handlers.iter_generate = original
