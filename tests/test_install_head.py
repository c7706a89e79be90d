"""The install rule (`python -m specdemo.training.install DIR`): a head replaces the shipped one only
when it is accepted more often on both the held-out prompts and the suite, measured here; then its
card and the README's head table are regenerated. Otherwise nothing changes, and the reason says why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from specdemo.engine.drafters.feature_head import FeatureHead
from specdemo.models.embedded import HEAD_DIR
from specdemo.training.install import README, TABLE_END, TABLE_START, decide, head_table, install
from specdemo.training.generation import answer_batch
from tests.tiny import VOCAB, write_tiny_head

HELDOUT = [[1, 5, 9, 12], [1, 7, 8], [1, 3, 4, 5, 6], [1, 20, 21]]
SUITE = [[1, 30, 31, 32], [1, 40, 41], [1, 11, 13, 17]]


def _figures(heldout: float, suite: float) -> dict:
    return {"heldout": {"acceptance": heldout}, "suite": {"acceptance": suite}}


def test_a_head_is_installed_only_when_better_on_both_sets():
    assert decide(_figures(0.31, 0.18), _figures(0.30, 0.17)) == (
        True, "installed: heldout acceptance 0.3100 > 0.3000 and suite acceptance 0.1800 > 0.1700")
    better, reason = decide(_figures(0.35, 0.17), _figures(0.30, 0.17))
    assert not better and reason == "refused: suite acceptance 0.1700 is not above the shipped head's 0.1700"
    better, reason = decide(_figures(0.20, 0.10), _figures(0.30, 0.17))
    assert not better and reason.count("is not above") == 2


@pytest.fixture
def setting(tmp_path, tiny_pair):
    """A tiny target's greedy answers, a head that drafts and one whose tokens never occur in them,
    a package folder and a README as the install finds them."""
    from transformers import AutoModelForCausalLM

    target_dir = Path(tiny_pair.target.name_or_path)  # the folder the pair was loaded from
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()  # as evaluate measures
    answer_sets = {}
    for name, prefixes in (("heldout", HELDOUT), ("suite", SUITE)):
        answers = answer_batch(target, prefixes, max_new_tokens=12, stops={2}, pad_id=2, features=False)
        answer_sets[name] = [(p, a.tokens) for p, a in zip(prefixes, answers)]
    used = {t for answers in answer_sets.values() for _, a in answers for t in a}
    write_tiny_head(tmp_path / "drafts", target_dir)
    write_tiny_head(tmp_path / "never", target_dir, subset=[t for t in range(VOCAB) if t not in used][:8])
    card = json.loads((HEAD_DIR / "card.json").read_text())
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{TABLE_START}\nold\n{TABLE_END}\n\nafter\n")
    return target, answer_sets, tmp_path, card, readme


def _package(tmp_path, head: str, card: dict):
    folder = tmp_path / "package"
    shutil.copytree(tmp_path / head, folder)
    (folder / "card.json").write_text(json.dumps(card))
    return folder


def _run_dir(tmp_path, head: str, card: dict):
    run = tmp_path / "run"
    shutil.copytree(tmp_path / head, run / "head")
    (run / "card.json").write_text(json.dumps(card))
    (run / "curve.csv").write_text("step,answer_tokens_seen\n1,10\n")
    return run


def test_a_better_head_is_installed_with_its_card_its_curve_and_the_readme_table(setting):
    target, answer_sets, tmp_path, card, readme = setting
    package, run = _package(tmp_path, "never", card), _run_dir(tmp_path, "drafts", card)
    decision = install(run, target, answer_sets, package, readme, log=lambda m: None)
    assert decision["installed"], decision["reason"]
    assert decision["new"]["heldout"]["acceptance"] > decision["shipped"]["heldout"]["acceptance"] == 0
    installed = FeatureHead.load(package)
    assert installed.subset.tolist() == FeatureHead.load(run / "head").subset.tolist()
    assert (package / "curve.csv").read_text() == (run / "curve.csv").read_text()
    summary = json.loads((package / "card.json").read_text())
    assert summary["installed"]["acceptance"] == decision["new"]["heldout"]["acceptance"]
    assert summary["hand_written"]["acceptance"] == decision["new"]["suite"]["acceptance"]
    assert summary["changelog"][0].startswith(f"{card['installed']['acceptance']:.3f} acceptance")
    assert f"{decision['new']['heldout']['acceptance']:.3f}" in (package / "README.md").read_text()
    table = readme.read_text()
    assert "old" not in table and table.endswith("\n\nafter\n")
    assert f"| {decision['new']['suite']['acceptance']:.3f} |" in table
    assert json.loads((run / "install.json").read_text())["installed"] is True


def test_a_head_no_better_is_refused_and_nothing_changes(setting):
    target, answer_sets, tmp_path, card, readme = setting
    package, run = _package(tmp_path, "drafts", card), _run_dir(tmp_path, "drafts", card)
    before = {p.name: p.read_bytes() for p in package.iterdir()}
    readme_before = readme.read_text()
    decision = install(run, target, answer_sets, package, readme, log=lambda m: None)
    assert not decision["installed"]
    assert decision["reason"] == (
        f"refused: heldout acceptance {decision['new']['heldout']['acceptance']:.4f} is not above the shipped "
        f"head's {decision['shipped']['heldout']['acceptance']:.4f}; suite acceptance "
        f"{decision['new']['suite']['acceptance']:.4f} is not above the shipped head's "
        f"{decision['shipped']['suite']['acceptance']:.4f}")
    assert {p.name: p.read_bytes() for p in package.iterdir()} == before
    assert readme.read_text() == readme_before
    assert json.loads((run / "install.json").read_text())["reason"] == decision["reason"]


def test_the_readmes_head_table_is_the_shipped_heads_card():
    card = json.loads((HEAD_DIR / "card.json").read_text())
    assert f"{TABLE_START}\n{head_table(card)}\n{TABLE_END}" in README.read_text()
