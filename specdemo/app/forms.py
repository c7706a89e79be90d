"""Page controls and API endpoint signatures made from the parameter schema.

`param_control(spec, value)` is the one place that turns a `Param` into a Gradio input
(slider, number, radio or checkbox, with the schema's label and help), and
`endpoint(handler, before, after)` gives an event function the parameter names the API
shows: the page's own inputs before and after the schema's parameters, in the schema's
order. A parameter added to `engine.params.SCHEMA` thus appears on the page, in /run and
/compare, on the command line and in validation without another line written.

`api_docstring` writes the docstring Gradio reads an endpoint's description from, one line a
parameter taken from the schema's help texts, and `describe_inputs` shows those lines beside
the parameters in gradio_client's `view_api()`.
"""

from __future__ import annotations

import inspect
import re
from typing import Any, Callable, Iterable, Mapping, Sequence

import gradio as gr
import gradio.utils

from ..engine.params import ENGINE_PARAMS, PARAMS, SCHEMA, Param

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


# Gradio fills these in itself: they are no parameters of an endpoint.
GRADIO_ARGUMENTS = ("request", "progress")


def api_docstring(summary: str, names: Sequence[str], helps: Mapping[str, str] | None = None) -> str:
    """The docstring Gradio reads for an endpoint: `summary` (view_api's description of it), then a
    "Parameters:" section with one `name: meaning` line a parameter, in `names`' order. The meaning is
    helps[name], else the schema's help text (the engine options' included); a name with neither
    raises KeyError, so no endpoint parameter goes without a description."""
    helps = helps or {}
    lines = [" ".join(summary.split()), "", "Parameters:"]
    for name in names:
        if name in helps:
            text = helps[name]
        elif name in PARAMS or name in ENGINE_PARAMS:
            text = schema_help(PARAMS.get(name) or ENGINE_PARAMS[name])
        else:
            raise KeyError(f"the endpoint parameter {name!r} has no description")
        lines.append(f"    {name}: {' '.join(text.split())}")
    return "\n".join(lines)


def schema_help(spec: Param) -> str:
    """A schema parameter's help text, led by the methods its page label names ("EGAG: …")."""
    methods = spec.label.split(":")[0] if ":" in spec.label else ""
    named = re.match(r"[A-Z][\w+\-. /]{0,23}: ", spec.help)  # the help text names its methods itself ("REST: …")
    return f"{methods}: {spec.help}" if methods and not named else spec.help


def summary_of(docstring: str | None) -> str:
    """A docstring's first paragraph (what an endpoint does), on one line."""
    return " ".join(re.split(r"\n\s*\n", (docstring or "").strip())[0].split())


def describe_inputs(fn: Callable, components: Sequence[Any]) -> None:
    """Show each parameter's line of fn's docstring (`api_docstring`) beside that parameter in
    view_api(): gradio_client prints an input's `additional_description` there. components are
    the event's inputs, in fn's parameter order. A component shared by several endpoints keeps
    the last description given to it."""
    _, texts, _ = gradio.utils.get_function_description(fn)
    names = [n for n in inspect.signature(fn).parameters if n not in GRADIO_ARGUMENTS]
    if len(names) != len(components):
        raise ValueError(f"{len(components)} inputs for the {len(names)} parameters of {fn.__name__}")
    for name, component in zip(names, components):
        if not texts.get(name):
            raise KeyError(f"{fn.__name__}'s docstring does not describe {name!r}")
        _describe(component, texts[name])


def _describe(component: Any, text: str) -> None:
    as_input = type(component).api_info_as_input

    def api_info_as_input() -> dict[str, Any]:
        return {**as_input(component), "additional_description": text}

    component.api_info_as_input = api_info_as_input


def endpoint(handler: Callable[[dict[str, Any], gr.Request | None], Any], before: Sequence[str] = (),
             after: Sequence[str] = (), params: Sequence[str] = tuple(PARAMS), name: str | None = None,
             generator: bool = False, progress: bool = False, helps: Mapping[str, str] | None = None) -> Callable:
    """An event function whose parameters are `before`, the schema's `params`, then `after`
    (the names the API and gradio_client show), followed by Gradio's request. It calls
    handler(form, request) with form = {name: value}; with generator=True it streams
    what the handler yields (Gradio streams only from generator functions). progress=True
    adds Gradio's progress tracker: handler(form, request, progress). Its docstring is
    `api_docstring` of the handler's first paragraph: `helps` describes the names outside
    the schema."""
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
    fn.__doc__ = api_docstring(summary_of(handler.__doc__), names, helps)
    return fn


def inputs(controls: Mapping[str, Any], before: Sequence[Any] = (), after: Sequence[Any] = (),
           params: Sequence[str] = tuple(PARAMS)) -> list[Any]:
    """The event's input components in `endpoint`'s order."""
    return [*before, *(controls[n] for n in params), *after]
