"""Quality against references: BLEU and chrF (sacrebleu) and ROUGE-1/2/L (rouge-score).

A suite prompt may carry one reference or several; each run's output text is scored
against all of them, sentence by sentence:
  bleu     sacrebleu's sentence BLEU (exponential smoothing, its default), 0–100
  chrf     sacrebleu's sentence chrF (character 6-grams, β = 2), 0–100
  rouge1, rouge2, rougeL   rouge-score's F-measure with Porter stemming, × 100; with several
           references, the best-matching one (rouge-score's `score_multi`)
A summary averages them over the runs of a (category, method). Runs of a greedy lossless
method produce AR's text and so score exactly what AR scores; beam search, the draft alone
and sampled runs show their own.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence

QUALITY_COLUMNS = ["bleu", "chrf", "rouge1", "rouge2", "rougeL"]
_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(_ROUGE_TYPES), use_stemmer=True)


def reference_scores(hypothesis: str, references: Sequence[str] | None) -> dict[str, float]:
    """The output's scores against its references (NaN for each when there are none)."""
    if not references:
        return {name: math.nan for name in QUALITY_COLUMNS}
    import sacrebleu

    references = list(references)
    rouge = _rouge().score_multi(references, hypothesis)
    return {
        "bleu": sacrebleu.sentence_bleu(hypothesis, references).score,
        "chrf": sacrebleu.sentence_chrf(hypothesis, references).score,
        **{name: 100.0 * rouge[name].fmeasure for name in _ROUGE_TYPES},
    }
