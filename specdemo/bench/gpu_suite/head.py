"""Head data at scale, with the time the other stages left: the corpus command answers many
distinct requests, the head's trainer continues the shipped head on them, and both heads are
measured on the same held-out requests. The new head is written into the output
folder and installed over the shipped one only when its held-out acceptance is higher.

The training commands run as subprocesses (bench never imports training), each with the
part of the budget it may use. Acceptance is measured here, with greedy SD on the
benchmark's hand-written suite, which no training template wrote.

May import ``engine``, ``models`` and the other bench modules.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ...engine.decoding import generate
from ...engine.drafters.feature_head import CONFIG_NAME, WEIGHTS_NAME
from ...engine.methods import FIXED_GAMMA
from ...models.embedded import HEAD_DIR
from ...models.loading import load_feature_head, load_pair
from .measure import prompt_ids
from .pairs import suite_prompts
from .stages import OutOfTime, StageContext

# Distinct requests to draw: about 100 answer tokens each, so ≥ 10 M tokens want ~100 k of them.
FULL_REQUESTS = 120_000
GOAL_TOKENS = 10_000_000
HEAD_FILES = (CONFIG_NAME, WEIGHTS_NAME)


def _python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _run(ctx: StageContext, commands: list[list[str]], log: Path, share: float) -> None:
    """Run commands side by side, killed if they outlast `share` of the time left."""
    timeout = max(5.0, share * ctx.seconds_left())
    ctx.log(f"{' '.join(commands[0][2:4])} ×{len(commands)} (≤ {timeout / 60:.1f} min), log {log.name}")
    # PYTHONPATH included: a target on it is found by the subprocesses as by this one.
    env = {"HF_HUB_OFFLINE": "1", **os.environ}
    with open(log, "a", encoding="utf-8") as handle:
        processes = [subprocess.Popen(c, stdout=handle, stderr=subprocess.STDOUT, env=env) for c in commands]
        try:
            codes = [p.wait(timeout=timeout) for p in processes]
        except subprocess.TimeoutExpired:
            for p in processes:
                p.kill()
            raise OutOfTime(f"stopped at its budget in {commands[0][2]} (see {log.name})") from None
    if any(codes):
        raise RuntimeError(f"{commands[0][2]} exited with {codes}; see {log}")


def corpus_commands(ctx: StageContext, corpus: Path) -> list[list[str]]:
    s = ctx.settings
    if s.tiny:
        return [_python("specdemo.training.corpus", "--out", str(corpus), "--device", s.device, "--prompts", "2",
                        "--self-instruct", "0", "--batch", "2", "--derived-per-shard", "0", "--max-new-tokens", "8",
                        "--max-shards", "1", "--sample-every", "0", "--threads", "1", "--seed", str(s.seed))]
    workers = 3 if s.cuda else 1  # eager batched decoding is bound by the host: one process a few cores
    minutes = f"{0.55 * ctx.seconds_left() / 60:.2f}"
    return [_python("specdemo.training.corpus", "--out", str(corpus), "--device", s.device, "--prompts",
                    str(FULL_REQUESTS), "--self-instruct", "0", "--batch", "384" if s.cuda else "32",
                    "--derived-per-shard", "96" if s.cuda else "8", "--minutes", minutes, "--threads", "4",
                    "--seed", str(s.seed), "--workers", str(workers), "--worker", str(i)) for i in range(workers)]


def train_command(ctx: StageContext, corpus: Path, head: Path) -> list[str]:
    s = ctx.settings
    common = ["--corpus", str(corpus), "--out", str(head), "--device", s.device, "--start-from", str(HEAD_DIR)]
    if s.tiny:
        return _python("specdemo.training.eagle", *common, "--max-steps", "2", "--tokens-per-batch", "256",
                       "--threads", "1")
    minutes = f"{0.6 * ctx.seconds_left() / 60:.2f}"
    return _python("specdemo.training.eagle", *common, "--prompt-loss", "--epochs", "3", "--tokens-per-batch", "8192",
                   "--max-minutes", minutes)


def suite_acceptance(ctx: StageContext, heads: dict[str, Path]) -> dict[str, float]:
    """Greedy SD's acceptance with each head on the benchmark's hand-written suite, whose requests
    no training template wrote (held out by construction); one target serves every head."""
    s = ctx.settings
    base = load_pair("embedded", draft=None, device=s.device, dtype=s.dtype, runtime="torch")
    prompts = [ids for _, ids in prompt_ids(base, suite_prompts(1 if s.tiny else 12), chat=True)]
    scores, dtype = {}, next(base.target.parameters()).dtype
    for name, folder in heads.items():
        pair = dataclasses.replace(base, draft=load_feature_head(str(folder), base.target, base.device, dtype))
        drafted = accepted = 0
        for ids in prompts:
            result = generate(pair, ids, FIXED_GAMMA, max_new_tokens=s.max_new_tokens, gamma=s.gamma, temperature=0.0,
                              copy_n=0)
            drafted += sum(len(r.drafted) for r in result.rounds)
            accepted += sum(r.accepted for r in result.rounds)
        scores[name] = accepted / drafted if drafted else 0.0
    base.close()
    return scores


def run_head(ctx: StageContext) -> None:
    s = ctx.settings
    work, head = s.out / "head-data", s.out / "head"
    corpus = work / "corpus"
    work.mkdir(parents=True, exist_ok=True)
    _run(ctx, corpus_commands(ctx, corpus), work / "corpus.log", 0.6)
    manifest = json.loads((corpus / "manifest.json").read_text(encoding="utf-8"))
    ctx.note(f"- corpus: {manifest['answer_tokens']:,} answer tokens (goal {GOAL_TOKENS:,}) from "
             f"{manifest['distinct_prompts']:,} distinct requests in {manifest['shards']} shard(s)")
    _run(ctx, [train_command(ctx, corpus, head)], work / "train.log", 0.7)
    ctx.check_time("the held-out acceptance")
    scores = suite_acceptance(ctx, {"new": head, "shipped": HEAD_DIR})
    ctx.note(f"- held-out acceptance (greedy SD, γ={s.gamma}, the benchmark's suite): new head {scores['new']:.4f}, "
             f"shipped head {scores['shipped']:.4f}")
    ctx.wrote(*(head / name for name in HEAD_FILES))
    _maybe_install(ctx, head, scores["new"] > scores["shipped"])


def _maybe_install(ctx: StageContext, head: Path, better: bool) -> None:
    s = ctx.settings
    if not better:
        ctx.note("- not installed: the shipped head is at least as good on the held-out answers")
    elif s.tiny or not s.install_head:
        ctx.note("- better, but not installed (" + ("a rehearsal never installs" if s.tiny else "--no-install") + ")")
    else:
        for name in HEAD_FILES:
            shutil.copy2(head / name, HEAD_DIR / name)
        ctx.note(f"- installed into {HEAD_DIR} (its model card still describes the previous head: update it)")
