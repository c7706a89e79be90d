"""The A/B benchmark's schedule and arithmetic; the workers themselves load the embedded pair (minutes)."""

from __future__ import annotations

import math
import subprocess

import pandas as pd
import pytest

from specdemo.bench import ab
from specdemo.bench.measure.schedule import interleaved, turn_seed


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


def two_prompts_twice(change_factor: dict[int, float]) -> pd.DataFrame:
    """AR at 10 tok/s and SD at 20 on the base; the change's SD scaled by change_factor[prompt]."""
    out = []
    for side in ("base", "change"):
        for prompt in (0, 1, 2):
            for repeat in (0, 1):
                sd = 20.0 * (change_factor[prompt] if side == "change" else 1.0)
                for method, speed in (("ar", 10.0), ("sd", sd)):
                    out.append(dict(side=side, threads=1, method=method, prompt=prompt, repeat=repeat,
                                    tokens_per_s=speed, acceptance_rate=0.5, tokens=[1]))
    return pd.DataFrame(out)


def test_a_change_slower_on_every_prompt_is_called_slower_with_its_interval():
    table = ab.paired(two_prompts_twice({0: 0.9, 1: 0.92, 2: 0.88})).set_index("method")
    assert table.at["sd", "tokens_per_s change ÷ base"] == pytest.approx((0.9 * 0.92 * 0.88) ** (1 / 3))
    assert table.at["sd", "over_ar change ÷ base"] == pytest.approx((0.9 * 0.92 * 0.88) ** (1 / 3))
    assert table.at["sd", "over_ar verdict"] == "slower"
    assert table.at["ar", "tokens_per_s verdict"] == "no difference shown"  # identical on both sides
    assert pd.isna(table.at["ar", "over_ar verdict"])  # AR over AR is 1 by definition


def test_a_change_that_helps_one_prompt_and_hurts_another_shows_no_difference():
    table = ab.paired(two_prompts_twice({0: 1.2, 1: 0.8, 2: 1.0})).set_index("method")
    assert table.at["sd", "over_ar verdict"] == "no difference shown"
    low, high = (float(v) for v in table.at["sd", "over_ar interval"].strip("[]").split(","))
    assert low < 1.0 < high


class FakeWorker:
    started: list[str] = []

    def __init__(self, side: str):
        self.side, self.closed = side, False
        FakeWorker.started.append(side)

    def run(self, **job) -> dict:
        assert not self.closed
        return {"tokens_per_s": 10.0, "acceptance_rate": 0.5, "tokens": [1, 2]}

    def close(self) -> None:
        self.closed = True


def test_each_repeat_runs_on_new_workers_unless_asked_for_one_process():
    def start():
        return {"base": FakeWorker("base"), "change": FakeWorker("change")}

    FakeWorker.started = []
    rows = ab.measure(start, ["p0", "p1"], ["ar", "sd"], [1, 2], repeats=3, max_new_tokens=4)
    assert len(rows) == 2 * 2 * 2 * 2 * 3 and FakeWorker.started.count("base") == 3
    FakeWorker.started = []
    ab.measure(start, ["p0", "p1"], ["ar", "sd"], [1], repeats=3, max_new_tokens=4, fresh=False)
    assert FakeWorker.started == ["base", "change"]


def test_a_difference_that_one_repeats_processes_carry_alone_is_not_called_a_difference():
    rows = two_prompts_twice({0: 1.0, 1: 1.0, 2: 1.0})
    slow = (rows.side == "change") & (rows.method == "sd") & (rows.repeat == 0)
    rows.loc[slow, "tokens_per_s"] *= 0.85  # every prompt of one repeat: that repeat's worker was slow
    table = ab.paired(rows).set_index("method")
    assert table.at["sd", "tokens_per_s change ÷ base"] == pytest.approx(0.85 ** 0.5)
    assert table.at["sd", "tokens_per_s verdict"] == "no difference shown"


def test_one_repeat_gives_no_verdict_however_clear_the_prompts_look():
    rows = two_prompts_twice({0: 0.8, 1: 0.8, 2: 0.8})
    table = ab.paired(rows[rows.repeat == 0]).set_index("method")
    assert table.at["sd", "tokens_per_s change ÷ base"] == pytest.approx(0.8)
    assert table.at["sd", "tokens_per_s verdict"] == ab.ONE_REPEAT
    assert ab.build_parser().parse_args(["--base", "HEAD"]).repeats == 3
