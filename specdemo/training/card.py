"""The model card of the packaged feature head, written from the learning curve's numbers.

    python -m specdemo.training.card SUMMARY.json CARD.md

`write_card(path, summary)` renders a Hugging Face model card (YAML front matter, then what it is,
intended use, training data, training procedure, evaluation, limitations, how to reproduce and a
short changelog of earlier heads) from the summary that `curve.py` writes as `curve.json`. Every figure in the card
comes from that summary, so the card is regenerated, never edited: the shipped head keeps its
summary beside the card as `card.json`, and `install_card` writes both, carrying the changelog
of the head it replaces forward.

The summary's required keys are the ones `curve.py` writes (curve, previous_draft_lm, corpus,
held_out_prompts, gamma, max_new_tokens, verify_cost, extrapolation, machine, command). Optional:
candidates, passages, notes, data_note, hand_written (the shipped head on the benchmark suite:
prompts, acceptance, tokens_per_round, agreement_step1/2), installed (the shipped head's point when it is not the
curve's last one, with `continued_from` naming its earlier stages), reproduce (command lines),
changelog (one line per earlier head).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"
GOAL_ACCEPTANCE = 0.40  # what a well-trained draft reaches; the curve reads the data it would take


def _front_matter() -> str:
    return f"""---
library_name: specdemo
license: apache-2.0
base_model: {TARGET}
language:
- en
tags:
- speculative-decoding
- eagle
- draft-model
- feature-head
- smollm2
---"""


def _table(rows: list[dict]) -> str:
    lines = ["| training answer tokens | requests | epochs | held-out acceptance | tokens per round | "
             "teacher-forced agreement (step 1 / 2) | draft step ÷ target forward | predicted SD ÷ AR |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        predicted = r.get("predicted_speedup")
        epochs = r.get("epochs_run")
        if epochs is None or epochs != epochs:  # points measured before runs recorded the epochs they ran
            epochs = r["epochs"]
        lines.append(
            f"| {r['train_answer_tokens']:,} | {r['train_requests']:,} | {epochs:g} | {r['acceptance']:.3f} | "
            f"{r['tokens_per_round']:.2f} | {r['validation_agreement_step1']:.3f} / {r['validation_agreement_step2']:.3f} | "
            f"{r['cost_ratio']:.3f} | {_times(predicted)} |")
    return "\n".join(lines)


def _times(value) -> str:
    return "–" if value is None or value != value else f"{value:.2f}×"


def _ratio(value) -> str:
    """A step-cost ratio, or a dash for a candidate whose steps were not clocked on their own."""
    return "–" if value is None else f"{value:.3f}"


def _candidates(summary: dict) -> str:
    """Other drafts measured on the same held-out answers, as a table (nothing if none)."""
    points = summary.get("candidates") or []
    if not points:
        return ""
    lines = ["Other candidates, measured on the same held-out answers and the same cost clock:", "",
             "| candidate | training answer tokens | held-out acceptance | tokens per round | "
             "teacher-forced agreement | draft step ÷ target forward | predicted SD ÷ AR |",
             "|---|---|---|---|---|---|---|"]
    for c in points:
        agreement = c.get("validation_agreement", c.get("validation_agreement_step1"))
        lines.append(f"| {c['name']} | {c['train_answer_tokens']:,} | {c['acceptance']:.3f} | "
                     f"{c['tokens_per_round']:.2f} | {'' if agreement is None else f'{agreement:.3f}'} | "
                     f"{_ratio(c.get('cost_ratio'))} | {_times(c.get('predicted_speedup'))} |")
    return "\n".join(lines) + "\n"


def _size(count: int) -> str:
    return f"{count / 1e6:.0f} M" if count >= 1e6 else f"{count / 1e3:.0f} k"


def _reading(summary: dict) -> str:
    """What the curve says about the data a goal needs, in words."""
    parts = []
    for e in summary.get("extrapolation", []):
        name = "acceptance" if e["measure"] == "acceptance" else "tokens per round"
        if e.get("by") == "train_requests":
            parts.append(f"against distinct requests, {name} grew by {e['gain_per_doubling']:.3f} per doubling "
                         f"and would reach {e['goal']} at about {_size(e['needed'])} requests")
            continue
        parts.append(f"{name} grew by {e['gain_per_doubling']:.3f} per doubling of the training tokens and would "
                     f"reach {e['goal']} at about {_size(e['tokens_needed'])} tokens")
    if not parts:
        return "The curve has too few sizes (or does not rise) to read a trend from."
    return ("Read as a straight line in log-tokens: " + "; ".join(parts)
            + ". If the curve bends down, as learning curves usually do, the goal needs more than that.")


def _hardware(machine: dict) -> str:
    cores = f"{machine['cores']}-core " if machine.get("cores") else ""
    threads = machine.get("threads", 1)
    trained = machine.get("train_threads", threads)
    training = f", the last slice trained on {trained} threads" if trained != threads else ""
    return (f"{cores}{machine['cpu']}, costs on {threads} thread{'s' if threads != 1 else ''}{training}, "
            f"torch {machine['torch']}, Python {machine['python']}")


def _read_text(summary: dict) -> str:
    """What outside text the head read besides the answers (passages.py), and under which licences."""
    passages = summary.get("passages")
    if not passages:
        return "No text from outside the target was used."
    sources = ", ".join(f"{name} ({licence})" for name, licence in sorted(passages.get("sources", {}).items()))
    return (f"Besides the answers, the head trained on {passages['answer_tokens']:,} tokens of {passages['sequences']:,} "
            f"passages that the target read rather than wrote (`python -m specdemo.training.passages`): "
            f"docstrings and help topics, each set as the assistant's turn of a request about its subject. "
            f"Sources and the licences their metadata declares: {sources}.")


def _installed(summary: dict) -> dict:
    """The shipped head's point: given explicitly when it continued an earlier head, else the curve's last."""
    return summary.get("installed") or summary["curve"][-1]


def _reads(head: dict) -> str:
    """What the head reads at position j: the final state alone, or fused layers (EAGLE-3)."""
    layers = head.get("feature_layers")
    if not layers:
        return "At position j it reads the target's final hidden state f_j and the embedding of\nthe next token."
    names = " and ".join(str(i) for i in layers)
    return ("At position j it reads the target's layers " + names + " beside its final hidden state f_j\n"
            "(fused features, as in EAGLE-3: a linear fusion mixes them into one state) and the embedding\n"
            "of the next token.")


def _what(summary: dict) -> str:
    head = _installed(summary)
    init = "from the target's last layer" if head.get("init") == "target" else "at random"
    return f"""# SmolLM2-135M-Instruct feature head (the embedded pair's draft)

