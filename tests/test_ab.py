"""The A/B benchmark's schedule and arithmetic; the workers themselves load the embedded pair (minutes)."""

from __future__ import annotations

import math
import subprocess

import pandas as pd
import pytest

from specdemo.bench import ab
from specdemo.bench.schedule import interleaved, turn_seed


def test_every_contender_runs_once_a_turn_and_the_first_place_rotates():
    turns = list(interleaved(["p0", "p1", "p2"], ["base", "change"], repeats=2))
    assert [(r, i, p) for r, i, p, _ in turns] == [(0, 0, "p0"), (0, 1, "p1"), (0, 2, "p2"),
                                                  (1, 0, "p0"), (1, 1, "p1"), (1, 2, "p2")]
    assert [order for *_, order in turns] == [["base", "change"], ["change", "base"], ["base", "change"],
                                              ["change", "base"], ["base", "change"], ["change", "base"]]
    assert turn_seed(1234, 1, 2) == 2236 and turn_seed(1234, 0, 0) == 1234


def rows() -> pd.DataFrame:
    out = []
    for side, slow in (("base", 1.0), ("change", 0.9)):
        for prompt, (ar, sd) in enumerate([(10.0, 15.0), (12.0, 24.0)]):
            out.append(dict(side=side, threads=1, method="ar", prompt=prompt, repeat=0, tokens_per_s=ar * slow,
                            acceptance_rate=math.nan, tokens=[1, 2, 3]))
            out.append(dict(side=side, threads=1, method="sd", prompt=prompt, repeat=0, tokens_per_s=sd * slow,
                            acceptance_rate=0.5, tokens=[1, 2, 3]))
    return pd.DataFrame(out)


def test_speedups_are_geometric_means_of_per_prompt_ratios_on_each_side():
    table = ab.summarize(rows()).set_index(["side", "method"])
    assert table.at[("base", "sd"), "over_ar"] == pytest.approx(math.sqrt(1.5 * 2.0))
    assert table.at[("change", "sd"), "over_ar"] == pytest.approx(math.sqrt(1.5 * 2.0))
    assert table.at[("change", "ar"), "tokens_per_s"] == pytest.approx(0.9 * 11.0)
    assert table.at[("base", "ar"), "over_ar"] == pytest.approx(1.0)


def test_a_token_written_differently_by_either_side_is_reported():
    same = rows()
    assert ab.same_tokens(same)
    changed = same.copy()
    changed.at[len(changed) - 1, "tokens"] = [1, 2, 4]
    assert not ab.same_tokens(changed)


def test_the_base_is_exported_without_touching_the_working_tree(tmp_path):
    head = subprocess.run(["git", "-C", str(ab.ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    base = ab.export_revision("HEAD", tmp_path)
    assert (base / "specdemo" / "engine" / "decoding.py").is_file() and (base / "app.py").is_file()
    with pytest.raises(SystemExit, match="must include ar"):
        ab.main(["--base", "HEAD", "--methods", "sd"])
