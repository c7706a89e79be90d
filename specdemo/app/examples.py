"""Prompts for the page's examples: one per kind of text, since acceptance depends on it
(code and summaries repeat the prompt, so n-gram drafts do well; open chat does not).

Translation and summarisation are also what encoder-decoder models are made for: those
examples come a second time with the encoder-decoder preset that suits them, worded as
that model was trained to read them (T5's task prefix; BART-CNN's bare article)."""

from __future__ import annotations

PASSAGE = """\
Lighthouses were once among the most carefully staffed buildings in any country. Before \
electric lamps and automatic timers, a keeper had to climb the tower several times a night \
to trim the wick, wind the clockwork that turned the lens, and wipe soot from the glass. A \
light that went dark for even an hour could send a ship onto the rocks, so logbooks recorded \
every change in the weather and every hour the lamp burned. Keepers and their families often \
lived on islands that supply boats reached only when the sea allowed, sometimes weeks apart.

The great advance of the nineteenth century was the Fresnel lens. Instead of one heavy curved \
glass, it used rings of prisms arranged around the flame, bending light that would have escaped \
upwards or downwards into a single horizontal beam. A modest oil lamp behind such a lens could \
be seen more than twenty miles out to sea. Each lighthouse was also given its own pattern of \
flashes, so that a navigator who counted the seconds between them knew exactly which coast was \
ahead.

In the twentieth century electricity, radio beacons and finally satellite navigation made the \
keeper's work less necessary. Most lights were automated between the 1960s and the 1990s, and \
many towers now run unattended, checked by a technician a few times a year. Some have become \
museums or guest houses; others have been sold because ships no longer need them. Yet sailors \
still value a visible light when electronics fail, and many coastal communities regard their \
lighthouse as part of their identity, raising money to keep the old towers painted and lit."""

EXAMPLES: list[tuple[str, str]] = [
    ("Chat", "What are three simple ways to sleep better? Answer in a short list."),
    ("Summarise", f"Summarise the following passage in three sentences.\n\n{PASSAGE}"),
    ("Code", "Write a Python function `is_prime(n)` that returns True when n is a prime number, "
             "with a docstring and two examples."),
    ("Translate", "Translate into French: The library opens at nine in the morning and closes at six "
                  "in the evening, except on Sundays."),
    ("Maths", "A train travels 180 km in 2 hours and then 120 km in 1.5 hours. What is its average speed "
              "over the whole journey? Explain step by step."),
]

DEFAULT_PROMPT = EXAMPLES[0][1]


# (label, prompt, preset): choosing one also picks its preset.
ENCODER_DECODER_EXAMPLES: list[tuple[str, str, str]] = [
    ("Translate · FLAN-T5", "translate English to German: The library opens at nine in the morning and closes "
                            "at six in the evening, except on Sundays.", "flan-t5-large"),
    ("Summarise · FLAN-T5", f"summarize: {PASSAGE}", "flan-t5-large"),
    ("Summarise · BART-CNN", PASSAGE, "bart-large-cnn"),
]


def encoder_decoder_examples(served) -> list[tuple[str, str, str]]:
    """The encoder-decoder examples whose preset this page serves (a mapping or names)."""
    return [example for example in ENCODER_DECODER_EXAMPLES if example[2] in served]
