"""What the page's tabs share: the context each tab is built with, and the bookkeeping of
visitors' runs.

`TabContext` is everything a tab's `build_tab` needs from the page (the served presets, a
cached pair loader, the deployment's limits, the GPU decorator, the export folder, the
device queue and `RunningSessions.follow`), so that each tab module knows nothing of the
others. `RunningSessions` stops a run whose visitor closed the tab; `forget_replaced_components`
tidies the visitor's Gradio session after each streaming event.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import gradio as gr

from ..models.loading import ModelPair, Preset
from .limits import Limits

log = logging.getLogger(__name__)

# Every event that decodes joins this one queue, so runs from different visitors (and from
# different tabs) take turns on the device instead of sharing it.
GPU_QUEUE = "gpu"


def _relay(request: gr.Request | None, updates: Iterator) -> Iterator:
    return updates


@dataclass(frozen=True)
class TabContext:
    """What the page hands each tab.

    load(target, draft) returns a cached pair; gpu decorates the GPU work (ZeroGPU);
    export() gives a fresh folder for a run's files; queue_id is the concurrency group every
    decoding event shares; follow(request, updates) relays a run's updates, stopping it when
    the visitor's tab closes and tidying the visitor's session after it; ready, when given, is
    set once the default pair has been loaded and warmed at startup.
    """

    presets: Mapping[str, Preset]
    default_preset: str
    load: Callable[[str, str | None], ModelPair]
    limits: Limits
    gpu: Callable[[Callable], Callable]
    export: Callable[[], Path]
    queue_id: str = GPU_QUEUE
    follow: Callable[[gr.Request | None, Iterator], Iterator] = _relay
    ready: threading.Event | None = None  # set once the default pair is loaded and warm (None: loaded on demand)


def session_id(request: gr.Request | None) -> str | None:
    return request.session_hash if request is not None else None


class RunningSessions:
    """The visitors with a run in progress, and which of them have closed their tab since.
    Every streaming event of the page runs through `follow`."""

    def __init__(self, tidy: Callable[[gr.Request | None], None] = lambda request: None):
        self._tidy = tidy
        self._lock = threading.Lock()
        self._runs: dict[str | None, int] = {}
        self._closed: set[str | None] = set()

    def follow(self, request: gr.Request | None, updates: Iterator) -> Iterator:
        """Relay a run's updates until they end or its visitor's tab closes; then close the run
        (which stops its decoding) and tidy the visitor's session, also after Stop."""
        session = session_id(request)
        self.started(session)
        try:
            with contextlib.closing(updates):
                for update in updates:
                    if not self.wanted(session):
                        return
                    yield update
        finally:
            self.finished(session)
            self._tidy(request)

    def started(self, session: str | None) -> None:
        with self._lock:
            self._runs[session] = self._runs.get(session, 0) + 1

    def closed(self, session: str | None) -> None:
        with self._lock:
            if session in self._runs:  # only sessions with a run are remembered, so none piles up
                self._closed.add(session)

    def wanted(self, session: str | None) -> bool:
        return session not in self._closed

    def finished(self, session: str | None) -> None:
        with self._lock:
            left = self._runs.get(session, 1) - 1
            if left > 0:
                self._runs[session] = left
            else:
                self._runs.pop(session, None)
                self._closed.discard(session)

    def watch(self, demo: gr.Blocks) -> None:
        """Notice closed tabs: a tab closed before its run's stream opened leaves nothing for
        `follow` to notice, but the session's own heartbeat does, and fires `unload`."""

        def tab_closed(request: gr.Request):
            self.closed(session_id(request))

        demo.unload(tab_closed)


def forget_replaced_components(demo: gr.Blocks, request: gr.Request | None) -> None:
    """Drop what Gradio left behind in this visitor's session during the last event.

    When an output is skipped and later given a value in the same stream, Gradio files a
    fresh copy of the component under a new id in the session, one per round trip; over a
    long session those copies would grow memory without bound. The page never refers to
    them (it knows only the ids it was built with), so they can go once the event is over.
    """
    session = getattr(request, "session_hash", None)
    state = getattr(getattr(demo, "state_holder", None), "session_data", {}).get(session) if session else None
    if state is None:
        return
    try:
        blocks = state.blocks_config.blocks
        for key in [key for key in blocks if key not in demo.blocks]:
            del blocks[key]
            state.config_values.pop(key, None)
    except AttributeError:  # a Gradio whose session state looks different: nothing to tidy
        log.debug("session state not tidied", exc_info=True)


def wire_stop(stop_btn: gr.Button, status: Any, event: Any) -> None:
    """Stop cancels the tab's running event and says so in its status line."""
    stop_btn.click(lambda: "⏹ Stopped.", outputs=[status], cancels=[event], queue=False, api_visibility="private")
