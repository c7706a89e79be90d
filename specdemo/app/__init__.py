"""The page: the Gradio layout (``ui``), its handlers as plain functions that take a request
and yield data (``handlers``, ``benchtab``), the visualisations (``viz``), public-mode limits
(``limits``) and the example prompts (``examples``).

May import every lower layer: ``engine``, ``models`` and ``bench``; gradio, pandas, plotly.
Nothing imports it but ``app.py``.
"""
