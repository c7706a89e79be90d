"""The stages of `at_scale`: write the corpus, train the head, measure it; and the tiny target of
the CPU rehearsal.

Each stage is `stage(context, deadline) -> dict` (what it did, for summary.json) and stops by its
deadline (a `time.monotonic()` value); what it has made so far is in `context.partial`, so a stage
cut short still reports it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specdemo.engine.drafters.feature_head import FeatureHead
from specdemo.models.tokens import collect_eos_ids, cpu_name, encode_messages

from . import corpus as corpus_module
from .eagle import length_groups, read_sequences, split_by_request, train_head
from .evaluate import heldout_acceptance, heldout_agreement, outside_subset_share, step_cost
from .generation import answer_all, padding_id
from .prompts import heldout_prompts, written_prompts

TINY_VOCAB = 320  # a byte-level BPE: the 256 bytes, some merges, the special tokens
TINY_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" \
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


@dataclass
class Scale:
    """How big each stage's work is: the real target's defaults, or the rehearsal's."""

    batch: int
    prompts: int
    max_new_tokens: int
    tokens_per_batch: int
    subset: int
    measure_prompts: int | None  # held-out and suite requests measured (None: all)
    measure_new_tokens: int

    @classmethod
    def for_run(cls, tiny: bool, device: str) -> "Scale":
        if tiny:
            return cls(batch=16, prompts=400, max_new_tokens=16, tokens_per_batch=1024, subset=256,
                       measure_prompts=6, measure_new_tokens=16)
        cuda = device.startswith("cuda")
        return cls(batch=1024 if cuda else 64, prompts=60000, max_new_tokens=128,
                   tokens_per_batch=8192 if cuda else 1024, subset=8192, measure_prompts=None, measure_new_tokens=96)


@dataclass
class Context:
    """What the stages share: where things go, the scale, the target (loaded once), the results."""

    out: Path
    work: Path
    device: str
    dtype: torch.dtype
    tiny: bool
    scale: Scale
    start_from: str
    compile_step: bool = False
    seed: int = 0
    partial: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)
    _loaded: dict = field(default_factory=dict)

    @classmethod
    def for_run(cls, args, work: Path) -> "Context":
        scale = Scale.for_run(args.tiny, args.device)
        if args.batch:
            scale.batch = args.batch
        if args.prompts:
            scale.prompts = args.prompts
        start = args.start_from or ("scratch" if args.tiny else "shipped")
        return cls(Path(args.out), Path(work), args.device, getattr(torch, args.dtype), args.tiny, scale, start,
                   args.compile, args.seed)

    @property
    def corpus_dir(self) -> Path:
        return self.work / "corpus"

    def target(self, dtype: torch.dtype | None = None):
        """(model, tokenizer) on the run's device in `dtype` (the writing dtype by default), loaded once each."""
        dtype = dtype or self.dtype
        if dtype not in self._loaded:
            folder = build_tiny_target(self.work / "tiny-target", self.seed) if self.tiny else None
            model, tokenizer = corpus_module.load_teacher(str(folder) if folder else None, self.device, dtype)
            for p in model.parameters():
                p.requires_grad_(False)
            self._loaded[dtype] = (model, tokenizer)
        return self._loaded[dtype]

    def log(self, message: str) -> None:
        print(message, flush=True)
        with open(self.out / "log.txt", "a", encoding="utf-8") as f:
            f.write(message + "\n")


