"""Benchmark data: references scored with BLEU / chrF / ROUGE, Spec-Bench / MT-bench
question files run turn by turn, Hugging Face datasets, and the baselines in the benchmark."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from specdemo import bench, cli
from specdemo.bench.hub_data import load_hf_suite, parse_hf_source
from specdemo.bench.measure.quality import QUALITY_COLUMNS, reference_scores
from specdemo.bench.suite import MULTI_TURN, SuiteError, conversation, load_suite

pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = [
    {"question_id": 81, "category": "writing", "turns": ["w5 w6 w7", "w9 w10"]},
    {"question_id": 111, "category": "math", "turns": ["w11 w12", "w13 w14 w15"],
     "reference": ["w29 w29 w43", "w43 w43"]},
    {"question_id": 200, "category": "translation", "turns": ["w20 w21 w22"], "reference": "w29 w29 w43 w43"},
]


def write_jsonl(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def model_args(pair):
    return ["--target", pair.target_ref, "--draft", pair.draft_ref, "--device", "cpu", "--dtype", "float64"]


# ---------------------------------------------------------------------------------------
# Reference metrics


def test_scores_come_from_sacrebleu_and_rouge_score():
    perfect = reference_scores("the cat sat on the mat", ["the cat sat on the mat"])
    assert perfect == pytest.approx({name: 100.0 for name in QUALITY_COLUMNS})
    partial = reference_scores("the cat sat on a mat", ["the cat sat on the mat", "a dog ran"])
    assert 0 < partial["bleu"] < 100 and 0 < partial["chrf"] < 100
    assert partial["rouge1"] == pytest.approx(100 * 5 / 6)  # five of six unigrams against the first reference
    assert all(v != v for v in reference_scores("anything", None).values()), "no references: NaN, not 0"


def test_greedy_lossless_methods_score_what_ar_scores_and_beam_shows_its_own(tiny_pair):
    items = [{"prompt": p, "category": "c", "reference": ["w29 w29 w43 w43 w43", "w40 w29"]}
             for p in ("w5 w6 w7 w8", "w9 w10 w11")]
    result = bench.run_benchmark(tiny_pair, items, "ar,sd,nasd,ar-nocache,beam", repeats=1, warmup=False,
                                 max_new_tokens=16)
    rows = result.rows.set_index(["prompt_index", "method"])
    for index in (0, 1):
        ar = rows.loc[(index, "ar"), QUALITY_COLUMNS]
        for method in ("sd", "nasd", "ar-nocache"):
            assert rows.loc[(index, method), QUALITY_COLUMNS].tolist() == ar.tolist()
    assert result.rows[QUALITY_COLUMNS].notna().all().all()
    beam = result.rows[result.rows.method == "beam"]
    assert beam.matches_ar.isna().all(), "beam search owes AR nothing: matches_ar is empty, not False"
    assert (beam.text.values != result.rows[result.rows.method == "ar"].text.values).any()
    summary = result.summary.set_index(["category", "method"])
    assert summary.loc[("all", "beam"), "bleu"] != summary.loc[("all", "ar"), "bleu"]
    assert summary.loc[("all", "sd"), "rougeL"] == summary.loc[("all", "ar"), "rougeL"]
    assert "<th>bleu</th>" in bench.report_html(result, plotlyjs="cdn")


def test_sampled_runs_keep_perplexity_and_score_their_own_text(tiny_pair):
    items = [{"prompt": "w5 w6 w7 w8", "category": "c", "reference": "w29 w29 w43 w43"}]
    result = bench.run_benchmark(tiny_pair, items, "ar,sd", repeats=2, warmup=False, max_new_tokens=16,
                                 temperature=1.0, seed=5)
    assert result.rows.perplexity.notna().all() and result.rows.chrf.notna().all()
    assert result.rows.text.nunique() > 1


# ---------------------------------------------------------------------------------------
# Spec-Bench / MT-bench question files


def test_question_files_are_read_by_their_content(tmp_path):
    path = write_jsonl(tmp_path / "whatever.txt", QUESTIONS)
    suite = load_suite(path)
    assert [p.id for p in suite] == ["81", "111", "200"]
    assert [p.category for p in suite] == ["writing", "math", "translation"]
    assert suite[0].turn_count == 2 and suite[2].turn_count == 1
    assert suite[1].references_for(2) == ("w43 w43",) and suite[0].references_for(1) == ()
    assert suite[2].references_for(1) == ("w29 w29 w43 w43",)
    grouped = load_suite(path, category_map="mt-bench")
    assert [p.category for p in grouped] == [MULTI_TURN, MULTI_TURN, "translation"]
    renamed = load_suite(path, category_map="translation=mt,math=maths")
    assert [p.category for p in renamed] == ["writing", "maths", "mt"]


def test_the_second_turn_carries_the_methods_own_first_answer(tmp_path):
    item = load_suite(write_jsonl(tmp_path / "q.jsonl", QUESTIONS))[0]
    second = conversation(item, 2, ["my answer"])
    assert second.messages == (("user", "w5 w6 w7"), ("assistant", "my answer"), ("user", "w9 w10"))
    with pytest.raises(ValueError, match="needs the answers"):
        conversation(item, 2, [])


@pytest.mark.parametrize("line, message", [
    ({"question_id": 1, "category": "writing", "turns": []}, "'turns' must be a list of non-empty strings"),
    ({"category": "writing", "turns": ["w5"]}, "needs a 'question_id'"),
    ({"question_id": 1, "category": "math", "turns": ["w5", "w6"], "reference": ["w7"]}, "one entry per turn"),
    ({"prompt": "w5", "category": "c", "reference": 3}, "'reference' must be a string or a list of strings"),
])
def test_bad_question_lines_fail_clearly(tmp_path, line, message):
    with pytest.raises(SuiteError, match=message):
        load_suite(write_jsonl(tmp_path / "q.jsonl", [line]))


def test_bad_category_maps_fail_clearly(tmp_path):
    with pytest.raises(SuiteError, match="is not old=new"):
        load_suite(write_jsonl(tmp_path / "q.jsonl", QUESTIONS), category_map="writing")


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "transcript"])
def test_two_turn_questions_run_turn_by_turn_and_greedy_methods_equal_ar_on_both(tiny_pair, tmp_path, chat):
    suite = load_suite(write_jsonl(tmp_path / "q.jsonl", QUESTIONS[:2]), category_map="mt-bench")
    result = bench.run_benchmark(tiny_pair, suite, "ar,sd,egag,ar-nocache,beam", repeats=1, warmup=False,
                                 max_new_tokens=10, chat=chat)
    rows = result.rows
    assert (rows.error == "").all()
    assert sorted(rows.turn.unique()) == [1, 2] and len(rows) == 2 * 2 * 5
    assert set(rows.category) == {MULTI_TURN}
    lossless = rows[rows.method.isin(["sd", "egag", "ar-nocache"])]
    assert lossless.matches_ar.astype(bool).all()
    turn2 = rows[rows.turn == 2].set_index(["prompt_index", "method"])
    # Turn 2's prompt holds each method's own answer: beam's differs from AR's, so its prompt does too.
    for index in (0, 1):
        assert turn2.loc[(index, "sd"), "prompt_tokens"] == turn2.loc[(index, "ar"), "prompt_tokens"]
    turn1 = rows[rows.turn == 1].set_index(["prompt_index", "method"])
    assert (turn2.prompt_tokens > turn1.prompt_tokens).all()
    # Turn 2 of question 111 is scored against its own reference.
    math_turn2 = rows[(rows.prompt_id == "111") & (rows.turn == 2)]
    assert math_turn2.bleu.notna().all() and rows[rows.prompt_id == "81"].bleu.isna().all()


def test_bench_command_reads_a_question_file_and_writes_turns_and_scores(tiny_pair, tmp_path, capsys):
    suite = write_jsonl(tmp_path / "question.jsonl", QUESTIONS)
    csv = tmp_path / "rows.csv"
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--category-map", "mt-bench",
                     "--methods", "ar,sd,beam,draft,ar-nocache", "--max-new-tokens", "8", "--repeats", "1",
                     "--no-warmup", "--csv", str(csv), "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    rows = pd.read_csv(csv)
    assert list(rows.columns) == bench.ROW_COLUMNS
    assert set(rows.turn) == {1, 2} and set(rows.category) == {MULTI_TURN, "translation"}
    assert rows[rows.method.isin(["beam", "draft"])].matches_ar.isna().all()
    summary = pd.read_csv(tmp_path / "rows.summary.csv")
    assert {"bleu", "chrf", "rouge1", "rouge2", "rougeL"} <= set(summary.columns)
    assert summary[(summary.category == "translation") & (summary.method == "ar")].bleu.notna().all()
    assert "bleu" in out.out.splitlines()[0]


def test_bench_caps_ar_without_a_cache_and_says_so(tiny_pair, tmp_path, capsys):
    suite = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "w5 w6", "category": "c"}])
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", str(suite), "--methods", "ar,ar-nocache",
                     "--max-new-tokens", "140", "--repeats", "1", "--no-warmup", "--quiet"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "note: AR (no cache) stops at 128 new tokens (asked for 140)" in out.out


def test_bench_refuses_the_draft_alone_for_a_feature_head(tiny_pair):
    from tests.test_feature_drafter import with_head

    head = with_head(tiny_pair, list(range(0, 64, 2)))
    with pytest.raises(ValueError, match="feature head"):
        bench.run_benchmark(head, [{"prompt": "w5", "category": "c"}], "ar,draft", repeats=1, warmup=False)


# ---------------------------------------------------------------------------------------
# Hugging Face datasets (a local dataset the test writes, read by the same code as the Hub's)


@pytest.fixture(scope="module")
def translation_dataset(tmp_path_factory):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path_factory.mktemp("hf") / "wmt-mini"
    rows = {"translation": [{"de": f"w{5 + i} w{6 + i} w{7 + i}", "en": f"w29 w{40 + i}"} for i in range(5)]}
    datasets.DatasetDict({"validation": datasets.Dataset.from_dict(rows)}).save_to_disk(str(folder))
    return folder


def test_hf_sources_are_parsed():
    assert parse_hf_source("hf:wmt16:de-en:validation") == ("wmt16", "de-en", "validation")
    assert parse_hf_source("hf:abisee/cnn_dailymail:test") == ("abisee/cnn_dailymail", None, "test")
    with pytest.raises(SuiteError, match="hf:DATASET:SPLIT"):
        parse_hf_source("hf:wmt16")


def test_a_saved_dataset_becomes_a_suite_with_references(translation_dataset):
    suite = load_hf_suite(f"hf:{translation_dataset}:validation", "translation.de", "translation.en",
                          template="Translate: {prompt}", limit=3)
    assert len(suite) == 3 and suite[0].prompt == "Translate: w5 w6 w7"
    assert suite[0].references_for(1) == ("w29 w40",) and suite[0].category == "wmt-mini"
    with pytest.raises(SuiteError, match="no split 'test'"):
        load_hf_suite(f"hf:{translation_dataset}:test", "translation.de")
    with pytest.raises(SuiteError, match="no field 'translation.fr'"):
        load_hf_suite(f"hf:{translation_dataset}:validation", "translation.fr")
    with pytest.raises(SuiteError, match="must contain \\{prompt\\}"):
        load_hf_suite(f"hf:{translation_dataset}:validation", "translation.de", template="Translate")


def test_json_files_load_through_load_dataset_and_continuations_are_cut(tmp_path):
    pytest.importorskip("datasets")
    folder = tmp_path / "wiki"
    folder.mkdir()
    lines = ["", " = Heading = ", " ".join(f"w{i}" for i in range(3, 40)), " ".join(f"w{i}" for i in range(3, 30))]
    (folder / "test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    suite = load_hf_suite(f"hf:{folder}:test", "text", prompt_words=(20, 25))
    assert len(suite) == 2
    assert suite[0].prompt.split() == [f"w{i}" for i in range(3, 28)]
    assert suite[0].references_for(1) == (" ".join(f"w{i}" for i in range(28, 40)),)


def test_an_unreachable_hub_dataset_says_it_is_offline(monkeypatch):
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SuiteError, match="cannot be reached \\(offline\\)"):
        load_hf_suite("hf:specdemo-no-such-owner/no-such-dataset:test", "text")


def test_bench_command_runs_an_hf_suite(tiny_pair, translation_dataset, tmp_path, capsys):
    csv = tmp_path / "rows.csv"
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", f"hf:{translation_dataset}:validation",
                     "--prompt-field", "translation.de", "--reference-field", "translation.en", "--limit", "2",
                     "--methods", "ar,sd", "--max-new-tokens", "6", "--repeats", "1", "--no-warmup",
                     "--csv", str(csv), "--quiet"])
    assert code == 0, capsys.readouterr().err
    rows = pd.read_csv(csv)
    assert len(rows) == 4 and rows.chrf.notna().all()


def test_hf_flags_without_an_hf_suite_fail_clearly(tiny_pair, capsys):
    code = cli.main(["bench", *model_args(tiny_pair), "--prompt-field", "text", "--quiet"])
    assert code == 2 and "apply to hf:DATASET" in capsys.readouterr().err


def test_continuations_can_be_cut_in_the_pairs_tokens(tiny_pair, tmp_path, capsys):
    pytest.importorskip("datasets")
    folder = tmp_path / "wiki"
    folder.mkdir()
    lines = [" ".join(f"w{i}" for i in range(3, 40)), "w5 w6"]
    (folder / "test.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in lines), encoding="utf-8")
    suite = load_hf_suite(f"hf:{folder}:test", "text", prompt_tokens=(10, 20), tokenizer=tiny_pair.tokenizer)
    assert len(suite) == 1 and suite[0].prompt.split() == [f"w{i}" for i in range(3, 23)]
    assert suite[0].references_for(1) == (" ".join(f"w{i}" for i in range(23, 40)),)
    with pytest.raises(SuiteError, match="needs the pair's tokenizer"):
        load_hf_suite(f"hf:{folder}:test", "text", prompt_tokens=(10, 20))
    csv = tmp_path / "rows.csv"
    code = cli.main(["bench", *model_args(tiny_pair), "--suite", f"hf:{folder}:test", "--prompt-field", "text",
                     "--prompt-tokens", "10:20", "--no-chat", "--methods", "ar,sd", "--max-new-tokens", "6",
                     "--repeats", "1", "--no-warmup", "--csv", str(csv), "--quiet"])
    assert code == 0, capsys.readouterr().err
    rows = pd.read_csv(csv)
    assert (rows.prompt_tokens == 20).all() and rows.chrf.notna().all()
    code = cli.main(["bench", *model_args(tiny_pair), "--prompt-tokens", "10:20", "--quiet"])
    assert code == 2 and "--prompt-tokens applies to hf:" in capsys.readouterr().err
