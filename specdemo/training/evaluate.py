"""How good is a feature head as a draft? Held-out acceptance and the cost of a draft step.

Greedy speculative decoding commits exactly the target's greedy answer, so its rounds can be
replayed from one teacher-forced pass: each round the drafter reads the target's features up
to the round's start (the same ones the verification forwards would hand it), drafts up to γ
tokens, and keeps the prefix that matches the answer. `replay_rounds` does this with the real
`FeatureDrafter`, so the numbers are those of the decode loop without its timing noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import torch

from specdemo.engine.clock import interleaved_medians
from specdemo.engine.drafters.context_copy import CopyFirstDrafter
from specdemo.engine.drafters.ngram import NgramTable
from specdemo.engine.drafters.feature_drafter import FeatureDrafter
from specdemo.engine.drafters.feature_head import FeatureHead
from specdemo.engine.drafters.policies import FixedGamma
from specdemo.engine.sampling import SamplingConfig
from specdemo.engine.trace import COPIED

from .prompts import heldout_prompts
from ..engine.methods import REFERENCE


@dataclass
class Replay:
    rounds: int
    drafted: int
    accepted: int
    new_tokens: int
    copied: int = 0  # rounds copied from the context instead of drafted (copy_n)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_round(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    def __add__(self, other: "Replay") -> "Replay":
        return Replay(self.rounds + other.rounds, self.drafted + other.drafted, self.accepted + other.accepted,
                      self.new_tokens + other.new_tokens, self.copied + other.copied)

    def report(self, prompts: int, gamma: int) -> dict:
        return {"prompts": prompts, "gamma": gamma, "acceptance": round(self.acceptance, 4),
                "tokens_per_round": round(self.tokens_per_round, 3), "rounds": self.rounds,
                "copied_rounds": self.copied, "new_tokens": self.new_tokens}


@torch.inference_mode()
def target_features(target, ids: list[int], layers: tuple[int, ...] = ()) -> torch.Tensor:
    """[len(ids), (k + 1) · d]: at every position the states of the k `layers` (none by default)
    and the target's final hidden state, as the decode loop hands them to a feature head."""
    out = target.get_decoder()(input_ids=torch.tensor([ids], device=target.device),
                               output_hidden_states=bool(layers))
    states = [out.hidden_states[i][0] for i in layers] + [out.last_hidden_state[0]]
    return torch.cat(states, dim=-1).to(torch.float32)


def replay_greedy(prompt: list[int], answer: list[int], propose, observe, leave_room: bool = True) -> Replay:
    """Greedy SD rounds over `answer` (the target's own greedy continuation of `prompt`): each
    round `propose(sequence, limit)` drafts at most `limit` ids, the prefix that matches the
    answer is kept with the target's next token, and `observe(sequence, verified_from, kept)`
    tells the drafter what the target verified.

    With `leave_room` (as the decode loop drafts) a round stops one token short of the answer's
    end, so the target always adds its own; without it a round may draft up to the end, and one
    accepted whole there ends the answer with no token of the target's (how the previous draft
    LM's shipped figures were measured)."""
    sequence = list(prompt)
    end = len(prompt) + len(answer)
    room = 1 if leave_room else 0
    total = Replay(0, 0, 0, len(answer))
    while len(sequence) < end:
        proposal = propose(sequence, end - len(sequence) - room)
        truth = answer[len(sequence) - len(prompt) :]
        kept = 0
        while kept < len(proposal) and proposal[kept] == truth[kept]:
            kept += 1
        verified_from = len(sequence)
        sequence.extend(truth[: kept + 1])
        observe(sequence, verified_from, kept)
        total = total + Replay(1, len(proposal), kept, 0)
    return total


@torch.inference_mode()
def replay_rounds(head: FeatureHead, prompt: list[int], answer: list[int], features: torch.Tensor,
                  gamma: int, copy_n: int = 0) -> Replay:
    """Greedy SD rounds of the feature head over `answer`, with the real `FeatureDrafter`
    (inside a `CopyFirstDrafter` when copy_n, as the decode loop builds it).

    features [len(prompt) + len(answer), d] from `target_features(prompt + answer)`.
    """
    drafter = FeatureDrafter(head)
    if copy_n:
        drafter = CopyFirstDrafter(drafter, copy_n)
    policy, sampling = FixedGamma(gamma), SamplingConfig(temperature=0.0)
    drafter.start(list(prompt), features[: len(prompt) - 1])
    copied = 0

    def propose(sequence, limit):
        nonlocal copied
        proposal = drafter.propose(sequence, policy, limit, sampling, None)
        copied += proposal.source == COPIED
        return proposal.tokens.tolist()

    def observe(sequence, verified_from, kept):
        drafter.observe(sequence, verified_from, None,
                        target_features=features[verified_from - 1 : verified_from + kept])

    return replace(replay_greedy(prompt, answer, propose, observe), copied=copied)


