"""The learning curve's reading: gain per doubling of the data and the data a goal needs."""

from specdemo.training.curve import extrapolate


def point(tokens, acceptance):
    return {"train_answer_tokens": tokens, "acceptance": acceptance}


def test_a_line_in_log_tokens_names_the_tokens_that_reach_the_goal():
    reading = extrapolate([point(1000, 0.10), point(2000, 0.20), point(4000, 0.30)], "acceptance", 0.40)
    assert reading["gain_per_doubling"] == 0.1
    assert abs(reading["tokens_needed"] - 8000) <= 1


def test_no_reading_without_two_sizes_or_without_a_rise():
    assert extrapolate([point(1000, 0.1)], "acceptance", 0.4) is None
    assert extrapolate([point(1000, 0.1), point(1000, 0.2)], "acceptance", 0.4) is None
    assert extrapolate([point(1000, 0.2), point(4000, 0.1)], "acceptance", 0.4) is None


def test_a_round_pays_for_its_drafts_and_a_verification_that_costs_more_than_one_forward():
    from specdemo.training.evaluate import round_speedup

    assert round_speedup(2.0, 0.0, 4, 1.0) == 2.0
    assert round_speedup(2.6, 0.1, 4, 1.766) == round(2.6 / 2.166, 3)
    assert round_speedup(1.55, 0.073, 4, 1.66) < 1  # the embedded pair's head on a CPU: SD loses


def card_row(tokens, acceptance, **extra):
    return {"fraction": 1.0, "train_answer_tokens": tokens, "train_requests": tokens // 100, "epochs": 3.0,
            "acceptance": acceptance, "tokens_per_round": 1 + 4 * acceptance, "validation_agreement_step1": 0.4,
            "validation_agreement_step2": 0.3, "cost_ratio": 0.07, "predicted_speedup": 0.8, "subset_size": 8192,
            "draft_macs": 8.9e6, **extra}


def test_the_card_names_the_epochs_each_point_ran_and_where_it_was_trained(tmp_path):
    from specdemo.training.card import write_card

    rows = [card_row(100_000, 0.15),  # measured before runs recorded the epochs they ran
            card_row(400_000, 0.20, epochs_run=1.75)]
    summary = {"curve": rows, "previous_draft_lm": {"train_answer_tokens": 1, "acceptance": 0.1,
                                                     "tokens_per_round": 1.4, "cost_ratio": 0.1},
               "corpus": {"distinct_prompts": 4000, "sequences": 4001, "answer_tokens": 410_000},
               "held_out_prompts": 37, "gamma": 4, "max_new_tokens": 96, "verify_cost": 1.9,
               "extrapolation": [extrapolate([point(100_000, 0.15), point(400_000, 0.20)], "acceptance", 0.40)],
               "machine": {"cpu": "x86_64", "cores": 2, "threads": 1, "train_threads": 2, "torch": "2", "python": "3"},
               "command": "python -m specdemo.training.curve --fractions 1", "notes": "NOTES", "data_note": "TOOK AN HOUR"}
    card = tmp_path / "README.md"
    write_card(card, summary)
    text = card.read_text()
    assert "| 100,000 | 1,000 | 3 | 0.150 |" in text
    assert "| 400,000 | 4,000 | 1.75 | 0.200 |" in text
    assert "NOTES" in text and "TOOK AN HOUR" in text
    assert "2-core x86_64, costs on 1 thread, the last slice trained on 2 threads" in text
    assert "per doubling" in text and "nan" not in text.lower()


def test_other_candidates_are_tabled_beside_the_head_and_named_by_what_they_keep(tmp_path):
    from specdemo.training.card import write_card
    from specdemo.training.curve import candidate_name, figure

    carved = {"keep": [0, 29], "train_answer_tokens": 48_371, "acceptance": 0.084, "tokens_per_round": 1.33,
              "validation_agreement": 0.271, "cost_ratio": 0.075, "predicted_speedup": 0.6}
    carved["name"] = candidate_name(carved)
    assert carved["name"] == "carved draft (target layers 0, 29)"
    summary = {"curve": [card_row(48_371, 0.101)], "candidates": [carved],
               "previous_draft_lm": {"train_answer_tokens": 1, "acceptance": 0.1, "tokens_per_round": 1.4,
                                     "cost_ratio": 0.1},
               "corpus": {"distinct_prompts": 500, "sequences": 500, "answer_tokens": 50_000},
               "held_out_prompts": 37, "gamma": 4, "max_new_tokens": 96, "verify_cost": 1.9, "extrapolation": [],
               "machine": {"cpu": "x86_64", "threads": 1, "torch": "2", "python": "3"}, "command": "curve"}
    write_card(tmp_path / "README.md", summary)
    assert "| carved draft (target layers 0, 29) | 48,371 | 0.084 | 1.33 | 0.271 | 0.075 | 0.60× |" in (
        tmp_path / "README.md").read_text()
    names = [trace.name for trace in figure(summary["curve"], None, [carved]).data]
    assert "carved draft (target layers 0, 29): acceptance" in names


