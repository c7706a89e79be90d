"""OSD: the head learns between requests of a stream, on a copy, and the outputs stay the target's."""

import pandas as pd
import torch

import specdemo
from specdemo.training.osd import first_last, run_stream, stream_figure, stream_prompts
from specdemo.bench.suite import SuitePrompt
from tests.test_feature_drafter import head_pair, with_head  # noqa: F401 (a fixture)

PROMPTS = [SuitePrompt(f"p{i}", "c", text) for i, text in enumerate(
    ["w5 w6 w7 w8", "w10 w11 w12", "w5 w6 w7 w9", "w20 w21", "w5 w6 w7 w8 w9"])]


def test_the_head_changes_on_a_copy_and_greedy_outputs_stay_ars(head_pair, monkeypatch):  # noqa: F811
    before = [p.detach().clone() for p in head_pair.draft.parameters()]
    outputs = []
    original = specdemo.generate

    def recording(pair, ids, **kw):
        result = original(pair, ids, **kw)
        reference = original(pair, ids, method="ar", max_new_tokens=kw["max_new_tokens"])
        outputs.append(result.token_ids == reference.token_ids)
        return result

    monkeypatch.setattr(specdemo, "generate", recording)
    rows = list(run_stream(head_pair, PROMPTS, adapt=True, lr=1e-2, steps=3, max_new_tokens=12, chat=False))
    assert all(outputs) and len(rows) == len(PROMPTS)
    assert all(r["update_seconds"] > 0 and r["loss"] == r["loss"] for r in rows)
    assert all(torch.equal(a, b) for a, b in zip(before, head_pair.draft.parameters())), "the loaded head is untouched"


def test_a_frozen_stream_never_updates():
    rows = pd.DataFrame([{"run": "frozen", "index": i, "accepted": a, "drafted": 4, "update_seconds": 0.0,
                          "seconds": 1.0, "acceptance": a / 4} for i, a in enumerate([1, 1, 2, 3, 4, 4])])
    table = first_last(rows, window=2)
    assert table.loc[0, "first_2"] == 0.25 and table.loc[0, "last_2"] == 1.0
    assert len(stream_figure(rows, window=2).data) == 2


def test_the_stream_is_the_suite_shuffled():
    prompts = stream_prompts(20, seed=1)
    assert len(prompts) == 20 and len({p.category for p in prompts[:10]}) > 2


def test_the_distribution_terms_weight_reaches_the_loss(head_pair):  # noqa: F811
    def first_loss(cls_weight: float) -> float:
        (row,) = run_stream(head_pair, PROMPTS[:1], adapt=True, lr=1e-3, steps=1, max_new_tokens=6, chat=False,
                            cls_weight=cls_weight)
        return row["loss"]

    # The regression term alone, then with the distribution term on top: the same request, another loss.
    assert first_loss(0.0) < first_loss(1.0)