def corpus_table(answers: list[tuple[list[int], list[int]]], n: int) -> NgramTable:
    """NASD's n-gram table filled with every (request, answer) of a corpus: the answers' n-grams,
    so a table-drafter can quote what the target wrote for other requests."""
    table = NgramTable(n)
    for prefix, answer in answers:
        table.add_sequence(list(prefix) + list(answer), start=len(prefix))
    return table


def replay_table_rounds(corpus: NgramTable, prompt: list[int], answer: list[int], gamma: int) -> Replay:
    """Greedy rounds drafted by n-gram tables: the request's and the verified output's own table
    first (as NASD), the corpus table where that one knows no continuation. Drafting stops when
    neither does, so a round may draft fewer than γ tokens."""
    own = NgramTable(corpus.n)
    own.add_sequence(prompt)
    return replay_greedy(
        prompt, answer,
        propose=lambda sequence, limit: own.draft(sequence, min(gamma, limit), fallback=corpus),
        observe=lambda sequence, verified_from, kept: own.add_sequence(sequence, start=verified_from))


def table_acceptance(corpus: NgramTable, answers, gamma: int = 4) -> dict:
    total = sum((replay_table_rounds(corpus, prompt, answer, gamma) for prompt, answer in answers), Replay(0, 0, 0, 0))
    return {**total.report(len(answers), gamma), "n": corpus.n,
            "drafted_per_round": round(total.drafted / max(1, total.rounds), 3)}


def suite_requests(pair, source) -> tuple[list[list[int]], list[str]]:
    """Each request of a benchmark suite (a JSONL file in any shape `bench.suite` reads) as the
    chat-templated ids the benchmark feeds the decoders, with its category; a question of several
    turns gives its first. These requests were written by hand, not by the training templates, so
    acceptance on them tells a head that learned the target from one that learned the templates."""
    from specdemo.bench.suite import conversation, encode_prompt, load_suite

    items = load_suite(source)
    return [encode_prompt(pair, conversation(item, 1, []), chat=True) for item in items], [i.category for i in items]


