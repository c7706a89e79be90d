"""Page controls and API endpoint signatures made from the parameter schema.

`param_control(spec, value)` is the one place that turns a `Param` into a Gradio input
(slider, number, radio or checkbox, with the schema's label and help), and
`endpoint(handler, before, after)` gives an event function the parameter names the API
shows: the page's own inputs before and after the schema's parameters, in the schema's
order. A parameter added to `engine.params.SCHEMA` thus appears on the page, in /run and
/compare, on the command line and in validation without another line written.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Mapping, Sequence

import gradio as gr

from ..engine.params import PARAMS, SCHEMA, Param

# The page shows max_new_tokens beside the Run button; the rest go in "Advanced settings".
MAIN_PARAMS = ("max_new_tokens",)
ADVANCED_PARAMS = tuple(p.name for p in SCHEMA if p.name not in MAIN_PARAMS)
ROW_WIDTH = 4  # advanced controls per row


def param_control(spec: Param, value: Any, *, label: str | None = None, maximum: float | None = None,
                  **options: Any) -> gr.components.Component:
    """The input for one schema parameter. maximum lowers a slider's top (a deployment cap)."""
    label = label or spec.label
    info = options.pop("info", spec.help)
    if spec.kind is bool:
        return gr.Checkbox(value=bool(value), label=label, info=info, **options)
    if spec.choices is not None:
        return gr.Radio(list(spec.choices), value=value, label=label, info=info, **options)
    if spec.kind is str:
        return gr.Textbox(value=value, label=label, info=info, **options)
    if spec.slider is not None:
        low, high, step = spec.slider
        if maximum is not None:
            high = min(high, maximum)
        return gr.Slider(low, high, value=value, step=step, label=label, info=info, **options)
    return gr.Number(value=value, precision=0 if spec.kind is int else None, label=label, info=info, **options)


def param_controls(names: Iterable[str], initial: Mapping[str, Any], row_width: int | None = None,
                   maxima: Mapping[str, float] | None = None) -> dict[str, gr.components.Component]:
    """Controls for the named parameters (initial values by name, else the schema's
    default), laid out in rows of row_width inside the current Blocks context when given."""
    names = list(names)
    maxima = maxima or {}
    controls: dict[str, gr.components.Component] = {}

    def make(name: str) -> None:
        spec = PARAMS[name]
        controls[name] = param_control(spec, initial.get(name, spec.default), maximum=maxima.get(name))

    if row_width is None:
        for name in names:
            make(name)
        return controls
    for start in range(0, len(names), row_width):
        with gr.Row():
            for name in names[start:start + row_width]:
                make(name)
    return controls


def endpoint(handler: Callable[[dict[str, Any], gr.Request | None], Any], before: Sequence[str] = (),
             after: Sequence[str] = (), params: Sequence[str] = tuple(PARAMS), name: str | None = None,
             generator: bool = False, progress: bool = False) -> Callable:
    """An event function whose parameters are `before`, the schema's `params`, then `after`
    (the names the API and gradio_client show), followed by Gradio's request. It calls
    handler(form, request) with form = {name: value}; with generator=True it streams
    what the handler yields (Gradio streams only from generator functions). progress=True
    adds Gradio's progress tracker: handler(form, request, progress)."""
    names = [*before, *params, *after]
    extra = [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=gr.Request)]
    if progress:
        extra.append(inspect.Parameter("progress", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=gr.Progress()))
    signature = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names] + extra)

    def call(args, kwargs) -> Any:
        values = dict(signature.bind_partial(*args, **kwargs).arguments)
        form = {n: values.get(n) for n in names}
        if progress:
            return handler(form, values.get("request"), values.get("progress") or gr.Progress())
        return handler(form, values.get("request"))

    if generator:
        def fn(*args, **kwargs):
            yield from call(args, kwargs)
    else:
        def fn(*args, **kwargs):
            return call(args, kwargs)

    fn.__signature__ = signature  # type: ignore[attr-defined]
    fn.__annotations__ = {"request": gr.Request}
    fn.__name__ = fn.__qualname__ = name or getattr(handler, "__name__", "endpoint")
    fn.__doc__ = handler.__doc__
    return fn


def inputs(controls: Mapping[str, Any], before: Sequence[Any] = (), after: Sequence[Any] = (),
           params: Sequence[str] = tuple(PARAMS)) -> list[Any]:
    """The event's input components in `endpoint`'s order."""
    return [*before, *(controls[n] for n in params), *after]