A one-layer feature-level draft head in the style of EAGLE, trained for the target
[{TARGET}](https://huggingface.co/{TARGET}). It is the draft of specdemo's
embedded pair. {_reads(head)} One decoder layer (initialised {init}) predicts the next hidden state, and the
target's own LM head scores it, restricted to the {head['subset_size']:,} most frequent answer
tokens. Its q is a full-vocabulary distribution that is zero outside that subset, so verification
and EGAG's entropy stay exact.

The weights file holds only the head's own weights ({head.get('draft_macs', 0) / 1e6:.1f} M
multiply-adds per drafted token, stored in float16) and the subset's token ids. The embedding and
LM-head rows are read from the loaded target and never stored twice.

| shipped head, held-out (greedy, γ = {summary['gamma']}) | |
|---|---|
| acceptance (accepted ÷ drafted) | {head['acceptance']:.3f} |
| tokens per round | {head['tokens_per_round']:.2f} |
| draft step ÷ one-token target forward | {head['cost_ratio']:.3f} |
| predicted SD ÷ AR on the measuring CPU | {_times(head.get('predicted_speedup'))} |
"""


def _intended_use() -> str:
    return """## Intended use

Drafting for speculative decoding with SmolLM2-135M-Instruct as the target, in specdemo's SD and
EGAG methods. The `embedded` and `embedded-head` presets load it:

```python
import specdemo

pair = specdemo.load_pair("embedded-head")
result = specdemo.generate(pair, "Explain KV caches in two sentences.", method="sd", chat=True)
```

Speculative decoding is lossless, so the head changes how fast the target's tokens come, never
which tokens come. The head is not a language model on its own: it needs the target's hidden
states, embedding and LM head, and it fits no other target.
"""


def _data(summary: dict) -> str:
    corpus = summary["corpus"]
    return f"""## Training data