def greedy_answers(pair, prompts: list[str] | list[list[int]], max_new_tokens: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the target's greedy answer) for each prompt (text, or ids as they are),
    through the decode loop's AR."""
    from specdemo import generate

    out = []
    for prompt in prompts:
        result = generate(pair, prompt, method=REFERENCE, max_new_tokens=max_new_tokens, temperature=0.0, chat=True)
        out.append((list(result.prompt_ids), list(result.token_ids)))
    return out


def heldout_acceptance(head: FeatureHead, target, answers, gamma: int = 4, copy_n: int = 0,
                       groups: list[str] | None = None) -> dict:
    """Acceptance and tokens per round over all answers; with `groups` (a label per answer, e.g.
    the suite's categories) also per group, under "by_group", to tell which kind of request fails."""
    layers = tuple(head.config.feature_layers)
    replays = [replay_rounds(head, prompt, answer, target_features(target, prompt + answer, layers), gamma, copy_n)
               for prompt, answer in answers]
    report = sum(replays, Replay(0, 0, 0, 0)).report(len(answers), gamma)
    if groups is not None:
        if len(groups) != len(answers):
            raise ValueError(f"{len(groups)} group labels for {len(answers)} answers")
        by_group = {}
        for label in dict.fromkeys(groups):
            members = [r for r, g in zip(replays, groups) if g == label]
            summary = sum(members, Replay(0, 0, 0, 0))
            by_group[label] = {"prompts": len(members), "acceptance": round(summary.acceptance, 4),
                               "tokens_per_round": round(summary.tokens_per_round, 3)}
        report["by_group"] = by_group
    return report


@torch.inference_mode()
def heldout_agreement(head: FeatureHead, target, answers, steps: int = 2) -> dict:
    """Teacher-forced top-1 agreement with the target's greedy token on the held-out answers, per
    draft step, measured as validation agreement is (`eagle.agreement`). Beside the validation
    figure it tells a head that learned its training requests from one that learned the target;
    beside acceptance it tells either from the compounding of a round's steps."""
    from .eagle import Sequence, agreement

    layers = tuple(head.config.feature_layers)
    sequences = [Sequence(torch.tensor(prompt + answer), target_features(target, prompt + answer, layers)[:-1],
                          len(prompt), str(i)) for i, (prompt, answer) in enumerate(answers)]
    lm_head = target.get_output_embeddings().weight.detach()
    return {f"heldout_agreement_step{s + 1}": round(a, 4)
            for s, a in enumerate(agreement(head, sequences, lm_head, steps))}


def outside_subset_share(head: FeatureHead, answers) -> float:
    """The share of answer tokens the head cannot draft at all, being outside its subset: each one
    ends its round's run of accepted drafts, whatever the head predicts."""
    subset = set(head.subset.tolist())
    tokens = [t for _, answer in answers for t in answer]
    return round(sum(t not in subset for t in tokens) / max(1, len(tokens)), 4)


@torch.inference_mode()
def step_cost(head: FeatureHead, target, context: int = 96, calls: int = 60) -> dict:
    """Median seconds of one draft step against one one-token target forward, same thread."""
    from transformers import DynamicCache

    device = target.device
    ids = torch.randint(0, target.config.vocab_size, (1, context), device=device)
    cache = DynamicCache(config=target.config)
    layers = tuple(head.config.feature_layers)
    out = target.get_decoder()(input_ids=ids, cache=cache, use_cache=True, output_hidden_states=bool(layers))
    features = torch.cat([out.hidden_states[i][0] for i in layers] + [out.last_hidden_state[0]], dim=-1).float()
    drafter = FeatureDrafter(head)
    drafter.start(ids[0].tolist(), features[:-1])
    policy, sampling = FixedGamma(1), SamplingConfig(temperature=0.0)
    drafter.propose(ids[0].tolist(), policy, 1, sampling, None)
    # A draft step reads the head's own d-wide prediction, never the fused states.
    step_input = features[-1:, -head.config.hidden_size :]

    def draft_step():
        drafter.cache.rollback(context)
        drafter.q_of(drafter.head_step(step_input, [5], context), sampling).argmax().item()

    def target_step():
        target(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits.argmax().item()
        cache.crop(-1)

    medians = interleaved_medians({"draft_step": draft_step, "target_forward": target_step}, calls, device=device)
    draft, target_time = medians["draft_step"], medians["target_forward"]
    return {"draft_step_ms": round(1000 * draft, 3), "target_forward_ms": round(1000 * target_time, 3),
            "cost_ratio": round(draft / target_time, 4), "threads": torch.get_num_threads(),
            "draft_macs": head.step_macs()}


@torch.inference_mode()
def verification_cost(target, tokens: int = 5, context: int = 96, calls: int = 40) -> float:
    """Median seconds of a `tokens`-token target forward ÷ those of a one-token forward, interleaved.

    Leviathan's speedup formula counts a verification as one forward; on a CPU it is not, and
    a round's real cost is γ draft steps plus this."""
    from transformers import DynamicCache

    ids = torch.randint(0, target.config.vocab_size, (1, context + tokens), device=target.device)
    cache = DynamicCache(config=target.config)
    target(input_ids=ids[:, :context], cache=cache, use_cache=True)

    def forward(width: int):
        def call():
            target(input_ids=ids[:, context : context + width], cache=cache,
                   use_cache=True).logits.argmax(-1).tolist()
            cache.crop(-width)
        return call

    medians = interleaved_medians({1: forward(1), tokens: forward(tokens)}, calls, device=target.device)
    return round(medians[tokens] / medians[1], 3)


def round_speedup(tokens_per_round: float, cost_ratio: float, gamma: int, verify_cost: float,
                  drafted_share: float = 1.0) -> float:
    """Predicted speedup over AR of fixed-γ rounds: new tokens per round ÷ the round's cost in
    one-token target forwards (γ draft steps at `cost_ratio` each in the `drafted_share` of
    rounds the head drafts, not copies; one verification)."""
    return round(tokens_per_round / (gamma * cost_ratio * drafted_share + verify_cost), 3)


def parse_args(argv=None) -> argparse.Namespace:
    import argparse
    from pathlib import Path

    from .corpus import default_dir

    parser = argparse.ArgumentParser(prog="python -m specdemo.training.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("head", nargs="?", help="a folder written by specdemo.training.eagle")
    parser.add_argument("--corpus-table", type=int, metavar="N",
                        help="measure instead an n-gram table (this n) filled with the corpus's answers")
    parser.add_argument("--corpus", type=Path, default=default_dir())
    parser.add_argument("--answers", type=Path,
                        help="a JSON file of held-out (prompt ids, greedy answer) pairs, as the curve caches them; "
                             "written from --prompts when it does not exist yet")
    parser.add_argument("--prompts", default="heldout",
                        help="the requests the answers come from when --answers is not given: heldout (the "
                             "templated held-out prompts), suite (the benchmark's hand-written suite) or a suite "
                             "JSONL file (ours, or Spec-Bench / MT-bench question.jsonl)")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--copy-n", type=int, default=0,
                        help="copy from the context first, as SD's copy_n does (0 = the head alone)")
    parser.add_argument("--subset", type=int, metavar="N",
                        help="draft over N tokens: the head's subset plus the lowest ids it lacks (up to the "
                             "vocabulary), to measure what the subset's limit costs")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if (args.head is None) == (args.corpus_table is None):
        parser.error("give a head folder or --corpus-table N")
    return args


def answers_to_measure(args, pair) -> tuple[list[tuple[list[int], list[int]]], list[str] | None]:
    """The held-out (prompt ids, greedy answer) pairs --answers or --prompts names, and each one's
    category where they are a suite's answers in its order (None otherwise)."""
    suite = None  # (prompt ids, categories) of a suite's requests
    if args.prompts != "heldout":
        from specdemo.bench.suite import DEFAULT_SUITE

        suite = suite_requests(pair, DEFAULT_SUITE if args.prompts == "suite" else args.prompts)
    if args.answers and args.answers.is_file():
        answers = [tuple(a) for a in json.loads(args.answers.read_text())]
    elif suite is None:
        answers = greedy_answers(pair, heldout_prompts(), args.max_new_tokens)
    else:
        answers = greedy_answers(pair, suite[0], args.max_new_tokens)
    # Per-category figures only when the answers are those of this suite's requests, in its order.
    groups = suite[1] if suite and [list(p) for p, _ in answers] == suite[0] else None
    if args.answers and not args.answers.is_file():  # computed once, then read by later evaluations
        args.answers.write_text(json.dumps(answers))
    return answers, groups


def corpus_table_report(args, answers) -> dict:
    """NASD's tables, the corpus's answers behind the request's own, replayed on `answers`."""
    from .corpus import Corpus

    corpus = Corpus(args.corpus)
    pairs = []
    for path in corpus.shards():
        shard = corpus.load_shard(path)
        pairs += zip(shard["prefixes"], shard["answers"])
    return {**table_acceptance(corpus_table(pairs, args.corpus_table), answers, args.gamma),
            "corpus_answer_tokens": sum(len(a) for _, a in pairs)}


def head_report(args, target, answers, groups: list[str] | None) -> dict:
    """Acceptance, agreement, the subset's reach, the step and verification costs, and the
    speedup they predict."""
    head = FeatureHead.load(args.head)
    if args.subset:
        head = head.with_subset_size(args.subset)
    head = head.bind(target)
    report = {**heldout_acceptance(head, target, answers, args.gamma, args.copy_n, groups), "copy_n": args.copy_n,
              **heldout_agreement(head, target, answers), "subset_size": head.config.subset_size,
              "outside_subset": outside_subset_share(head, answers), **step_cost(head, target)}
    report["verify_cost"] = verification_cost(target, args.gamma + 1)
    drafted_share = 1.0 - report["copied_rounds"] / max(1, report["rounds"])
    report["predicted_speedup"] = round_speedup(report["tokens_per_round"], report["cost_ratio"], args.gamma,
                                                report["verify_cost"], drafted_share)
    return report


def main(argv=None) -> int:
    from specdemo.models import load_pair

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = load_pair("embedded", draft=None, runtime="torch")
    answers, groups = answers_to_measure(args, pair)
    if args.corpus_table:
        report = corpus_table_report(args, answers)
    else:
        report = head_report(args, pair.target, answers, groups)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__": raise SystemExit(main())
