"""Arguments every subcommand shares: the model pair, the decoding parameters and the
engine options, the latter two generated from `specdemo.engine.params.SCHEMA` and
`ENGINE_SCHEMA` (each default stated once, by the schema, in the help text)."""

from __future__ import annotations

import argparse
import contextlib
from typing import Sequence

from ..bench.measure.cluster import DEFAULT_RETRIES, Cluster
from ..engine.methods import DEFAULT_METHODS, METHODS, methods_reading
from ..engine.params import ENGINE_SCHEMA, SCHEMA, DecodeParams, EngineOptions, Param
from ..models.loading import EMBEDDED, PRESETS
from ..engine.runtimes import AUTO, RUNTIME_CHOICES
from ..models.precision import CONFIGURATIONS, PRECISIONS
from ..models.spec import PairSpec

# What the command line says instead of the schema's default, where its default differs.
_CLI_DEFAULT_NOTE = {"chat": "on for the embedded pairs, off otherwise", "seed": "random"}


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--pair", default=None, choices=sorted(PRESETS),
                       help="a model-pair preset (default: embedded, unless --target is given)")
    group.add_argument("--target", default=None, help="target: hub id, local folder or .gguf file")
    group.add_argument("--draft", default=None, help="draft for sd/egag: hub id, local folder, .gguf file, a "
                                                     "published EAGLE, EAGLE-3 or Medusa head for the target "
                                                     "(hub id or folder), or self:PRECISION (the target's own "
                                                     "weights, e.g. self:int8)")
    group.add_argument("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda if available)")
    group.add_argument("--dtype", default=None,
                       help=f"both models' precision, one of {', '.join(PRECISIONS)} "
                            "(default: float32 on CPU, bfloat16 on GPU)")
    group.add_argument("--target-dtype", default=None, metavar="PRECISION",
                       help="the target's precision (default: --dtype); int8 is the fastest int8 path measured "
                            "on the device (docs/precision-and-memory.md)")
    group.add_argument("--config", default=None, choices=sorted(CONFIGURATIONS),
                       help="a configuration of precisions and KV caches: short-text (full caches), long-text "
                            "(the draft's cache streams, 1024 tokens) or low-memory (int8 models, both caches "
                            "streaming, lossy); flags given explicitly win")
    group.add_argument("--runtime", default=AUTO, choices=RUNTIME_CHOICES,
                       help="what runs the target's forwards: auto (onnx where it runs the target: the CPU, "
                            "onnxruntime-genai installed, a target it exports; torch otherwise, and the run says "
                            "why), torch (the reference) or onnx (ONNX Runtime on the CPU at float32, int8 or int4, "
                            "exported on first use; a method it cannot run runs on the torch copy: "
                            "docs/runtime.md) (default: auto)")
    group.add_argument("--draft-dtype", default=None, metavar="PRECISION",
                       help="the draft's precision (default: --dtype); --draft self:int8 drafts with the "
                            "target's own weights in int8")


def _flag_help(spec: Param) -> str:
    readers = methods_reading(spec.name)
    where = f"{', '.join(readers)}: " if readers else ""
    default = _CLI_DEFAULT_NOTE.get(spec.name, spec.default)
    return f"{where}{spec.help} (default: {default})"


def add_decoding_arguments(parser: argparse.ArgumentParser, methods_default: Sequence[str] = DEFAULT_METHODS,
                           methods_known: Sequence[str] | None = None, exclude: Sequence[str] = (),
                           methods: bool = True) -> argparse._ArgumentGroup:
    """--methods, one flag per schema parameter (--max-new-tokens, --temperature, ...) less the
    parameters named in exclude (a subcommand that takes them otherwise), and one flag per
    engine option (--cache, --compile/--no-compile)."""
    group = parser.add_argument_group("decoding")
    known = list(methods_known if methods_known is not None else METHODS)
    default = ",".join(methods_default)
    if methods:
        group.add_argument("--methods", default=default,
                           help=f"comma-separated, from: {', '.join(known)} (default: {default})")
    for spec in SCHEMA:
        if spec.name in exclude:
            continue
        _add_flag(group, spec)
    engine = parser.add_argument_group("engine (how tokens are computed, never which)")
    for spec in ENGINE_SCHEMA:
        _add_flag(engine, spec)
    return group


def _add_flag(group, spec: Param) -> None:
    flag = "--" + spec.name.replace("_", "-")
    if spec.kind is bool:
        group.add_argument(flag, dest=spec.name, action=argparse.BooleanOptionalAction, default=None,
                           help=_flag_help(spec))
    else:
        # Values are parsed by the schema (DecodeParams.from_values), so errors read the same everywhere.
        group.add_argument(flag, dest=spec.name, default=None, choices=spec.choices, help=_flag_help(spec),
                           metavar=None if spec.choices else spec.kind.__name__.upper())


