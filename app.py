"""Start the speculative-decoding playground: `python app.py [--host H] [--port P] [--share] [--public]`."""

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
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from specdemo.app.ui import build_demo, launch  # after parsing, so --help is instant
    from specdemo.models.choice import default_preset

    demo = build_demo(public=args.public, default_preset=default_preset())
    launch(demo, server_name=args.host, server_port=args.port, share=args.share)


if __name__ == "__main__":
    main()
