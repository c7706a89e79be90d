"""The page's engine controls (KV cache, compile), generated from `ENGINE_SCHEMA`.

The Playground tab (`playgroundtab`) places them in its "Advanced settings" accordion; the
handlers parse their values through `engine_options` and show `first_round_status` between Run
and the first round. Gradio is imported only where the controls are made, so the handlers
never load it.
"""

from __future__ import annotations

from typing import Any, Mapping

from ..engine.params import ENGINE_SCHEMA, EngineOptions

ENGINE_NAMES = tuple(spec.name for spec in ENGINE_SCHEMA)  # the page's engine inputs, in the schema's order


def engine_controls(initial: EngineOptions | None = None) -> dict[str, Any]:
    """One control per engine option, created in the current Blocks context: a dropdown for a
    choice (cache), a checkbox for a flag (compile). Returned by name, in `ENGINE_NAMES` order."""
    import gradio as gr  # here, so the handlers can parse the options without loading Gradio

    initial = initial or EngineOptions()
    controls: dict[str, gr.components.Component] = {}
    for spec in ENGINE_SCHEMA:
        value = getattr(initial, spec.name)
        common = dict(label=spec.label, info=spec.help, elem_id=f"sd-{spec.name}")
        if spec.choices is not None:
            controls[spec.name] = gr.Dropdown(list(spec.choices), value=value, **common)
        elif spec.kind is bool:
            controls[spec.name] = gr.Checkbox(value=value, **common)
        else:  # no such option yet; a new kind needs a control here
            raise TypeError(f"no page control for engine option {spec.name!r} of kind {spec.kind.__name__}")
    return controls


def engine_options(values: Mapping[str, Any]) -> EngineOptions:
    """The validated options from the controls' values (ValueError naming the option)."""
    return EngineOptions.from_values(**{name: values.get(name) for name in ENGINE_NAMES})


def first_round_status(options: EngineOptions) -> str | None:
    """The status line before the first round arrives: compiling takes a while the first time."""
    note = options.first_round_note
    return f"{note} the first run of a model compiles its decode steps (not counted in tokens/s)" if note else None