def decode_params(args: argparse.Namespace, chat_default: bool, exclude: Sequence[str] = ()) -> DecodeParams:
    """The validated parameters of a parsed command line (ValueError naming the field);
    the excluded ones keep the schema's default."""
    values = {spec.name: configured(args, spec.name) for spec in SCHEMA if spec.name not in exclude}
    if values["chat"] is None:
        values["chat"] = chat_default
    return DecodeParams.from_values(**values)


def engine_options(args: argparse.Namespace) -> EngineOptions:
    """The validated engine options of a parsed command line (ValueError naming the option)."""
    return EngineOptions.from_values(**{spec.name: getattr(args, spec.name, None) for spec in ENGINE_SCHEMA})


def default_chat(args: argparse.Namespace) -> bool:
    """Chat is on by default for every preset whose target is the embedded (instruct) model: without
    its template, SmolLM2-Instruct often ends a bare question at once."""
    if args.target:
        return False
    preset = PRESETS.get(args.pair or EMBEDDED)
    return preset is not None and preset.target == EMBEDDED


def configured(args: argparse.Namespace, name: str):
    """A setting as the command line gives it, else as its --config preset sets it, else None."""
    value = getattr(args, name, None)
    if value is None and getattr(args, "config", None):
        value = CONFIGURATIONS[args.config].get(name)
    return value


def pair_spec_from_args(args: argparse.Namespace) -> PairSpec:
    """What the command line's pair is, unloaded: a cluster's workers each load their own."""
    options = dict(device=args.device, dtype=args.dtype, target_dtype=configured(args, "target_dtype"),
                   draft_dtype=configured(args, "draft_dtype"), runtime=getattr(args, "runtime", None) or AUTO)
    if args.target:
        return PairSpec(args.target, args.draft, **options)
    if args.draft:  # a preset's target with another draft (e.g. --pair embedded --draft self:int8)
        return PairSpec.for_preset_draft(args.pair, args.draft, **options)
    return PairSpec(args.pair or EMBEDDED, **options)


def pair_from_args(args: argparse.Namespace):
    return pair_spec_from_args(args).load()


def add_cluster_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--cluster and how its workers take the run: --workers, --retries, --prompts-per-task."""
    group = parser.add_argument_group("cluster (Ray: pip install 'specdemo[cluster]'; docs/cluster.md)")
    group.add_argument("--cluster", default=None, metavar="ray|ray://HOST:PORT",
                       help=f"fan the {what} out over a Ray cluster: ray (the cluster RAY_ADDRESS names, else a Ray "
                            "started on this machine) or ray://HOST:PORT; each worker loads the pair once on one "
                            "device (a GPU each where the cluster has GPUs), every method of a task's prompts "
                            "interleaved on it (default: one process, here)")
    group.add_argument("--workers", type=int, default=None,
                       help="workers of --cluster (default: one per GPU, else one per --threads CPUs)")
    group.add_argument("--retries", type=int, default=DEFAULT_RETRIES,
                       help=f"times the task of a worker that died goes back to the queue (default: {DEFAULT_RETRIES})")
    group.add_argument("--prompts-per-task", type=int, default=None, metavar="N",
                       help="prompts of one --cluster task (default: about four tasks per worker)")


def cluster_from_args(args: argparse.Namespace, threads: int | None = None) -> Cluster | None:
    """The validated cluster of a command line, None without --cluster; threads: each worker's CPUs."""
    given = [flag for flag, value in (("--workers", args.workers), ("--prompts-per-task", args.prompts_per_task))
             if value is not None]
    if args.cluster is None:
        if given:
            raise ValueError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --cluster runs only")
        return None
    return Cluster(args.cluster, workers=args.workers, retries=args.retries, prompts_per_task=args.prompts_per_task,
                   cpus_per_worker=threads or 1)


