"""The CUDA-only code paths, checked where no GPU is: every CUDA call the engine, the clock and
the peers make is bound against the installed torch's and transformers' own signatures, the
roofline knows the GPUs' bandwidths, and the forced-acceptance hooks trace through dynamo.
So a first GPU run can fail only on what only a GPU can show.

May import torch, transformers and the other bench modules.
"""

from __future__ import annotations

import inspect

import torch

from ..measure.roofline import bandwidth_for
from .forced import ForcedAcceptance
from .stages import StageContext

MIN_TRANSFORMERS = "5.24"  # pyproject's floor: the first with `cache=`


# (what, the callable, the arguments our code passes): each is bound, never called.
def _calls():
    from transformers import CompileConfig

    event = torch.cuda.Event
    return [
        ("torch.cuda.Event(enable_timing=True)", event, (), {"enable_timing": True}),
        ("Event.record(stream)", event.record, (None, None), {}),
        ("Event.elapsed_time(other)", event.elapsed_time, (None, None), {}),
        ("Event.query()", event.query, (None,), {}),
        ("Event.synchronize()", event.synchronize, (None,), {}),
        ("torch.cuda.current_stream(device)", torch.cuda.current_stream, (None,), {}),
        ("torch.cuda.synchronize(device)", torch.cuda.synchronize, (None,), {}),
        ("torch.cuda.get_device_name(device)", torch.cuda.get_device_name, (None,), {}),
        ("torch.cuda.graph(graph)", torch.cuda.graph, (None,), {}),
        ("torch.compiler.cudagraph_mark_step_begin()", torch.compiler.cudagraph_mark_step_begin, (), {}),
        ("torch.compile(mode='reduce-overhead', dynamic=False)", torch.compile, (None,),
         {"mode": "reduce-overhead", "dynamic": False}),
        ("CompileConfig(mode='reduce-overhead')", CompileConfig, (), {"mode": "reduce-overhead"}),
    ]


def bind_calls() -> list[str]:
    """Problems binding the CUDA calls (empty when every one binds)."""
    problems = []
    for what, function, args, kwargs in _calls():
        try:
            inspect.signature(function).bind(*args, **kwargs)
        except (TypeError, ValueError) as error:
            problems.append(f"{what}: {error}")
    import transformers
    from packaging.version import Version
    from transformers import CompileConfig

    if Version(transformers.__version__) < Version(MIN_TRANSFORMERS):
        problems.append(f"transformers {transformers.__version__} < {MIN_TRANSFORMERS}: every model call passes "
                        "cache=, which older versions ignore (carry its wheel: docs/gpu.md)")
    if not hasattr(CompileConfig(), "_compile_all_devices"):
        problems.append("CompileConfig has no _compile_all_devices (hf-generate-static sets it off CUDA)")
    return problems


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def forced_hooks_trace() -> bool:
    """The forced pair, each model traced by dynamo (eager backend), answers what was planted: the
    target the planted text, the draft the planted token where the mask agrees and another elsewhere."""
    target, draft = tiny_llama(seed=0), tiny_llama(seed=1)
    forced = ForcedAcceptance(target, draft, rate=0.5, seed=0)
    ids, positions = torch.tensor([[1, 2, 3, 7, 9, 11]]), torch.arange(6).view(1, -1)
    answers = []
    try:
        for model in (target, draft):
            step = torch.compile(lambda i, p, m=model: m(input_ids=i, position_ids=p).logits, backend="eager")
            with torch.inference_mode():
                answers.append(step(ids, positions)[0].argmax(-1).tolist())
    finally:
        forced.remove()
    planted, agrees = forced.text_after(1, 6), forced.agrees_after(1, 6)
    draft_follows_mask = all((d == t) == a for d, t, a in zip(answers[1], planted, agrees))
    return answers[0] == planted and draft_follows_mask and any(agrees) and not all(agrees)


def run_cuda_paths(ctx: StageContext) -> None:
    problems = bind_calls()
    ctx.note(f"- {len(_calls())} CUDA calls bound against torch {torch.__version__}'s signatures: "
             + ("all bind" if not problems else "; ".join(problems)))
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB"):
        ctx.note(f"- roofline bandwidth for {name!r}: {bandwidth_for(name) or 'unknown'}")
    traced = forced_hooks_trace()
    ctx.note(f"- forced-acceptance hooks through dynamo: {'pick the oracle' if traced else 'WRONG tokens'}")
    if problems or not traced:
        raise RuntimeError("CUDA path checks failed: " + "; ".join(problems + ([] if traced else ["forced hooks"])))
