"""The served page keeps Gradio's own costs off the decoders it times: the queue looks for work every
20 ms, not every millisecond, and the browser's status timers draw ten frames a second, not sixty."""

from __future__ import annotations

import gradio as gr
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from specdemo.app import quiet

SCRIPT = "<script>early()</script>"


def test_the_queue_looks_for_events_and_progress_no_more_often_than_the_interval():
    with gr.Blocks() as demo:
        gr.Markdown("x")
    demo.queue()
    quiet.slow_queue_polling(demo, interval_s=0.02)
    assert demo._queue.sleep_when_free == pytest.approx(0.02)
    assert demo._queue.progress_update_sleep_when_free == pytest.approx(0.02)


def test_a_queue_already_slower_than_the_interval_keeps_its_own():
    with gr.Blocks() as demo:
        pass
    demo.queue()
    demo._queue.sleep_when_free = 0.05
    quiet.slow_queue_polling(demo, interval_s=0.02)
    assert demo._queue.sleep_when_free == pytest.approx(0.05)


def test_a_blocks_without_a_queue_is_left_alone():
    class Bare:
        pass

    quiet.slow_queue_polling(Bare())  # no error, nothing to set


def test_the_script_goes_first_in_the_head_before_every_other_script():
    html = b'<html><head lang="en"><script type="module" src="index.js"></script></head><body></body></html>'
    out = quiet.with_script(html, SCRIPT.encode())
    assert out.index(SCRIPT.encode()) == out.index(b">", out.index(b"<head")) + 1
    assert out.index(SCRIPT.encode()) < out.index(b"index.js")


def test_html_without_a_head_is_unchanged():
    assert quiet.with_script(b"<p>hi</p>", SCRIPT.encode()) == b"<p>hi</p>"


def served(*routes: Route) -> TestClient:
    app = Starlette(routes=list(routes), middleware=[Middleware(quiet.EarlyHeadScript, script=SCRIPT)])
    return TestClient(app)


def test_the_middleware_rewrites_html_pages_with_their_new_length():
    client = served(Route("/", lambda request: HTMLResponse("<html><head><title>t</title></head></html>")))
    response = client.get("/")
    assert response.text == f"<html><head>{SCRIPT}<title>t</title></head></html>"
    assert int(response.headers["content-length"]) == len(response.content)


def test_the_middleware_passes_everything_else_through_untouched():
    client = served(Route("/api", lambda request: JSONResponse({"head": "<head>"}), methods=["GET", "POST"]))
    assert client.get("/api").json() == {"head": "<head>"}
    assert client.post("/api").json() == {"head": "<head>"}


def test_files_the_app_serves_stay_as_written():
    page = "<html><head></head></html>"
    client = served(
        Route("/gradio_api/file=report.html", lambda request: HTMLResponse(page)),
        Route("/download", lambda request: HTMLResponse(page, headers={"content-disposition": "attachment"})),
    )
    assert client.get("/gradio_api/file=report.html").text == page
    assert client.get("/download").text == page