def test_a_card_without_candidates_has_no_candidate_table(tmp_path):
    from specdemo.training.card import _candidates

    assert _candidates({"candidates": []}) == "" and _candidates({}) == ""


def test_the_card_says_what_outside_text_the_head_read_and_under_which_licences(tmp_path):
    from specdemo.training.card import write_card

    base = {"curve": [card_row(48_371, 0.101)],
            "previous_draft_lm": {"train_answer_tokens": 1, "acceptance": 0.1, "tokens_per_round": 1.4,
                                  "cost_ratio": 0.1},
            "corpus": {"distinct_prompts": 500, "sequences": 500, "answer_tokens": 50_000},
            "held_out_prompts": 37, "gamma": 4, "max_new_tokens": 96, "verify_cost": 1.9, "extrapolation": [],
            "machine": {"cpu": "x86_64", "threads": 1, "torch": "2", "python": "3"}, "command": "curve"}
    write_card(tmp_path / "answers-only.md", base)
    answers_only = (tmp_path / "answers-only.md").read_text()
    assert "No text from outside the target was used." in answers_only
    assert "specdemo.training.passages" not in answers_only

    # A point continued from another head on answers and passages, tabled as a candidate.
    continued = {**card_row(48_371, 0.12), "name": "head continued on answers + passages"}
    read = {**base, "candidates": [{**continued, "predicted_speedup": 0.9}],
            "passages": {"shards": 3, "sequences": 170, "answer_tokens": 40_000, "distinct_prompts": 170,
                         "sources": {"python stdlib": "PSF-2.0", "plotly": "MIT"}}}
    write_card(tmp_path / "read.md", read)
    text = (tmp_path / "read.md").read_text()
    assert "40,000 tokens of 170 passages" in text
    assert "plotly (MIT), python stdlib (PSF-2.0)" in text
    assert "No text from outside" not in text
    assert "python -m specdemo.training.passages" in text
    assert "| head continued on answers + passages | 48,371 | 0.120 | 1.48 | 0.400 |" in text


def minimal_summary(**extra):
    return {"curve": [card_row(48_371, 0.101)],
            "previous_draft_lm": {"train_answer_tokens": 1, "acceptance": 0.1, "tokens_per_round": 1.4,
                                  "cost_ratio": 0.1},
            "corpus": {"distinct_prompts": 500, "sequences": 500, "answer_tokens": 50_000},
            "held_out_prompts": 37, "gamma": 4, "max_new_tokens": 96, "verify_cost": 1.9, "extrapolation": [],
            "machine": {"cpu": "x86_64", "threads": 1, "torch": "2", "python": "3"}, "command": "curve", **extra}


def test_the_card_has_the_hugging_face_shape_front_matter_first_then_its_sections_in_order():
    import yaml

    from specdemo.training.card import render_card

    text = render_card(minimal_summary())
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["library_name"] and front["license"] == "apache-2.0"
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert "speculative-decoding" in front["tags"]
    sections = ["# SmolLM2-135M-Instruct feature head", "## Intended use", "## Training data",
                "## Training procedure", "## Evaluation", "## Limitations", "## How to reproduce"]
    positions = [text.index(s) for s in sections]
    assert positions == sorted(positions)
    assert "| 48,371 | 483 | 3 | 0.101 |" in text.split("## Evaluation")[1]  # the learning curve is evaluation
    assert "## Changelog" not in text and "\n\n\n" not in text


def test_a_continued_head_lists_its_stages_and_earlier_heads_go_to_the_changelog():
    from specdemo.training.card import render_card

    gpu = {"description": "from a random start on a GPU", "train_answer_tokens": 2_000_000, "epochs_run": 5,
           "lr": 1e-3, "train_seconds": 150, "acceptance": 0.29}
    shipped = {**card_row(1_000_000, 0.305), "description": "continued on the CPU corpus", "continued_from": gpu}
    text = render_card(minimal_summary(installed=shipped, changelog=["0.254: the curve's last point."]))
    stages = text.split("## Training procedure")[1].split("## Evaluation")[0]
    assert stages.index("1. from a random start on a GPU: 2,000,000 answer tokens") < stages.index(
        "2. continued on the CPU corpus: 1,000,000 answer tokens")
    assert "| acceptance (accepted ÷ drafted) | 0.305 |" in text  # the shipped head, not the curve's last point
    assert text.rstrip().endswith("## Changelog\n\n- 0.254: the curve's last point.")


