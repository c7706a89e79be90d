"""Loading a target/draft pair from the Hub, a local folder, a GGUF file or a preset.

Two kinds of model run: decoder-only causal LMs (Llama, Qwen, GPT-NeoX, ...) and
encoder-decoder LMs (T5, BART, Marian, ...), whose prompt goes to the encoder. A pair is
one kind or the other, never a mix. Anything else (an encoder-only model such as BERT, a
speech or vision model) is refused by naming its architecture, read from its config.

The embedded pair is loaded by ``specdemo.models.embedded``; shared token helpers are in
``specdemo.models.tokens``.
"""

from __future__ import annotations

import gc
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
)

from ..engine.drafters.feature_head import FeatureHead, is_feature_head
from ..engine.drafters.published import KIND_NAMES, PublishedHead
from ..engine.targets.few_rows import use_few_row_products
from .embedded import DEFAULT_DRAFT, EMBEDDED_HEAD, EMBEDDED_LM, load_embedded_draft, load_embedded_target
from .errors import ModelLoadError
from ..engine.runtimes import AUTO, ONNX, TORCH
from ..engine.runtimes.onnx_export import RuntimeChoice, onnx_target, resolve_runtime
from .published import load_published, local_folder, published_kind
from .precision import (Precision, attention_of, make_verification_row_exact, quantize, resolve_precision, self_draft,
                        self_draft_precision, verification_exactness)
from .tokens import check_token_ids, collect_eos_ids, default_device, encode_chat, resolve_dtype


# Drafts that read the target's states instead of running by themselves: ours, and the published heads.
HEADS = (FeatureHead, PublishedHead)


@dataclass(frozen=True)
class Preset:
    name: str
    target: str
    draft: str | None
    note: str = ""
    encoder_decoder: bool = False  # the prompt goes to an encoder (T5, BART): no chat template

    @property
    def draft_kind(self) -> str | None:
        """What the pair will draft with, known before loading it (as `ModelPair.draft_kind`)."""
        return draft_kind_of(self.draft)


EMBEDDED = "embedded"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(EMBEDDED, EMBEDDED, EMBEDDED, "SmolLM2-135M-Instruct (packaged GGUF) + the packaged draft that is "
               "accepted most often; works offline"),
        Preset(EMBEDDED_LM, EMBEDDED, EMBEDDED_LM, "SmolLM2-135M-Instruct + the draft LM (4 layers, 8 M parameters); "
               "works offline"),
        Preset(EMBEDDED_HEAD, EMBEDDED, EMBEDDED_HEAD, "SmolLM2-135M-Instruct + the feature-level draft head (EAGLE, "
               "one layer on the target's states); works offline"),
        Preset("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        Preset("pythia-1.4b", "EleutherAI/pythia-1.4b", "EleutherAI/pythia-70m"),
        Preset("pythia-2.8b", "EleutherAI/pythia-2.8b", "EleutherAI/pythia-70m"),
        Preset("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        Preset("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
        Preset("llama-3.2-3b", "meta-llama/Llama-3.2-3B-Instruct", "meta-llama/Llama-3.2-1B-Instruct", "gated: accept the licence on the Hub and set HF_TOKEN"),
        Preset("flan-t5-large", "google/flan-t5-large", "google/flan-t5-small",
               "encoder-decoder, instructions and translation ('translate English to German: ...')", True),
        Preset("bart-large-cnn", "facebook/bart-large-cnn", "sshleifer/distilbart-cnn-12-6",
               "encoder-decoder, news summarisation (paste an article)", True),
    ]
}


