"""The page's engine controls (KV cache, compile), generated from `ENGINE_SCHEMA`, and the
page's defaults for them (`page_engine_defaults`: static + compile where CUDA serves a
decoder-only pair, unless `compile_setting` says off).

The Playground tab (`playgroundtab`) places them in its "Advanced settings" accordion; the
handlers parse their values through `engine_options` and show `first_round_status` between Run
and the first round. Gradio is imported only where the controls are made, so the handlers
never load it.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

import torch

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


# ---------------------------------------------------------------------------------------
# The page's defaults: compiled and static where a GPU serves a decoder-only pair

COMPILE_ENV = "SPECDEMO_COMPILE"
COMPILE_SETTINGS = ("auto", "on", "off")
COMPILED = EngineOptions(cache="static", compile=True)


def compile_setting(requested: str | None = None) -> str:
    """How the page compiles by default: `requested` (app.py --compile), else SPECDEMO_COMPILE,
    else auto. auto compiles on CUDA, off ZeroGPU; on compiles on any device; off never does.
    ValueError naming the flag and the variable for anything else."""
    value = requested if requested is not None else os.environ.get(COMPILE_ENV) or "auto"
    setting = {"1": "on", "true": "on", "0": "off", "false": "off"}.get(str(value).strip().lower(),
                                                                       str(value).strip().lower())
    if setting not in COMPILE_SETTINGS:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_SETTINGS)} (--compile or {COMPILE_ENV}), "
                         f"got {value!r}")
    return setting


def page_engine_defaults(device: torch.device | str, encoder_decoder: bool, setting: str = "auto",
                         zero_gpu: bool = False) -> EngineOptions:
    """The engine options a pair's Run starts from on the page.

    Static + compile where CUDA serves a decoder-only pair: eager steps there ran at a fifth of the
    compiled speed (docs/gpu.md), and the page should show what the decoders can do. Elsewhere the
    schema's defaults: a CPU pays minutes of inductor per graph, graph capture runs decoder-only
    models only, and on ZeroGPU the GPU comes with each call in a forked process, so what one call
    compiles is gone by the next (`setting` "on" compiles there anyway, in each call's warm-up)."""
    if encoder_decoder or setting == "off":
        return EngineOptions()
    if setting == "on" or (torch.device(device).type == "cuda" and not zero_gpu):
        return COMPILED
    return EngineOptions()


def warming_status(pair_name: str, options: EngineOptions, fast_target: bool = False) -> str:
    """The page's status line while a pair loads and warms up before the first timed Run (fast_target: its
    target goes on ONNX Runtime, exported on the first start)."""
    doing = (f"compiling the decode steps for **{pair_name}** (first time only)" if options.compile
             else f"loading **{pair_name}** and warming it up")
    if fast_target:
        doing = (f"preparing the fast target, first time only (**{pair_name}**'s target exported for ONNX Runtime, "
                 "about 30 s; the export is never counted in tokens/s), then warming it up")
    return f"⏳ {doing}, so that the first Run is timed like the next ones; a Run pressed now waits for it …"