def add_suite_arguments(parser: argparse.ArgumentParser, repeats: int, what: str, threads: bool = True) -> None:
    """--suite, --categories, --limit, --repeats, --no-warmup and (unless `threads` is false) --threads."""
    suite = parser.add_argument_group("suite")
    suite.add_argument("--suite", default=None,
                       help="JSONL, one {\"prompt\": ..., \"category\": ...} a line (optional \"id\", \"messages\", "
                            "\"reference\"), or Spec-Bench / MT-bench question.jsonl lines ({\"question_id\", "
                            "\"category\", \"turns\"}); or hf:DATASET[:CONFIG]:SPLIT, a Hugging Face dataset (needs "
                            "--prompt-field); default: the suite that ships with specdemo")
    suite.add_argument("--category-map", default=None, metavar="MAP",
                       help="rename categories as the suite is read: 'mt-bench' (MT-bench's eight categories → "
                            "multi_turn, as Spec-Bench reports them), 'old=new,…' or a JSON file")
    suite.add_argument("--prompt-field", default=None, metavar="FIELD",
                       help="hf: suites: the field that holds the prompt (dotted for nested fields: translation.de)")
    suite.add_argument("--reference-field", default=None, metavar="FIELD",
                       help="hf: suites: the field that holds the reference(s), scored with BLEU, chrF and ROUGE")
    suite.add_argument("--template", default=None,
                       help="hf: suites: the request, with {prompt} for the prompt field's text "
                            "(e.g. 'Summarise this article:\\n{prompt}')")
    suite.add_argument("--prompt-words", default=None, metavar="LOW:HIGH",
                       help="hf: suites: keep rows of at least LOW words and cut them to HIGH words; without "
                            "--reference-field the rest of the text is the reference (continuations)")
    suite.add_argument("--prompt-tokens", default=None, metavar="LOW:HIGH",
                       help="hf: suites: the same in tokens of the target's tokenizer (read once the pair is loaded)")
    suite.add_argument("--categories", default=None, help="comma-separated categories to run (default: all of them)")
    suite.add_argument("--limit", type=int, default=None,
                       help="at most this many prompts per category (hf: suites read no more rows than this)")
    suite.add_argument("--repeats", type=int, default=repeats, help=f"runs of every {what} (default: {repeats})")
    suite.add_argument("--no-warmup", dest="warmup", action="store_false",
                       help="skip the untimed warm-up run of each method (by default each method has one)")
    if threads:
        suite.add_argument("--threads", type=int, default=None,
                           help="torch CPU threads (default: torch's choice); 1 is steadier on a busy shared CPU")


def add_thread_plan_argument(parser: argparse.ArgumentParser) -> None:
    """--threads as a count or auto (the page's plan: one thread for AR, every core for drafting methods)."""
    parser.add_argument("--threads", type=str, default=None,
                        help="torch CPU threads: a count, or auto (one thread for the methods that write one "
                             "token a step, every core for the drafting methods, as the page decodes on a small "
                             "machine); default: torch's choice for every method")


@contextlib.contextmanager
def progress_bar(quiet: bool, unit: str = "run"):
    """A tqdm bar fed by the runners' progress(done, total, message) callback (None when quiet); a
    cluster run's counts tasks, each message the node of the task that finished last."""
    if quiet:
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=1, unit=unit, dynamic_ncols=True)

    def progress(done: int, total: int, message: str) -> None:
        bar.total = total
        bar.update(done - bar.n)
        bar.set_postfix_str(message, refresh=False)

    try:
        yield progress
    finally:
        bar.close()


def suite_needs_tokenizer(args: argparse.Namespace) -> bool:
    """Whether the suite can only be read once the pair is loaded (prompts cut in its tokens);
    the flag itself is checked now, before any model loads."""
    if not getattr(args, "prompt_tokens", None):
        return False
    from ..bench.hub_data import is_hf_suite

    if not is_hf_suite(args.suite):
        raise ValueError("--prompt-tokens applies to hf:DATASET[:CONFIG]:SPLIT suites only")
    _bounds("--prompt-tokens", args.prompt_tokens)
    return True


def read_suite(args: argparse.Namespace, tokenizer=None) -> list:
    """The suite a command line names: a JSONL file of either shape, an hf: dataset, or the built-in
    one. `tokenizer` (the pair's) is needed only for --prompt-tokens."""
    from ..bench.hub_data import is_hf_suite, load_hf_suite
    from ..bench.suite import DEFAULT_SUITE, load_suite, rename_categories

    hf_only = [flag for flag, value in (("--prompt-field", args.prompt_field), ("--reference-field",
               args.reference_field), ("--template", args.template), ("--prompt-words", args.prompt_words),
               ("--prompt-tokens", args.prompt_tokens)) if value]
    if not is_hf_suite(args.suite):
        if hf_only:
            raise ValueError(f"{', '.join(hf_only)} apply to hf:DATASET[:CONFIG]:SPLIT suites only")
        return load_suite(args.suite or DEFAULT_SUITE, category_map=args.category_map)
    words, tokens = (_bounds(flag, value) for flag, value in (("--prompt-words", args.prompt_words),
                                                             ("--prompt-tokens", args.prompt_tokens)))
    prompts = load_hf_suite(args.suite, args.prompt_field, args.reference_field, args.template, limit=args.limit,
                            prompt_words=words, prompt_tokens=tokens, tokenizer=tokenizer)
    return rename_categories(prompts, args.category_map)


def _bounds(flag: str, value: str | None) -> tuple[int, int] | None:
    if not value:
        return None
    low, sep, high = value.partition(":")
    try:
        if sep:
            return int(low), int(high)
    except ValueError:
        pass
    raise ValueError(f"{flag} must be LOW:HIGH (e.g. 50:200), got {value!r}")