@dataclass
class ModelPair:
    """A target, its tokenizer and an optional draft that shares the tokenizer."""

    target: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    draft: torch.nn.Module | None = None
    name: str = ""
    target_ref: str = ""
    draft_ref: str | None = None
    vocab_size: int | None = None  # logits are cut to this when the two models pad their vocab differently
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    # Each model's precision as loaded (`specdemo.models.precision`); None where not recorded.
    target_precision: Precision | None = None
    draft_precision: Precision | None = None
    # What runs the target's forwards: torch (the reference) or "onnx" (`engine.onnx_lm.OnnxTarget`,
    # in `target_runtime`; `target` keeps the torch weights, which a feature head and the config read).
    runtime: str = TORCH
    target_runtime: Any = None
    # Beside a runtime target, a draft LM exported for the same runtime (`engine.onnx_lm.OnnxTarget`), which
    # then drafts there; None where the draft runs on torch (a feature head has its own: `engine.onnx_head`).
    draft_runtime: Any = None
    # Which runtime runs the target and why, in one line (`onnx_export.resolve_runtime`): the page's status
    # line and each result's trace (`runtime_reason`) say it.
    runtime_reason: str = ""

    def __post_init__(self) -> None:
        if not self.eos_ids:
            self.eos_ids = frozenset(collect_eos_ids(self.target, self.tokenizer))
        if self.target_runtime is not None and not self.target_runtime.eos_ids:  # where its own search stops
            self.target_runtime.eos_ids = tuple(sorted(self.eos_ids))

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    @property
    def is_encoder_decoder(self) -> bool:
        """The prompt goes to an encoder; the output is the decoder's (T5, BART, ...)."""
        return is_encoder_decoder_model(self.target)

    @property
    def exactness(self) -> str:
        """What greedy speculative decoding promises against AR on this target as loaded
        (`precision.verification_exactness`): "bit-exact", "exact at float32" or "up to near-ties at …"."""
        precision = self.target_precision or resolve_precision(self.target.dtype, self.device)
        return verification_exactness(precision, self.device, attention_of(self.target), self.runtime)

    @property
    def draft_kind(self) -> str | None:
        """"feature-head" (ours: reads the target's states), a published head's kind ("eagle", "eagle3",
        "medusa"), "model" (a draft LM) or None."""
        if self.draft is None:
            return None
        if isinstance(self.draft, PublishedHead):
            return self.draft.kind
        return "feature-head" if isinstance(self.draft, FeatureHead) else "model"

    @property
    def drafter_name(self) -> str | None:
        """What drafts for SD and EGAG, as the page and the benchmark name it."""
        if self.draft is None:
            return None
        if isinstance(self.draft, PublishedHead):
            return f"{self.draft.name} ({self.draft_ref})"
        if isinstance(self.draft, FeatureHead):
            return f"feature head ({self.draft_ref})"
        return f"draft model ({self.draft_ref})"

    @property
    def context_length(self) -> int:
        # A feature head has no context of its own: it reads the target's positions.
        limits = [_context_length(m) for m in (self.target, self.draft) if m is not None and not isinstance(m, HEADS)]
        return min(limits)

    def encode(self, prompt: str | Sequence[int], chat: bool = False) -> list[int]:
        """Token ids of a prompt: a string (through the chat template if chat) or ids as they are."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("prompt is empty: type some text to continue")
            if chat and not self.is_encoder_decoder:  # an encoder reads the request as it is
                ids = encode_chat(self.tokenizer, prompt)
            else:
                ids = self.tokenizer(prompt)["input_ids"]
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise ValueError("prompt must be a string or a sequence of token ids") from None
            ids = check_token_ids(ids, self.vocab_size or self.target.config.vocab_size)
        if not ids:
            raise ValueError("prompt is empty: it encodes to no tokens")
        return list(ids)

    def check_fits(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        limit = self.context_length
        if self.is_encoder_decoder:  # the source and the output each have the whole context
            if len(prompt_ids) > limit or max_new_tokens + 1 > limit:
                raise ValueError(
                    f"prompt is too long: {len(prompt_ids)} prompt tokens or max_new_tokens {max_new_tokens} "
                    f"exceed the model's context of {limit} tokens; shorten the prompt or lower max_new_tokens"
                )
            return
        if len(prompt_ids) + max_new_tokens > limit:
            raise ValueError(
                f"prompt is too long: {len(prompt_ids)} prompt tokens + max_new_tokens {max_new_tokens} "
                f"exceed the model's context of {limit} tokens; shorten the prompt or lower max_new_tokens"
            )

    def close(self) -> None:
        """Drop the weights so a different pair can take their memory."""
        self.target = self.draft = None  # type: ignore[assignment]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def load_pair(
    target: str, draft: str | None = None, device: str | None = None, dtype: str | torch.dtype | None = None,
    trust_remote_code: bool = False, *, target_dtype: str | torch.dtype | None = None,
    draft_dtype: str | torch.dtype | None = None, runtime: str = AUTO,
) -> ModelPair:
    """Load a target and an optional draft (hub id, local folder, .gguf file, a preset name, or
    `self:PRECISION`: the target's own weights at that precision, e.g. `self:int8`).

    `load_pair("embedded")` is the offline default; `load_pair("qwen2.5-1.5b")` any preset.
    `target_dtype` and `draft_dtype` (float32, bfloat16, float16, int8, int4, ...: see
    `specdemo.models.precision`) set each model's precision; `dtype` sets both where they are not given.
    `runtime` runs the target's forwards: "auto" (the default: onnx where it can, else torch, as
    `onnx_export.resolve_runtime` decides and `ModelPair.runtime_reason` says), "torch" (the reference) or
    "onnx" (ONNX Runtime on the CPU at float32, int8 or int4, exported on first use: `engine.runtimes.onnx_export`).
    """
    if not isinstance(target, str) or not target.strip():
        raise ValueError("target must be a model id, a local folder, a .gguf file or a preset name")
    target = target.strip()
    draft = draft.strip() if isinstance(draft, str) and draft.strip() else None
    name = target
    if target in PRESETS and draft is None:
        preset = PRESETS[target]
        target, draft = preset.target, preset.draft
    device = device or str(default_device())
    target_precision, draft_precision = _pair_precisions(device, dtype, target_dtype, draft_dtype, draft)
    torch_dtype = target_precision.float_dtype
    choice = resolve_runtime(runtime, device, target_precision.name)  # the device, the packages, the precision
    if choice.runtime == ONNX:  # the torch copy stays float: a feature head reads its weights
        torch_dtype = torch.float32

    if target == EMBEDDED:
        target_model, tokenizer = load_embedded_target(device=device, dtype=torch_dtype)
    else:
        tokenizer = load_tokenizer(target, trust_remote_code)
        target_model = load_model(target, device, torch_dtype, trust_remote_code)

    draft_model = vocab_size = None
    if draft is not None:
        draft_model = _load_draft(draft, target, target_model, tokenizer, device, draft_precision, trust_remote_code)
        choice = _head_runtime(choice, draft_model, draft, runtime)
        if not isinstance(draft_model, HEADS):  # a head predicts over the target's own vocabulary
            vocab_size = shared_vocab_size(target_model, draft_model, tokenizer, target, draft)
    target_runtime = None  # the target exported for the runtime, where auto or onnx gives it one
    if choice.runtime == ONNX:
        choice, target_runtime = _runtime_target(runtime, target, target_model, tokenizer, device, target_precision)
    draft_runtime = _onnx_draft(draft, draft_model, tokenizer, draft_precision) if target_runtime else None
    # Last, so that a feature head and a self-draft read the target's float weights.
    if target_runtime is None:
        target_model = quantize(target_model, target_precision)
        make_verification_row_exact(target_model, target_precision)
    if torch.device(device).type == "cpu":
        _use_few_row_products(((target_model, target_precision), (draft_model, draft_precision)))
    return ModelPair(target_model, tokenizer, draft_model, name=name, target_ref=target, draft_ref=draft,
                     vocab_size=vocab_size, target_precision=target_precision,
                     draft_precision=draft_precision if draft is not None else None,
                     runtime=choice.runtime, target_runtime=target_runtime, draft_runtime=draft_runtime,
                     runtime_reason=choice.reason)


def _head_runtime(choice: RuntimeChoice, draft_model, draft: str, runtime: str) -> RuntimeChoice:
    """A published head drafts beside a torch target only: auto keeps its target on torch, saying why, and an
    explicit onnx is refused."""
    if choice.runtime != ONNX or not isinstance(draft_model, PublishedHead):
        return choice
    why = f"the {draft_model.name} {draft!r} drafts beside a torch target only"
    if runtime == ONNX:
        raise ValueError(f"runtime onnx: {why}; use runtime=torch")
    return RuntimeChoice(TORCH, f"the target on torch (auto): {why}")


def _use_few_row_products(models) -> None:
    """The CPU's few-row products for each float model of (model, precision) pairs; a quantized
    model's linear layers run their library's kernels, not float products."""
    for model, precision in models:
        if model is not None and not (precision.quantized and not isinstance(model, HEADS)):
            use_few_row_products(model)


def onnx_can_export(target: str) -> bool:
    """Whether runtime onnx can load this target reference before it is loaded: the embedded target, a local
    folder or a Hub id (exported from its downloaded snapshot); a .gguf file cannot be exported as it is."""
    return target == EMBEDDED or Path(target).is_dir() or not target.endswith(".gguf")


def _runtime_target(requested: str, target: str, target_model, tokenizer, device, precision: Precision):
    """(the runtime choice, the target exported for ONNX Runtime or None) once the target's folder is known:
    under auto, a target whose folder the builder cannot export, or whose export fails, stays on torch
    with the reason; asked for onnx, either is a ModelLoadError."""
    source = _export_source(target, target_model, tokenizer)
    choice = resolve_runtime(requested, device, precision.name, source)
    if choice.runtime != ONNX:
        return choice, None
    if isinstance(source, str):
        raise ModelLoadError(f"runtime onnx: {source}; use runtime=torch or auto")
    try:
        return choice, onnx_target(source, precision.name)
    except ModelLoadError as error:
        if requested != AUTO:
            raise
        return RuntimeChoice(TORCH, f"the target on torch (auto): its export for ONNX Runtime failed: {error}"), None


def _export_source(target: str, target_model, tokenizer) -> Path | str:
    """The transformers folder the target is exported from (the embedded target's converted cache, else a
    copy written next to the exports; a local folder; a Hub model's snapshot in the Hub cache), or a
    sentence saying why there is none."""
    from .embedded import cache_is_complete, cache_dir
    from ..engine.runtimes.onnx_export import export_root

    if target == EMBEDDED:
        source = cache_dir()
        if not cache_is_complete(source):  # a read-only cache or a Hub copy: write a folder to export from
            source = export_root() / "sources" / "smollm2-135m-instruct"
            if not (source / "config.json").is_file():
                target_model.save_pretrained(source)
                tokenizer.save_pretrained(source)
        return source
    if Path(target).is_dir():
        return Path(target)
    if target.endswith(".gguf"):
        return f"{target!r} is a .gguf file, and ONNX Runtime's builder exports a transformers folder"
    return hub_snapshot(target)


def hub_snapshot(repo_id: str) -> Path | str:
    """The folder of a Hub model's downloaded snapshot (models--org--name/snapshots/<commit> in the Hub
    cache, the commit refs/main names), where loading it put its config, weights and tokenizer; fetched
    (those files only) if it is not there. A sentence saying why not where it cannot be had."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not in the cache under refs/main: fetch what the builder reads
        pass
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))
    except Exception as error:
        return f"the snapshot of {repo_id!r} cannot be found in the Hub cache or fetched ({type(error).__name__})"