The target's own answers, written by `python -m specdemo.training.corpus` on a 2-core CPU:
{corpus['distinct_prompts']:,} distinct requests ({corpus['sequences']:,} sequences, {corpus['answer_tokens']:,}
answer tokens). The requests are templated requests over ~200 topics (explanations, lists,
questions, writing, comparisons), arithmetic word problems, code and translation requests, everyday
chat, requests the target wrote itself at temperature 1, and follow-up turns and summaries of
passages it had written in earlier shards. Three shards in four are answered greedily, one in four
sampled at temperature 1. {_read_text(summary)} The held-out prompts
(`specdemo/training/data/heldout_prompts.jsonl`) and their topics are excluded.
{summary.get("data_note", "")}
"""


def _stage(point: dict) -> str:
    parts = [f"{point['train_answer_tokens']:,} answer tokens"]
    if point.get("train_requests"):
        parts.append(f"{point['train_requests']:,} requests")
    if point.get("epochs_run") is not None:
        parts.append(f"{point['epochs_run']:g} epochs")
    if point.get("lr") is not None:
        parts.append(f"learning rate {point['lr']:g}")
    if point.get("train_seconds") is not None:
        parts.append(f"{point['train_seconds'] / 60:.1f} minutes")
    result = (f", held-out acceptance {point['acceptance']:.3f}"
              if point.get("acceptance") is not None else "")
    return f"{point.get('description', 'the shipped head')}: " + ", ".join(parts) + result


def _stages(summary: dict) -> str:
    """The shipped head's training, earliest stage first (a head continued from another lists both)."""
    chain, point = [], _installed(summary)
    while point:
        chain.append(point)
        point = point.get("continued_from")
    if len(chain) == 1:
        return ""
    lines = [f"{i}. {_stage(p)}" for i, p in enumerate(reversed(chain), 1)]
    return "The shipped head was trained in stages, each continuing the one before:\n\n" + "\n".join(lines) + "\n"


def _procedure(summary: dict) -> str:
    head = _installed(summary)
    recipe = [f"{head.get('tokens_per_batch', 1024):,} tokens a batch",
              f"the distribution loss weighted {head.get('cls_weight', 1.0):g}",
              f"feature noise {head.get('noise', 0.05):g}",
              f"{head.get('unroll', 2)} unrolled steps"]
    if head.get("prompt_loss"):
        recipe.append("the requests' own positions included in the loss")
    if head.get("reg_weight") == 0:
        recipe.append("no feature regression (the tokens' distribution only, as EAGLE-3)")
    if head.get("test_time"):
        recipe.append("the unrolled steps attending as drafting does (EAGLE-3's training-time test)")
    if head.get("rejected_weight", 1.0) != 1.0:
        recipe.append(f"positions where the starting head's first draft was rejected weighted "
                      f"{head['rejected_weight']:g} (on-policy)")
    return f"""## Training procedure

`python -m specdemo.training.eagle` (called by `specdemo.training.curve`). Each position j of a
stored sequence is one example: the head reads f_j and the token x_(j+1), and learns the next
hidden state f_(j+1) (smooth L1) and the target's distribution over the vocabulary subset (soft
cross-entropy). A second, unrolled step feeds the head its own prediction in place of f_j, as
drafting does from a round's second token on. Validation holds out whole requests and keeps the
checkpoint with the best teacher-forced agreement. The shipped head's last run: {", ".join(recipe)}.

{_stages(summary)}
{summary.get("notes", "")}

Hardware: {_hardware(summary["machine"])}.
"""


def _evaluation(summary: dict) -> str:
    rows = summary["curve"]
    lm = summary["previous_draft_lm"]
    machine = summary["machine"]
    lm_predicted = f", predicted SD ÷ AR {lm['predicted_speedup']:.2f}×" if lm.get("predicted_speedup") else ""
    return f"""## Evaluation

Held-out: {summary['held_out_prompts']} prompts never seen in training, greedy, γ = {summary['gamma']},
chat template, {summary['max_new_tokens']} new tokens. Rounds are replayed from the decode loop's AR
answers with the real drafter. Cost: the median of interleaved one-token calls on
{machine['threads']} thread(s).

The learning curve (heads trained from a random start on growing slices of the data):

{_table(rows)}

"Predicted SD ÷ AR" is tokens per round ÷ (γ × draft cost + the cost of a {summary['gamma'] + 1}-token
verification forward), with that cost measured on the same machine: {summary.get('verify_cost', float('nan')):.2f}
one-token forwards. Leviathan's formula counts the verification as one forward. On this CPU it is
not, which is why a draft needs far more than one extra token per round before speculative decoding
breaks even here.

{_reading(summary)}

The previous draft (a 4-layer, 8 M-parameter LM trained on {lm['train_answer_tokens']:,} tokens), measured
the same way through the decode loop: acceptance {lm['acceptance']:.3f}, {lm['tokens_per_round']:.2f} tokens per
round, cost ratio {lm['cost_ratio']:.3f}{lm_predicted}. It stays selectable as the `embedded-lm` preset.

{_hand_written(summary)}

{_candidates(summary)}
`curve.csv` beside this file holds the curve's numbers; `curve.html` draws them.
"""


