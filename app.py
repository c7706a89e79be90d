"""Start the speculative-decoding playground:
`python app.py [--host H] [--port P] [--share] [--public] [--threads N] [--compile auto|on|off]
[--runtime auto|torch|onnx]`."""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="The specdemo Gradio playground (AR, SD, NASD, EGAG side by side).")
    parser.add_argument("--host", default=None,
                        help="address to serve on (default: Gradio's, 127.0.0.1; 0.0.0.0 serves the network)")
    parser.add_argument("--port", type=int, default=None, help="port (default: Gradio's, 7860 or the next free one)")
    parser.add_argument("--share", action="store_true", help="also open a temporary public gradio.live link")
    parser.add_argument("--public", action="store_true", help="public mode, as on a Hugging Face Space: only the presets in SPECDEMO_ALLOWED_PRESETS "
                             "(default: embedded), no typed model ids or paths, capped prompt and output lengths")
    parser.add_argument("--threads", default=None,
                        help="torch CPU threads for decoding: a count, or auto (one for AR, every core for the "
                             "drafting methods); default: SPECDEMO_THREADS, else the measured choice for a machine "
                             "of 2 cores or fewer, else torch's")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default=None,
                        help="the page's default for compiling the decode steps: auto = static cache + compile "
                             "where CUDA serves a decoder-only pair (not on ZeroGPU), compiled at start before the "
                             "first Run; on = on any device; off = never by default (visitors may still tick it); "
                             "default: SPECDEMO_COMPILE, else auto")
    parser.add_argument("--runtime", choices=("auto", "torch", "onnx"), default=None,
                        help="the page's default target runtime, loaded and warmed at start (onnx: ONNX Runtime on "
                             "the CPU, where onnxruntime-genai is installed; auto: onnx where it runs the target, "
                             "torch otherwise); default: SPECDEMO_RUNTIME, else auto")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from specdemo.app.engine_controls import compile_setting
    from specdemo.app.ui import build_demo, launch, page_runtimes, serving_threads  # after parsing: --help is instant
    from specdemo.models.choice import default_preset
    from specdemo.models.tokens import default_device

    try:
        threads, compiling = serving_threads(args.threads), compile_setting(args.compile)
        runtime = page_runtimes(default_device(), args.runtime)[0]
    except ValueError as error:
        build_parser().error(str(error))
    on, resolved = runtime, runtime
    if runtime == "auto":  # what auto gives the default pair's target here, before it loads
        from specdemo.engine.runtimes.onnx_export import resolve_runtime

        resolved = resolve_runtime('auto', str(default_device()), 'float32').runtime
        on = f"auto ({resolved} here)"
    # The plan for the target's runtime, in the words the page's status line uses after a Run.
    print(f"decoding with {threads.for_runtime(resolved).describe()}, compile {compiling}, the target on {on}; "
          "loading and warming the default pair (a line starting with ready: says when it is done) …", flush=True)
    demo = build_demo(public=args.public, default_preset=default_preset(), preload=True, threads=threads,
                      compile=compiling, runtime=runtime)
    launch(demo, server_name=args.host, server_port=args.port, share=args.share)


if __name__ == "__main__":
    main()
