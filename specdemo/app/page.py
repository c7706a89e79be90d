"""What the page's tabs share: the pair cache (loaded and warmed once, compiled where the page
compiles by default), the decoding thread, export folders, the ZeroGPU decorator, the context
each tab is built with, and the bookkeeping of visitors' runs. Gradio is never imported here (the tabs import it), so the handlers can share these too.

`TabContext` is everything a tab's `build_tab` needs from the page (the served presets, a
cached pair loader, the deployment's limits, the GPU decorator, the export folder, the
device queue and `RunningSessions.follow`), so that each tab module knows nothing of the
others. `RunningSessions` stops a run whose visitor closed the tab; `forget_replaced_components`
tidies the visitor's Gradio session after each streaming event.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

from ..engine.decoding import generate
from ..bench.measure.threads import ThreadPlan
from ..engine.methods import DEFAULT_METHODS
from ..engine.params import EngineOptions
from ..engine.runtimes import refusal
from ..models.loading import ModelPair, Preset, load_pair
from ..models.precision import PRECISIONS
from .limits import Limits

if TYPE_CHECKING:  # the page's shared parts never load Gradio themselves; the tabs do
    import gradio as gr

log = logging.getLogger(__name__)

# Every event that decodes joins this one queue, so runs from different visitors (and from
# different tabs) take turns on the device instead of sharing it.
GPU_QUEUE = "gpu"
PairLoader = Callable[..., ModelPair]
EXPORT_ROOT = Path(tempfile.gettempdir()) / "specdemo-exports"
EXPORT_TTL_S = 3600
AUTO = "auto"  # a model's precision left to `dtype`, else to the loader's default for the device
# The page's engine options for a pair, given whether it is an encoder-decoder (engine_controls.page_engine_defaults).
EngineDefaults = Callable[[bool], EngineOptions]


# The browser side of Gradio looks every label and choice up among its own messages first, and a few plain
# words name whole groups of them there ("code", "status"): such a word on the page makes the console warn
# (`[svelte-i18n] Message with id "code" must be of type "string"`). A label or choice the page shows is
# never one of them; a value keeps its name, only what is shown differs.
GRADIO_MESSAGE_GROUPS = frozenset({
    "annotated_image", "audio", "blocks", "chat_interface", "chatbot", "checkbox", "code", "color_picker", "common",
    "dataframe", "dropdown", "errors", "file", "highlighted_text", "image", "image_editor", "label", "login",
    "number", "plot", "radio", "slider", "status", "upload_text", "video",
})


SHOWN_AS = {"code": "code (programming)"}  # the suite's one category that is such a word


def shown_choices(names) -> list[tuple[str, str]]:
    """(label, value) choices for `names` (the suite's categories): each shown by its name, but a name that is
    one of Gradio's message groups shown as `SHOWN_AS` says ("code (programming)")."""
    return [(SHOWN_AS.get(name, f"{name} (name)") if name in GRADIO_MESSAGE_GROUPS else name, name) for name in names]


def no_engine_defaults(encoder_decoder: bool) -> EngineOptions:
    """The schema's engine options for every pair (a page that never compiles by default)."""
    return EngineOptions()


# ---------------------------------------------------------------------------------------
# Model pairs: loaded once, kept in a small LRU cache


class PairCache:
    """Pairs keyed by (target, draft, device, dtype, target_dtype, draft_dtype, the runtime they run on); beyond
    `limit`, the least recently
    used pair is closed so a new one can take its memory. With `warm_up` (a cache that serves
    visitors) each new pair is warmed, and what is alive then is frozen out of the collector's way
    (`_freeze_what_stays`) until a pair is closed."""

    def __init__(self, loader: PairLoader = load_pair, limit: int = 1, warm_up: bool = True,
                 engine_defaults: EngineDefaults = no_engine_defaults):
        if limit < 1:
            raise ValueError("the pair cache must hold at least one pair")
        self.loader = loader
        self.limit = limit
        self.warm_up = warm_up
        self.engine_defaults = engine_defaults  # what a Run on the pair starts from, so the warm-up's too
        self._pairs: OrderedDict[tuple, ModelPair] = OrderedDict()
        self._auto: dict[tuple, str] = {}  # the settings' key without the runtime → the runtime auto gave them
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._pairs)

    def get(self, target: str, draft: str | None, device: str | None = None, dtype: str | None = None,
            target_dtype: str | None = None, draft_dtype: str | None = None, runtime: str | None = None) -> ModelPair:
        """The pair, loaded on first use. Each model's precision ("auto" or None: `dtype`, else the
        loader's default for the device) and the target's runtime (None or "auto": the loader's default, auto)
        are part of the key, so another precision or runtime loads another pair."""
        precisions = {name: value for name, value in (("target_dtype", target_dtype), ("draft_dtype", draft_dtype))
                      if value not in (None, "", AUTO)}
        if runtime not in (None, "", AUTO):
            precisions["runtime"] = runtime
        base = (target, draft, device, dtype, precisions.get("target_dtype"), precisions.get("draft_dtype"))
        with self._lock:
            # A pair is kept under the runtime it runs on: auto, once resolved for these settings, finds the pair
            # an explicit onnx (or torch) loaded, and the other way round.
            key = (*base, precisions.get("runtime") or self._auto.get(base, AUTO))
            if key in self._pairs:
                self._pairs.move_to_end(key)
                return self._pairs[key]
            # Free memory before loading, not after: two large pairs may not fit together.
            while len(self._pairs) >= self.limit:
                _, old = self._pairs.popitem(last=False)
                gc.unfreeze()  # let the collector reach what the closed pair leaves behind
                old.close()
            # Only a precision or a runtime that was chosen reaches the loader, so the default loads as it always has.
            pair = self.loader(target, draft, device=device, dtype=dtype, **precisions)
            resolved = getattr(pair, "runtime", "torch")
            if "runtime" not in precisions:
                self._auto[base] = resolved
            self._pairs[(*base, resolved)] = pair
            if self.warm_up:  # a cache that serves visitors
                _warm_up(pair, self.engine_defaults(bool(getattr(pair, "is_encoder_decoder", False))))
                _freeze_what_stays()
            return pair

    def clear(self) -> None:
        with self._lock:
            while self._pairs:
                self._pairs.popitem()[1].close()