def _onnx_draft(draft: str | None, draft_model, tokenizer, precision: Precision):
    """A float32 draft LM (the embedded one or a local folder) exported for the runtime, to draft beside the
    runtime's target; None where it stays on torch: a feature head, another precision, a Hub draft, or a
    model the runtime cannot run (`check_exportable`)."""
    from .embedded import DRAFT_DIR
    from ..engine.runtimes.onnx_export import export_root

    embedded_lm = draft == EMBEDDED_LM or (draft == EMBEDDED and DEFAULT_DRAFT == EMBEDDED_LM)
    if draft_model is None or isinstance(draft_model, HEADS) or precision.name != "float32" \
            or self_draft_precision(draft) is not None or not (embedded_lm or Path(draft).is_dir()):
        return None
    source = DRAFT_DIR if embedded_lm else Path(draft)
    if not any((source / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        # The exporter writes the runtime's tokenizer files from the folder's; a draft shares the target's.
        digest = hashlib.sha1(str(source.resolve()).encode()).hexdigest()[:10]
        staged = export_root() / "sources" / f"{source.name}-{digest}"
        if not (staged / "config.json").is_file():
            draft_model.save_pretrained(staged)
            tokenizer.save_pretrained(staged)
        source = staged
    try:
        return onnx_target(source, precision.name)
    except ModelLoadError:
        return None


def _pair_precisions(device, dtype, target_dtype, draft_dtype, draft: str | None):
    """Each model's `Precision`: its own setting, else `dtype`; a `self:` draft names its own."""
    own = self_draft_precision(draft)
    if own is not None and draft_dtype not in (None, "", "auto", own):
        raise ValueError(f"draft {draft!r} names its precision ({own}); draft_dtype {draft_dtype!r} contradicts it")
    target_precision = resolve_precision(target_dtype if target_dtype not in (None, "") else dtype, device)
    draft_precision = resolve_precision(own or (draft_dtype if draft_dtype not in (None, "") else dtype), device)
    return target_precision, draft_precision


def _load_draft(draft: str, target: str, target_model, tokenizer, device, precision: Precision,
                trust_remote_code: bool):
    """The draft of a pair, at its precision, checked against the target it drafts for."""
    if self_draft_precision(draft) is not None:
        return self_draft(target_model, precision)
    embedded = draft in (EMBEDDED, EMBEDDED_LM, EMBEDDED_HEAD)
    kind = draft_kind_of(draft)
    if is_encoder_decoder_model(target_model) and (embedded or kind not in ("model", None)):
        raise ModelLoadError(
            f"{draft!r} drafts for a decoder-only target; {target!r} is an encoder-decoder model "
            f"({architecture(target_model.config)}): give it an encoder-decoder draft with its tokenizer, "
            "e.g. a smaller model of the same family"
        )
    if precision.quantized and kind != "model":
        what = "feature head" if kind == "feature-head" else KIND_NAMES[kind]
        raise ValueError(f"draft_dtype {precision.name}: the {what} {draft!r} runs in a float dtype "
                         "(float32, bfloat16 or float16); int8 and int4 quantize draft LMs and self-drafts")
    dtype = precision.float_dtype
    if embedded:
        draft_model = load_embedded_draft(target_model, kind=draft, device=device, dtype=dtype)
    elif is_feature_head(draft):
        return load_feature_head(draft, target_model, device, dtype)
    elif kind != "model":
        _check_head_tokenizer(draft, tokenizer, target, trust_remote_code)
        return load_published(draft, target_model, target, device, dtype)
    else:
        draft_tokenizer = _optional_tokenizer(draft, trust_remote_code)
        if draft_tokenizer is not None:
            check_same_tokenizer(tokenizer, draft_tokenizer, target, draft)
        draft_model = load_model(draft, device, dtype, trust_remote_code)
        check_same_kind(target_model, draft_model, target, draft)
    return draft_model if isinstance(draft_model, HEADS) else quantize(draft_model, precision)


def _check_head_tokenizer(draft: str, tokenizer, target: str, trust_remote_code: bool) -> None:
    """A published head that ships a tokenizer must ship the target's (most ship none)."""
    folder = local_folder(draft)
    if not (folder / "tokenizer.json").is_file() and not (folder / "tokenizer_config.json").is_file():
        return
    head_tokenizer = _optional_tokenizer(str(folder), trust_remote_code)
    if head_tokenizer is not None:
        check_same_tokenizer(tokenizer, head_tokenizer, target, draft)


def draft_kind_of(draft: str | None) -> str | None:
    """What a draft reference will load as, without loading it: "feature-head", a published head's kind
    ("eagle", "eagle3", "medusa", from its config), "model" or None (as `ModelPair.draft_kind` says of a
    loaded pair)."""
    if not draft:
        return None
    if draft in (EMBEDDED, EMBEDDED_HEAD, EMBEDDED_LM):
        return "feature-head" if (DEFAULT_DRAFT if draft == EMBEDDED else draft) == EMBEDDED_HEAD else "model"
    if self_draft_precision(draft) is not None:
        return "model"
    if is_feature_head(draft):
        return "feature-head"
    if any(draft == preset.draft for preset in PRESETS.values()):  # the presets' drafts are LMs: no Hub lookup
        return "model"
    return published_kind(draft) or "model"


def load_feature_head(folder: str, target_model, device, dtype) -> FeatureHead:
    """A feature head trained for this target (a folder with feature_head.json), bound to it."""
    try:
        head = FeatureHead.load(Path(folder), dtype=dtype, device=device)
    except Exception as error:
        raise ModelLoadError(f"cannot load the feature head in {folder!r}: {type(error).__name__}: {error}") from error
    expected = (head.config.hidden_size, head.config.vocab_size)
    actual = (target_model.config.hidden_size, _output_size(target_model))
    if expected != actual:
        raise ModelLoadError(
            f"the feature head in {folder!r} was trained for a target with hidden size {expected[0]} and "
            f"{expected[1]} tokens; this target has {actual[0]} and {actual[1]}"
        )
    layers = target_model.config.num_hidden_layers
    beyond = [i for i in head.config.feature_layers if not 0 <= i <= layers]
    if beyond:
        raise ModelLoadError(f"the feature head in {folder!r} reads the target's layers {beyond}, "
                             f"but this target has {layers} layers")
    return head.bind(target_model)


def is_encoder_decoder_model(model) -> bool:
    return bool(getattr(model.config, "is_encoder_decoder", False))


def architecture(config) -> str:
    """What a config describes, as its model card names it: its class, else its model type."""
    names = getattr(config, "architectures", None) or []
    return names[0] if names else f"model type {getattr(config, 'model_type', '?')!r}"


SUPPORTED = ("decoder-only causal LMs (Llama, Qwen, GPT-NeoX, ...) and encoder-decoder LMs (T5, BART, Marian, ...) "
             "whose draft is of the same kind")


def check_same_kind(target_model, draft_model, target: str, draft: str) -> None:
    """A pair is two decoder-only models or two encoder-decoder models: their caches and inputs differ."""
    kinds = [is_encoder_decoder_model(m) for m in (target_model, draft_model)]
    if kinds[0] != kinds[1]:
        name = {True: "an encoder-decoder model", False: "a decoder-only model"}
        raise ModelLoadError(
            f"the target {target!r} is {name[kinds[0]]} ({architecture(target_model.config)}) and the draft "
            f"{draft!r} is {name[kinds[1]]} ({architecture(draft_model.config)}); specdemo runs {SUPPORTED}"
        )


def model_class_for(ref: str, config, trust_remote_code: bool = False):
    """The auto class that loads this config for generation, or ModelLoadError naming what it is."""
    names = set(getattr(config, "architectures", None) or [])
    model_type = getattr(config, "model_type", None)
    seq2seq_classes = set(MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.values())
    causal_classes = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    if getattr(config, "is_encoder_decoder", False):
        if model_type in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES or names & seq2seq_classes:
            return AutoModelForSeq2SeqLM
    # An architecture that none of transformers' text generators names (BertForMaskedLM, a
    # classifier, ...) is not one to decode with, even where its model type has a causal variant.
    elif trust_remote_code or (names & causal_classes) or (not names and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES):
        return AutoModelForCausalLM
    kind = ("an encoder-decoder model that does not generate text from text" if getattr(config, "is_encoder_decoder", False)
            else "not a model that generates text (an encoder-only or task model)")
    raise ModelLoadError(f"{ref!r} is {architecture(config)}, {kind}; specdemo runs {SUPPORTED}")


def check_same_tokenizer(target_tok, draft_tok, target: str, draft: str) -> None:
    if target_tok.get_vocab() != draft_tok.get_vocab():
        raise ValueError(
            f"draft tokenizer differs from the target's: {draft!r} ({len(draft_tok)} tokens) cannot draft for "
            f"{target!r} ({len(target_tok)} tokens). Speculative decoding needs a draft with the same tokenizer, "
            "e.g. a smaller model of the same family"
        )


def shared_vocab_size(target_model, draft_model, tokenizer, target: str, draft: str) -> int | None:
    vt, vd = _output_size(target_model), _output_size(draft_model)
    if vt == vd:
        return None
    if min(vt, vd) < len(tokenizer):
        raise ValueError(
            f"draft vocabulary differs from the target's: {draft!r} predicts {vd} tokens, {target!r} {vt}, "
            f"and the tokenizer has {len(tokenizer)}"
        )
    # Same tokenizer, different padding of the output layer: compare on the real tokens only.
    return min(vt, vd)


def load_tokenizer(ref: str, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    path = Path(ref)
    try:
        if ref.endswith(".gguf") and path.is_file():
            return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoTokenizer.from_pretrained(ref, trust_remote_code=trust_remote_code)
    except Exception as error:  # transformers raises many kinds; the user needs one message
        raise ModelLoadError(_explain(ref, error, "tokenizer")) from error


def _optional_tokenizer(ref: str, trust_remote_code: bool):
    """The draft's own tokenizer if it ships one (a bare save_pretrained folder may not)."""
    try:
        return load_tokenizer(ref, trust_remote_code)
    except ModelLoadError:
        if Path(ref).exists():
            return None
        raise


def load_model(ref: str, device: str, dtype: torch.dtype, trust_remote_code: bool = False) -> torch.nn.Module:
    path = Path(ref)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": trust_remote_code}
    try:
        if ref.endswith(".gguf") and path.is_file():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
        else:
            config = AutoConfig.from_pretrained(ref, trust_remote_code=trust_remote_code)
            auto_class = model_class_for(ref, config, trust_remote_code)
            model = auto_class.from_pretrained(ref, **kwargs)
    except ModelLoadError:
        raise
    except Exception as error:
        raise ModelLoadError(_explain(ref, error, "model")) from error
    return model.to(device).eval()


def _explain(ref: str, error: Exception, what: str) -> str:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    kinds = {type(e).__name__ for e in chain}
    text = " ".join(str(e) for e in chain)
    if any(isinstance(e, GatedRepoError) for e in chain) or "gated" in text.lower():
        return f"{ref!r} is a gated model: accept its licence on huggingface.co and log in (HF_TOKEN) to use it"
    if any(isinstance(e, RepositoryNotFoundError) for e in chain) or "is not a valid model identifier" in text:
        return f"no {what} named {ref!r}: it is neither a local folder nor a model id on the Hugging Face Hub"
    if os.environ.get("HF_HUB_OFFLINE") == "1" or "offline" in text.lower() or "LocalEntryNotFoundError" in kinds:
        return (f"cannot load {ref!r}: it is not a local folder or .gguf file, and the Hugging Face Hub "
                "cannot be reached (offline); use a local model or the 'embedded' pair")
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"cannot load {what} {ref!r}: {first_line}"


def _output_size(model) -> int:
    head = model.get_output_embeddings()
    # out_features: a quantized linear layer's weight is packed (or a method, in torch.ao's).
    return getattr(head, "out_features", None) or head.weight.shape[0] if head is not None else model.config.vocab_size


def _context_length(model) -> int:
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, name, None) or getattr(getattr(config, "text_config", None), name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048