def _hand_written(summary: dict) -> str:
    """The shipped head on requests no template wrote (the benchmark suite), when measured."""
    suite = summary.get("hand_written")
    if not suite:
        return ""
    head = _installed(summary)
    elsewhere = [f"{head['heldout_agreement_step1']:.3f} / {head['heldout_agreement_step2']:.3f} on the held-out prompts"
                 ] if "heldout_agreement_step1" in head else []
    elsewhere.append(f"{head['validation_agreement_step1']:.3f} / {head['validation_agreement_step2']:.3f} on its "
                     "validation requests")
    return (f"On the benchmark suite's {suite['prompts']} hand-written requests (`evaluate --prompts suite`), whose\n"
            f"wording no training template produced, the head is accepted {suite['acceptance']:.3f} "
            f"({suite['tokens_per_round']:.2f} tokens\nper round). Its teacher-forced agreement there is "
            f"{suite['agreement_step1']:.3f} / {suite['agreement_step2']:.3f}, against\n" + " and ".join(elsewhere) + ".")


def _limitations(summary: dict) -> str:
    head = _installed(summary)
    return f"""## Limitations

- It fits one target. It reads SmolLM2-135M-Instruct's hidden states and uses its embedding and LM
  head, so it cannot draft for another model.
- Its held-out acceptance, {head['acceptance']:.3f}, is below the {GOAL_ACCEPTANCE:.2f} that a
  well-trained draft reaches. The curve above says how much more data that would take.
- It drafts only the {head['subset_size']:,} most frequent answer tokens; any other token is
  always the target's.
- The training requests are English and follow templates close to the held-out prompts. {_far_text(summary)}
- Costs and predicted speedups were measured on a 2-core x86-64 CPU. On a GPU, where a 135 M target
  is bound by kernel launches, the balance differs.
"""


def _far_text(summary: dict) -> str:
    suite = summary.get("hand_written")
    if not suite:
        return "Text far\n  from them (other languages, long documents) has not been measured."
    return (f"On hand-written\n  requests its acceptance falls to {suite['acceptance']:.3f}; other languages "
            "and long documents have not been measured.")


def _reproduce(summary: dict) -> str:
    lines = summary.get("reproduce") or [
        "python -m specdemo.training.corpus --threads 1 --self-instruct 600 --workers 2 --worker 0 &   # one process per core;",
        "python -m specdemo.training.corpus --threads 1 --self-instruct 600 --workers 2 --worker 1     # stop and rerun at will",
        *(["python -m specdemo.training.passages --threads 2 --minutes 38   # the read text (resumable too)"]
          if summary.get("passages") else []),
        summary["command"],
    ]
    return "## How to reproduce\n\n```bash\n" + "\n".join(lines) + "\n```\n"


def _changelog(summary: dict) -> str:
    entries = summary.get("changelog") or []
    if not entries:
        return ""
    return "## Changelog\n\n" + "\n".join(f"- {entry}" for entry in entries) + "\n"


def render_card(summary: dict) -> str:
    sections = [_front_matter(), _what(summary), _intended_use(), _data(summary), _procedure(summary),
                _evaluation(summary), _limitations(summary), _reproduce(summary), _changelog(summary)]
    text = "\n".join(section.strip() + "\n" for section in sections if section)
    while "\n\n\n" in text:  # optional paragraphs left out leave no gaps
        text = text.replace("\n\n\n", "\n\n")
    return text


def write_card(path: Path, summary: dict) -> None:
    Path(path).write_text(render_card(summary), encoding="utf-8")


def earlier_heads(previous: dict) -> list[str]:
    """The changelog of a card whose head replaces `previous`'s: that head first, then its changelog."""
    head = _installed(previous)
    what = head.get("description") or f"trained on {head['train_answer_tokens']:,} answer tokens"
    return [f"{head['acceptance']:.3f} acceptance, {head['tokens_per_round']:.2f} tokens per round: {what}.",
            *previous.get("changelog", [])]


def install_card(folder: Path, summary: dict, replaces: dict | None = None) -> None:
    """The card and the summary it came from, so that the card can be regenerated as it is.
    replaces: the summary of the head this one replaces, which heads the new card's changelog."""
    folder = Path(folder)
    if replaces is not None and not summary.get("changelog"):
        summary = {**summary, "changelog": earlier_heads(replaces)}
    (folder / "card.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    write_card(folder / "README.md", summary)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m specdemo.training.card SUMMARY.json CARD.md", file=sys.stderr)
        return 2
    write_card(Path(args[1]), json.loads(Path(args[0]).read_text(encoding="utf-8")))
    return 0


if __name__ == "__main__": raise SystemExit(main())
