"""Encoder-decoder pairs on the page: their examples pick their pair, chat is set aside for them,
and a comparison through the page's handler runs every method losslessly."""

import pytest

from specdemo.app.examples import ENCODER_DECODER_EXAMPLES, encoder_decoder_examples
from specdemo.app.handlers import compare, make_request
from specdemo.models.loading import PRESETS, Preset
from tests.tiny import build_tiny_seq2seq_pair


@pytest.fixture(scope="module")
def t5_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("page-t5")
    build_tiny_seq2seq_pair(root, "t5")
    return str(root / "target"), str(root / "draft")


def test_every_encoder_decoder_example_names_an_encoder_decoder_preset():
    for _, _, name in ENCODER_DECODER_EXAMPLES:
        assert PRESETS[name].encoder_decoder
    assert {name for _, _, name in ENCODER_DECODER_EXAMPLES} == {"flan-t5-large", "bart-large-cnn"}
    assert encoder_decoder_examples({"embedded": None}) == []  # a page that serves neither shows none


def test_a_comparison_on_an_encoder_decoder_pair_ignores_chat_and_matches_ar(t5_folders):
    target, draft = t5_folders
    presets = {"tiny-t5": Preset("tiny-t5", target, draft, encoder_decoder=True)}
    request = make_request("w5 w6 w7 w8", "tiny-t5", "", "", {"max_new_tokens": 16, "chat": True, "temperature": 0},
                           presets, methods="ar,sd,nasd,egag")
    from specdemo import load_pair

    outcome = compare(request, lambda r: load_pair(r.target, r.draft, device="cpu", dtype="float64"),
                      gpu=lambda fn: fn)
    assert "without a chat template" in request.note and not request.params.chat
    assert len(set(outcome.texts.values())) == 1 and outcome.texts["ar"]


def test_the_page_offers_the_encoder_decoder_examples_with_their_presets(t5_folders):
    from specdemo.app.ui import build_demo

    target, draft = t5_folders
    presets = {name: Preset(name, target, draft, encoder_decoder=True) for name in ("flan-t5-large", "bart-large-cnn")}
    demo = build_demo(presets=presets)
    labels = [c.get("props", {}).get("sample_labels") for c in demo.config["components"]]
    assert [label for label, _, _ in ENCODER_DECODER_EXAMPLES] in labels