def _freeze_what_stays() -> None:
    """Move everything alive now (the libraries, the page, the loaded pair) out of the collector's
    reach. A full collection in this process otherwise walks half a million objects or more (0.3 s
    and up on a small CPU); frozen, a collection walks only what was made since, which is what
    `quiet_gc` does before each timed decode."""
    gc.collect()
    gc.freeze()


WARM_UP_PROMPT = "Name three colours of the rainbow, then count from one to five."


def _warm_up(pair: ModelPair, engine: EngineOptions | None = None) -> None:
    """Run every default method the pair can run, briefly, so that a page's first Run is timed like
    its second: one-off kernel choices, allocations and the shapes of each method's verification
    are paid here, never in a visitor's numbers. With `engine` compiling, this is also where the
    decode steps compile (on a GPU, minutes for a large pair) and their CUDA graphs are recorded.

    On the decoding thread, where the visitors' rounds run: torch keeps CUDA graph trees and
    OpenMP pools per thread, so what is warmed on another thread is warmed for nobody."""
    engine = engine or EngineOptions()
    for name in DEFAULT_METHODS:
        if refusal(pair, name, compile=engine.compile) is not None:
            continue
        try:
            decoding_thread().submit(generate, pair, WARM_UP_PROMPT, name, max_new_tokens=16, seed=0, chat=False,
                                     **engine.as_kwargs()).result()
        except Exception:  # a failed warm-up only costs timing accuracy
            log.debug("warm-up of %s failed", name, exc_info=True)


