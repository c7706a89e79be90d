"""What keeps the served page quiet while the decoders it times run on the same machine.

Two costs of Gradio itself, measured on a 2-core machine with the page open in Chromium
(docs/benchmark.md, "The page against the engine"):

- The queue looks for new events every millisecond while it is free, and for progress every ten: a
  thousand wake-ups a second of the server's event loop, each taking the GIL from the thread that
  decodes (0.08 of a core with nothing to do). `slow_queue_polling` spaces the looks.
- Every status tracker redraws its elapsed-time counter on each animation frame while its output is
  pending, shown or not, and one of them never stops, even on an empty page: a tenth of a core of the
  visitor's browser. The counter shows tenths of a second, so `FRAME_THROTTLE` gives the trackers'
  frames a tenth of a second between them while a tracker shows, and holds them while none does
  (the Playground shows none, even during a run: its status line says how far the run is), to
  release them when one shows. Ten frames a second of a hidden counter still cost Chromium 0.04 of a
  core on an idle page; a hidden counter drawn once a second instead woke one of Gradio's animation
  loops, which then drew 15–30 frames a second. Every other animation keeps its own frames. The
  script must run before Gradio's modules take their reference to `requestAnimationFrame`, and
  Gradio inserts a launch's `head` only after them, so `EarlyHeadScript` writes it into the served
  HTML itself.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

QUEUE_POLL_S = 0.02  # between the queue's looks for work: at most this much latency on an event

SHOWN_TRACKER = ".wrap.full:not(.hide), .wrap.minimal:not(.hide)"  # a status tracker's box, when it shows

FRAME_THROTTLE = """<script>
(() => {
  const nextFrame = window.requestAnimationFrame.bind(window);
  const trackerShows = () => document.querySelector("%s") !== null;
  let held = [];
  window.setInterval(() => {
    if (held.length && trackerShows()) held.splice(0).forEach((callback) => nextFrame(callback));
  }, 250);
  window.requestAnimationFrame = (callback) => {
    if (!(new Error().stack || "").includes("statustracker")) return nextFrame(callback);
    if (!trackerShows()) { held.push(callback); return 0; }
    return window.setTimeout(() => nextFrame(callback), 100);
  };
})();
</script>""" % SHOWN_TRACKER

FILE_ROUTES = "/gradio_api/"
Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def slow_queue_polling(demo: Any, interval_s: float = QUEUE_POLL_S) -> None:
    """Space the Gradio queue's looks for new events and progress by at least `interval_s`.
    (Gradio keeps both intervals as attributes of its queue; a version without them is left alone.)"""
    queue = getattr(demo, "_queue", None)
    for name in ("sleep_when_free", "progress_update_sleep_when_free"):
        if isinstance(getattr(queue, name, None), (int, float)):
            setattr(queue, name, max(getattr(queue, name), interval_s))


class EarlyHeadScript:
    """ASGI middleware that puts `script` first in the <head> of every HTML page the app serves, so
    that it runs before any of the page's own scripts."""

    def __init__(self, app: Callable, script: str = FRAME_THROTTLE) -> None:
        self.app = app
        self.script = script.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Files (a downloaded HTML report, say) come through Gradio's API routes and stay as written.
        if scope["type"] != "http" or scope.get("method") != "GET" or FILE_ROUTES in scope.get("path", ""):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body: list[bytes] = []

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if _is_html(message):
                    start = message  # sent once the whole body is here, with its new length
                    return
                await send(message)
            elif start is not None and message["type"] == "http.response.body":
                body.append(message.get("body", b""))
                if not message.get("more_body", False):
                    html = with_script(b"".join(body), self.script)
                    await send({**start, "headers": _with_length(start["headers"], len(html))})
                    await send({"type": "http.response.body", "body": html})
            else:
                await send(message)

        await self.app(scope, receive, rewrite)


def with_script(html: bytes, script: bytes) -> bytes:
    """`html` with `script` right after its opening <head> tag (unchanged when it has none)."""
    start = html.find(b"<head")
    end = html.find(b">", start) if start >= 0 else -1
    return html if end < 0 else html[: end + 1] + script + html[end + 1 :]


def _is_html(start: Message) -> bool:
    headers = dict(start.get("headers", []))
    return (headers.get(b"content-type", b"").startswith(b"text/html")
            and b"content-encoding" not in headers and b"content-disposition" not in headers)


def _with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() != b"content-length"] + [(b"content-length", str(length).encode())]