def build_tiny_target(folder: Path, seed: int = 0) -> Path:
    """A random 2-layer Llama with a byte-level BPE trained on the request templates and a chat
    template, saved with save_pretrained (once) so it loads as the real target does."""
    if (folder / "config.json").is_file():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(written_prompts()[:2000] + heldout_prompts(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                        pad_token="<|endoftext|>")
    tokenizer.chat_template = TINY_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked next-token distributions, as a trained LM's
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _minutes_left(deadline: float, reserve: float = 0.0) -> float:
    return max(0.0, (deadline - time.monotonic()) / 60 - reserve)


def write_stage(ctx: Context, deadline: float) -> dict:
    """The target answers requests with the generation loop until the stage's deadline."""
    model, tokenizer = ctx.target()
    scale = ctx.scale
    started = time.monotonic()
    # Finished rows leave sampled shards too: faster, and no other run's samples to match.
    writer = functools.partial(answer_all, compile_step=ctx.compile_step, drop_finished=not ctx.compile_step)
    manifest = corpus_module.build(
        model, tokenizer, ctx.corpus_dir, prompts=scale.prompts, self_instruct_count=0, batch=scale.batch,
        derived_per_shard=scale.batch // 4, max_new_tokens=scale.max_new_tokens, minutes=_minutes_left(deadline),
        seed=ctx.seed, writer=writer, log=ctx.log)
    seconds = time.monotonic() - started
    ctx.results["corpus"] = manifest
    return {**manifest, "answer_tokens_per_s": round(manifest["answer_tokens"] / max(seconds, 1e-9), 1),
            "batch": scale.batch, "dtype": str(ctx.dtype).removeprefix("torch."), "corpus": str(ctx.corpus_dir)}


def starting_head(ctx: Context) -> FeatureHead | None:
    """The head training continues: the packaged one, a folder, or none (a random start)."""
    if ctx.start_from == "scratch":
        return None
    if ctx.start_from == "shipped":
        from specdemo.models.embedded import HEAD_DIR

        return FeatureHead.load(HEAD_DIR)
    return FeatureHead.load(Path(ctx.start_from))


def save_head(head: FeatureHead, folder: Path, info: dict) -> None:
    """Write the head beside `folder` and swap it in, so a kill mid-write keeps the previous one."""
    partial = folder.with_name(folder.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    head.save(partial, extra={"training": info})
    if folder.exists():
        shutil.rmtree(folder)
    partial.rename(folder)


def write_curve(out: Path, checks: list[dict]) -> None:
    """curve.csv (validation agreement at every check, against the answer tokens trained on) and
    curve.html drawing it."""
    import pandas as pd
    import plotly.graph_objects as go

    frame = pd.DataFrame(checks)
    frame.to_csv(out / "curve.csv", index=False)
    fig = go.Figure()
    for step in ("validation_agreement_step1", "validation_agreement_step2"):
        fig.add_trace(go.Scatter(x=frame["answer_tokens_seen"], y=frame[step], mode="lines+markers", name=step))
    fig.update_layout(title="The head's validation agreement while it trains", xaxis_title="answer tokens trained on",
                      yaxis_title="teacher-forced agreement")
    fig.write_html(out / "curve.html", include_plotlyjs="cdn")


def train_stage(ctx: Context, deadline: float) -> dict:
    """The head learns from the corpus with the recipe that measured best, until the deadline;
    every validation check is a point of the curve, and the best head so far is in DIR/head."""
    target, _ = ctx.target(torch.float32)
    sequences = read_sequences(corpus_module.Corpus(ctx.corpus_dir))
    start = starting_head(ctx)
    train, _ = split_by_request(sequences, 0.04, ctx.seed)
    steps_per_epoch = len(length_groups(train, ctx.scale.tokens_per_batch))
    answer_tokens = sum(int(s.ids.numel() - s.answer_start) for s in train)
    checks: list[dict] = []

    def checkpoint(head: FeatureHead, check: dict) -> None:
        seen = round(answer_tokens * check["step"] / max(1, steps_per_epoch))
        checks.append({"step": check["step"], "answer_tokens_seen": seen,
                       "validation_agreement_step1": round(check["agreement"][0], 4),
                       "validation_agreement_step2": round(check["agreement"][-1], 4)})
        write_curve(ctx.out, checks)
        if check["best"]:
            save_head(head, ctx.out / "head", {"checkpoint_step": check["step"]})
            ctx.partial = {"checkpoint": checks[-1]}

    # The recipe of docs/draft-recipes.md's best arms: tokens only, the training-time test over a
    # round's four steps, the requests' own positions; rejected positions ×2 when continuing a head.
    head, info = train_head(
        target, sequences, subset_size=min(ctx.scale.subset, target.config.vocab_size), epochs=1000,
        tokens_per_batch=ctx.scale.tokens_per_batch, lr=1e-3 if start is None else 3e-4, prompt_loss=True,
        start_from=start, reg_weight=0.0, test_time=True, unroll=4, rejected_weight=1.0 if start is None else 2.0,
        max_minutes=_minutes_left(deadline, reserve=0.1 * _minutes_left(deadline)), seed=ctx.seed,
        checkpoint=checkpoint, evaluate_every=max(10, steps_per_epoch // 4), log=ctx.log)
    info["started_from"] = ctx.start_from
    save_head(head, ctx.out / "head", info)
    ctx.results["training"] = info
    return {k: info[k] for k in ("train_answer_tokens", "train_requests", "steps", "epochs_run", "best_step",
                                 "validation_agreement_step1", "validation_agreement_step2", "train_seconds")}


def measured_requests(ctx: Context) -> dict[str, tuple[list[list[tuple[str, str]]], list[str] | None]]:
    """The held-out prompts and the benchmark suite's requests (first turns) as chat messages, with
    the suite's categories; the rehearsal takes the first few of each."""
    from specdemo.bench.suite import DEFAULT_SUITE, conversation, load_suite

    n = ctx.scale.measure_prompts
    heldout = [[("user", text)] for text in heldout_prompts()][:n]
    items = load_suite(DEFAULT_SUITE)[:n]
    suite = [list(conversation(item, 1, []).messages or [("user", item.prompt)]) for item in items]
    return {"heldout": (heldout, None), "suite": (suite, [item.category for item in items])}


def reference_answers(ctx: Context, requests: list[list[tuple[str, str]]]) -> list[tuple[list[int], list[int]]]:
    """The target's greedy answers, written by the generation loop on the run's device."""
    model, tokenizer = ctx.target(torch.float32)
    prefixes = [encode_messages(tokenizer, messages) for messages in requests]
    answers = answer_all(model, prefixes, batch=ctx.scale.batch, max_new_tokens=ctx.scale.measure_new_tokens,
                         stops=collect_eos_ids(model, tokenizer), pad_id=padding_id(tokenizer), features=False)
    return [(prefix, answer.tokens) for prefix, answer in zip(prefixes, answers)]


def head_figures(head: FeatureHead, target, answers, groups) -> dict:
    """Acceptance and tokens per round (γ = 4, greedy rounds replayed), agreement, the subset's reach."""
    return {**heldout_acceptance(head, target, answers, 4, groups=groups), **heldout_agreement(head, target, answers),
            "outside_subset": outside_subset_share(head, answers)}


def measure_stage(ctx: Context, deadline: float) -> dict:
    """The trained head, then the head it started from, on the held-out prompts and the suite, on
    the run's device; each figure is kept as soon as it is measured, and the stage stops taking
    new ones at its deadline."""
    target, _ = ctx.target(torch.float32)
    heads = {"head": FeatureHead.load(ctx.out / "head", device=target.device).bind(target)}
    start = starting_head(ctx)
    if start is not None:
        heads["start"] = start.to(target.device).bind(target)
    measured: dict = {}
    ctx.partial = {"measured": measured}
    for name, (requests, groups) in measured_requests(ctx).items():
        if time.monotonic() > deadline:
            break
        answers = reference_answers(ctx, requests)
        for label, head in heads.items():
            if time.monotonic() > deadline:
                measured.setdefault("skipped", []).append(f"{label} on {name}: the stage's time was up")
                continue
            measured.setdefault(label, {})[name] = head_figures(head, target, answers, groups)
            ctx.log(f"{label} on {name}: " + json.dumps({k: v for k, v in measured[label][name].items()
                                                          if k != "by_group"}))
    if "heldout" in measured.get("head", {}):  # the cost and the card take seconds: the plan's reserve
        measured["head"]["cost"] = step_cost(heads["head"], target)
        write_card(ctx, measured)
    ctx.results["measured"] = measured
    return {"measured": measured}


def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def card_summary(ctx: Context, measured: dict) -> dict:
    """What the model card is rendered from (`card.py`'s keys): this head's one point, measured on
    the run's device, continuing the shipped head's stages when it started from it."""
    from specdemo.models.embedded import HEAD_DIR

    from .evaluate import round_speedup, verification_cost

    target, _ = ctx.target(torch.float32)
    shipped = json.loads((HEAD_DIR / "card.json").read_text(encoding="utf-8"))
    verify = verification_cost(target, 5)
    head = measured["head"]
    point = {**ctx.results.get("training", {}), **head["heldout"], **head["cost"],
             "description": f"written and trained at scale on {device_name(ctx.device)}"}
    point["predicted_speedup"] = round_speedup(point["tokens_per_round"], point["cost_ratio"], 4, verify)
    if ctx.start_from == "shipped":
        point["continued_from"] = shipped.get("installed") or shipped["curve"][-1]
    suite = head.get("suite")
    summary = {"curve": [point], "installed": point, "previous_draft_lm": shipped["previous_draft_lm"],
               "corpus": ctx.results.get("corpus", {"distinct_prompts": 0, "sequences": 0, "answer_tokens": 0}),
               "held_out_prompts": head["heldout"]["prompts"], "gamma": 4, "max_new_tokens": ctx.scale.measure_new_tokens,
               "verify_cost": verify, "extrapolation": [],
               "machine": {"cpu": device_name(ctx.device), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
                           "torch": torch.__version__, "python": sys.version.split()[0]},
               "command": "python -m specdemo.training.at_scale " + " ".join(sys.argv[1:]),
               "data_note": "Written by the batched writer (`python -m specdemo.training.at_scale`).",
               "changelog": shipped.get("changelog", [])}
    if suite:
        summary["hand_written"] = {"prompts": suite["prompts"], "acceptance": suite["acceptance"],
                                   "tokens_per_round": suite["tokens_per_round"],
                                   "agreement_step1": suite["heldout_agreement_step1"],
                                   "agreement_step2": suite["heldout_agreement_step2"]}
    return summary


def write_card(ctx: Context, measured: dict) -> None:
    """DIR/card.json and the card rendered from it (DIR/README.md)."""
    from .card import render_card

    summary = card_summary(ctx, measured)
    (ctx.out / "card.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (ctx.out / "README.md").write_text(render_card(summary), encoding="utf-8")


def stage_functions() -> dict:
    return {"write": write_stage, "train": train_stage, "measure": measure_stage}