_decoder: tuple[int, ThreadPoolExecutor] | None = None
_decoder_lock = threading.Lock()


def decoding_thread() -> ThreadPoolExecutor:
    """The process's one thread for the Playground's rounds (and the warm-up), made on first use,
    and made again in a forked child (ZeroGPU's), which inherits the executor but not its thread."""
    global _decoder
    with _decoder_lock:
        if _decoder is None or _decoder[0] != os.getpid():
            _decoder = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdemo-decode"))
        return _decoder[1]


# ---------------------------------------------------------------------------------------
# ZeroGPU: on a Hugging Face Space with the `spaces` package, GPU work runs under spaces.GPU


def on_zero_gpu() -> bool:
    if not os.environ.get("SPACE_ID"):
        return False
    try:
        import spaces  # noqa: F401
    except ImportError:
        return False
    return True


def gpu(fn: Callable) -> Callable:
    if on_zero_gpu():
        import spaces

        return spaces.GPU(duration=120)(fn)
    return fn


# ---------------------------------------------------------------------------------------
# Exports


def export_dir(root: Path = EXPORT_ROOT, ttl_s: float = EXPORT_TTL_S) -> Path:
    """A fresh folder for one request's files; folders older than ttl_s are removed first.
    (Gradio copies returned files into its own cache, so an old folder is safe to drop.)"""
    root.mkdir(parents=True, exist_ok=True)
    now = time.time()
    for old in root.iterdir():
        try:
            if old.is_dir() and now - old.stat().st_mtime > ttl_s:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # another request removed it first
    return Path(tempfile.mkdtemp(prefix="run-", dir=root))


# ---------------------------------------------------------------------------------------
# The tabs' context and the visitors' runs


def _relay(request: gr.Request | None, updates: Iterator) -> Iterator:
    return updates


@dataclass(frozen=True)
class TabContext:
    """What the page hands each tab.

    load(target, draft, target_dtype, draft_dtype, runtime) returns a cached pair (each precision "auto"
    and the runtime torch when not given); precisions are the ones the page offers besides "auto", runtimes the
    target runtimes it offers; gpu decorates the GPU work (ZeroGPU);
    export() gives a fresh folder for a run's files; queue_id is the concurrency group every
    decoding event shares; follow(request, updates) relays a run's updates, stopping it when
    the visitor's tab closes and tidying the visitor's session after it; ready, when given, is
    set once the default pair has been loaded and warmed at startup, and warming is what the status
    line says until then; engine_defaults gives the engine controls' values for a pair.
    """

    presets: Mapping[str, Preset]
    default_preset: str
    load: Callable[..., ModelPair]
    limits: Limits
    gpu: Callable[[Callable], Callable]
    export: Callable[[], Path]
    queue_id: str = GPU_QUEUE
    follow: Callable[[gr.Request | None, Iterator], Iterator] = _relay
    ready: threading.Event | None = None  # set once the default pair is loaded and warm (None: loaded on demand)
    warming: str = ""  # the status line while it warms (engine_controls.warming_status)
    engine_defaults: EngineDefaults = no_engine_defaults  # the engine controls' values for a pair
    threads: ThreadPlan | None = None  # torch's threads per method (None: as the process has them)
    precisions: tuple[str, ...] = PRECISIONS  # the models' precisions the device serves, besides AUTO
    runtimes: tuple[str, ...] = ("torch",)  # the target runtimes this install and device serve, the page's default first
    auto_runtime: str = "torch"  # what "auto" gives a target here before it is loaded (`onnx_export.resolve_runtime`)


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
        import gradio  # here only: the rest of this module never needs it

        def tab_closed(request):
            self.closed(session_id(request))

        # Gradio passes the visitor's request to a parameter annotated with its class; this module's
        # annotations are strings of a name it does not import, so the class is given directly.
        tab_closed.__annotations__ = {"request": gradio.Request}
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