def test_the_shipped_card_is_generated_from_the_summary_beside_it():
    import json

    from specdemo.models.embedded import HEAD_DIR
    from specdemo.training.card import render_card

    summary = json.loads((HEAD_DIR / "card.json").read_text(encoding="utf-8"))
    assert (HEAD_DIR / "README.md").read_text(encoding="utf-8") == render_card(summary)


def test_installing_a_head_writes_card_and_summary_and_heads_the_changelog_with_the_head_it_replaced(tmp_path):
    import json

    from specdemo.training.card import install_card, render_card

    old = minimal_summary(installed={**card_row(800_000, 0.254), "description": "the curve's 800 k point"},
                          changelog=["0.101: the first head."])
    install_card(tmp_path, minimal_summary(curve=[card_row(1_600_000, 0.29)]), replaces=old)
    saved = json.loads((tmp_path / "card.json").read_text(encoding="utf-8"))
    assert saved["changelog"] == ["0.254 acceptance, 2.02 tokens per round: the curve's 800 k point.",
                                  "0.101: the first head."]
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == render_card(saved)


def test_a_fused_head_trained_with_the_eagle3_recipe_says_what_it_reads_and_how_it_was_trained():
    from specdemo.training.card import render_card

    fused = {**card_row(200_000, 0.31), "feature_layers": [2, 15], "reg_weight": 0.0, "test_time": True,
             "unroll": 4, "rejected_weight": 3.0}
    text = render_card(minimal_summary(curve=[fused]))
    assert "reads the target's layers 2 and 15 beside its final hidden state" in text
    procedure = text.split("## Training procedure")[1].split("## Evaluation")[0]
    assert "4 unrolled steps" in procedure
    assert "no feature regression" in procedure
    assert "training-time test" in procedure
    assert "weighted 3 (on-policy)" in procedure
    plain = render_card(minimal_summary())
    assert "reads the target's final hidden state f_j" in plain
    assert "training-time test" not in plain and "on-policy" not in plain


def test_the_curve_is_also_read_against_distinct_requests():
    from specdemo.training.card import render_card
    from specdemo.training.curve import figure

    rows = [{**point(100_000, 0.10), "train_requests": 1_000}, {**point(400_000, 0.20), "train_requests": 2_000}]
    reading = extrapolate(rows, "acceptance", 0.40, by="train_requests")
    assert reading["gain_per_doubling"] == 0.1 and reading["by"] == "train_requests"
    assert abs(reading["needed"] - 8_000) <= 1  # doubling the requests twice more
    text = render_card(minimal_summary(extrapolation=[reading]))
    assert "against distinct requests, acceptance grew by 0.100 per doubling and would reach 0.4 at about 8 k requests" in text
    fig = figure([{**r, "tokens_per_round": 1.5} for r in rows], None)
    assert [list(t.x) for t in fig.data if t.xaxis == "x2" and t.name == "feature head: acceptance"] == [[1_000, 2_000]]
    assert fig.layout.xaxis2.title.text == "distinct training requests"


def test_the_card_gives_the_head_on_hand_written_requests_beside_the_held_out_and_validation_agreement():
    from specdemo.training.card import render_card

    shipped = {**card_row(1_000_000, 0.305), "heldout_agreement_step1": 0.624, "heldout_agreement_step2": 0.571}
    suite = {"prompts": 50, "acceptance": 0.175, "tokens_per_round": 1.68, "agreement_step1": 0.47,
             "agreement_step2": 0.399}
    text = render_card(minimal_summary(installed=shipped, hand_written=suite))
    evaluation = text.split("## Evaluation")[1].split("## Limitations")[0]
    assert "50 hand-written requests" in evaluation and "accepted 0.175 (1.68 tokens" in evaluation
    assert "0.470 / 0.399, against\n0.624 / 0.571 on the held-out prompts and" in evaluation
    assert "acceptance falls to 0.175" in text.split("## Limitations")[1]
    without = render_card(minimal_summary())
    assert "hand-written" not in without and "has not been measured" in without


def test_a_candidate_whose_steps_were_not_clocked_alone_shows_dashes_not_a_borrowed_cost():
    from specdemo.training.card import _candidates

    arm = {"name": "EAGLE-3 recipe", "train_answer_tokens": 113_905, "acceptance": 0.2955, "tokens_per_round": 2.148,
           "validation_agreement": 0.678}
    row = _candidates({"candidates": [arm]}).splitlines()[-1]
    assert row == "| EAGLE-3 recipe | 113,905 | 0.295 | 2.15 | 0.678 | – | – |"
