"""The page: ``ui.build_demo`` composes three tabs, each laid out and wired in its own module
beside its handlers (``playgroundtab`` with ``handlers``, ``benchtab``, ``sweeptab``); what
the tabs share is in ``page`` (their context, visitors' runs). Handlers are plain functions
that take a request and yield data; ``forms`` and ``engine_controls`` make controls from the
parameter schema; ``viz`` draws, ``limits`` holds public-mode limits and ``examples`` the
example prompts.

May import every lower layer: ``engine``, ``models`` and ``bench``; gradio, pandas, plotly.
Nothing imports it but ``app.py``.
"""
