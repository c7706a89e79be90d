"""A tab's run as the page streams it: progress into the status line alone, then everything the run
found drawn once by the event chained after it.

Gradio answers every streamed update by rebuilding each output that update leaves alone
(`gr.skip()` is a property update with no properties): a new component, its configuration and
its API schema, on the server's event loop. A progress line sent through an event with a tab's
every chart, table and file among its outputs therefore cost the server tens of milliseconds of
Python beside the decoders being timed, once per line. So each tab's button streams into its
status line alone; the run's last update is kept for its visitor and drawn by the next event.

The browser has a like cost. Gradio's page keeps a loading status for every component an event
has shown progress on, and at every message of any event it hands each of them its status again,
which makes each component (and each child of a container) deep-copy its value: once a run's
panels and charts were drawn, every progress line of the next run copied them all, and Chromium
collected the copies, on the cores the decoders are timed on. So the drawing event shows its
progress on the status line alone, and the drawn outputs never gain a loading status.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generic, Iterator, Protocol, TypeVar

import gradio as gr
import torch
from gradio.context import Context

from .page import session_id

T = TypeVar("T")


class BySession(Generic[T]):
    """A value per visitor, kept until their tab closes."""

    def __init__(self, default: T | None = None):
        self.default = default
        self._lock = threading.Lock()
        self._values: dict[str | None, T] = {}

    def get(self, session: str | None) -> T | None:
        with self._lock:
            return self._values.get(session, self.default)

    def set(self, session: str | None, value: T) -> None:
        with self._lock:
            self._values[session] = value

    def pop(self, session: str | None) -> T | None:
        with self._lock:
            return self._values.pop(session, self.default)


class StatusThenDraw:
    """A run whose updates are progress lines (`str`) and, at its end, a tuple of every output's
    value (status first), as a tab's page events and its API endpoint take them."""

    def __init__(self, n_outputs: int):
        self.n_outputs = n_outputs
        self.last: BySession[tuple] = BySession()  # a finished run's outputs, until they are drawn

    def status_lines(self, updates: Iterator[str | tuple], session: str | None) -> Iterator[str]:
        """The page's run event: the progress lines alone; the run's outputs are kept for `draw`."""
        for update in updates:
            if isinstance(update, str):
                yield update
            else:
                self.last.set(session, update)

    def draw(self, session: str | None) -> tuple:
        """The event after the run: its outputs, or nothing changed when it did not finish."""
        outputs = self.last.pop(session)
        return outputs if outputs is not None else self.unchanged()

    def every_output(self, updates: Iterator[str | tuple]) -> Iterator[tuple]:
        """The API's endpoint: one event, each progress line with every other output left alone."""
        for update in updates:
            yield (update, *self.unchanged()[1:]) if isinstance(update, str) else update

    def unchanged(self) -> tuple:
        return tuple(gr.skip() for _ in range(self.n_outputs))

    def forget(self, session: str | None) -> None:
        self.last.pop(session)


class KeptRuns(Protocol):
    """What a tab keeps of its visitors' finished runs (`StatusThenDraw`, the Playground's `RunStreams`)."""

    def draw(self, session: str | None) -> Any: ...

    def forget(self, session: str | None) -> None: ...


def wire_status_then_draw(streams: KeptRuns, event: Any, outputs: list[Any]) -> None:
    """Chain the drawing of `outputs` (the status line first) after a run `event` whose only output
    is the status line, and drop what a visitor's unfinished run kept when their tab closes."""
    def draw(request: gr.Request):
        return streams.draw(session_id(request))

    def tab_closed(request: gr.Request) -> None:
        streams.forget(session_id(request))

    # No queue slot of its own to wait for: the run has ended, and drawing decodes nothing.
    event.then(draw, outputs=outputs, api_visibility="private", show_progress="hidden", show_progress_on=outputs[:1],
               concurrency_limit=None)
    Context.root_block.unload(tab_closed)  # the Blocks being built: the page


def in_worker(produce: Callable[[Callable[[Any], None]], None], name: str, threads: int | None = None,
              on_close: Callable[[], None] | None = None) -> Iterator[Any]:
    """What `produce(put)` puts, yielded as it comes, `produce` running in a worker thread on `threads` torch
    threads (None: the count a new thread starts with); its error is raised here. Closing the generator calls
    `on_close` (a Stop) and returns only once the worker has finished, so the caller holds the pair until
    nothing decodes on it any more."""
    updates: queue.Queue = queue.Queue()
    end = object()

    def work() -> None:
        if threads is not None:  # torch's count is the setting of the thread that decodes
            torch.set_num_threads(threads)
        try:
            produce(updates.put)
            updates.put(end)
        except BaseException as error:  # handed to the consuming thread, which raises it
            updates.put(error)

    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    try:
        while True:
            item = updates.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        if on_close is not None:
            on_close()
        worker.join()

