"""The model card of the packaged feature head, written from the learning curve's numbers."""

from __future__ import annotations

from pathlib import Path


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
            f"{r['cost_ratio']:.3f} | {'–' if predicted is None or predicted != predicted else f'{predicted:.2f}×'} |")
    return "\n".join(lines)


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
        lines.append(f"| {c['name']} | {c['train_answer_tokens']:,} | {c['acceptance']:.3f} | "
                     f"{c['tokens_per_round']:.2f} | {c.get('validation_agreement', c.get('validation_agreement_step1')):.3f} | {c['cost_ratio']:.3f} | "
                     f"{c['predicted_speedup']:.2f}× |")
    return "\n".join(lines) + "\n"


def _reading(summary: dict) -> str:
    """What the curve says about the data a goal needs, in words."""
    parts = []
    for e in summary.get("extrapolation", []):
        name = "acceptance" if e["measure"] == "acceptance" else "tokens per round"
        needed = e["tokens_needed"]
        size = f"{needed / 1e6:.0f} M" if needed >= 1e6 else f"{needed / 1e3:.0f} k"
        parts.append(f"{name} grew by {e['gain_per_doubling']:.3f} per doubling of the training tokens and would "
                     f"reach {e['goal']} at about {size} tokens")
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


def write_card(path: Path, summary: dict) -> None:
    rows = summary["curve"]
    last = rows[-1]
    lm = summary["previous_draft_lm"]
    corpus = summary["corpus"]
    machine = summary["machine"]
    text = f"""# SmolLM2-135M-Instruct feature head (the embedded pair's draft)

A one-layer feature-level draft head in the style of EAGLE, trained for the embedded target
SmolLM2-135M-Instruct. At position j it reads the target's final hidden state f_j and the
embedding of the next token, predicts the next hidden state with one decoder layer (initialised
{"from the target's last layer" if last.get("init") == "target" else "at random"}) and scores it with the target's own LM head restricted to the
{last['subset_size']:,} most frequent answer tokens. Its q is a full-vocabulary distribution that is
zero outside that subset, so verification and EGAG's entropy stay exact.

The file holds only the head's own weights ({last.get('draft_macs', 0) / 1e6:.1f} M multiply-adds a
drafted token, stored in float16) and the subset's token ids; the embedding and LM-head rows
are read from the loaded target, never stored twice.

{summary.get("notes", "")}

## Data

The target's own answers, written by `python -m specdemo.training.corpus` on a 2-core CPU:
{corpus['distinct_prompts']:,} distinct requests ({corpus['sequences']:,} sequences, {corpus['answer_tokens']:,}
answer tokens) — templated requests over ~200 topics (explanations, lists, questions, writing, comparisons),
arithmetic word problems, code and translation requests, everyday chat, requests the target wrote itself at
temperature 1, and follow-up turns and summaries of passages it had written in earlier shards. Three shards
in four are greedy, one in four sampled at temperature 1. {_read_text(summary)} The
held-out prompts (`specdemo/training/data/heldout_prompts.jsonl`) and their topics are excluded.
{summary.get("data_note", "")}

## Learning curve

Held-out: {summary['held_out_prompts']} prompts never seen in training, greedy, γ = {summary['gamma']},
chat template, {summary['max_new_tokens']} new tokens; rounds replayed from the decode loop's AR answers with
the real drafter. Cost: median of interleaved one-token calls on {machine['threads']} thread(s).

{_table(rows)}

"Predicted SD ÷ AR" is tokens per round ÷ (γ × draft cost + the cost of a {summary['gamma'] + 1}-token
verification forward), with that cost measured on the same machine: {summary.get('verify_cost', float('nan')):.2f}
one-token forwards. Leviathan's formula counts it as one; on this CPU it is not, which is why a draft
needs far more than one extra token per round before speculative decoding breaks even here.

{_reading(summary)}

The previous draft (a 4-layer, 8 M-parameter LM trained on {lm['train_answer_tokens']:,} tokens), measured the
same way through the decode loop: acceptance {lm['acceptance']:.3f}, {lm['tokens_per_round']:.2f} tokens per round,
cost ratio {lm['cost_ratio']:.3f}{f", predicted SD ÷ AR {lm['predicted_speedup']:.2f}×" if lm.get('predicted_speedup') else ""}. It stays
selectable as the `embedded-lm` preset.

{_candidates(summary)}
`curve.csv` beside this file holds the numbers; `curve.html` (written by the command) draws them.

## Reproduce

```bash
python -m specdemo.training.corpus --threads 1 --self-instruct 600 --workers 2 --worker 0 &   # one process per core;
python -m specdemo.training.corpus --threads 1 --self-instruct 600 --workers 2 --worker 1     # stop and rerun at will
{"python -m specdemo.training.passages --threads 2 --minutes 38   # the read text (resumable too)" + chr(10) if summary.get("passages") else ""}{summary['command']}
```

Hardware: {_hardware(machine)}.
"""
    Path(path).write_text(text)
