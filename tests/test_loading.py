"""specdemo.models.loading: pairs from local folders, with errors a user understands."""

import httpx
import pytest
import transformers
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

import specdemo
from specdemo.models.loading import ModelLoadError, load_pair
from tests.tiny import write_model, write_tokenizer


def _response(status):
    return httpx.Response(status, request=httpx.Request("GET", "https://huggingface.co/api/models/x"))


def test_a_missing_model_offline_says_so():
    with pytest.raises(ModelLoadError, match="offline"):
        load_pair("no-such-org/no-such-model", device="cpu")


def test_gated_and_unknown_hub_models_get_plain_messages(monkeypatch):
    def raise_(error):
        def fake(*args, **kwargs):
            raise OSError("could not load") from error
        return fake

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        raise_(GatedRepoError("Access to model x is restricted", response=_response(403))))
    with pytest.raises(ModelLoadError, match="gated model: accept its licence"):
        load_pair("meta-llama/Llama-3.2-3B-Instruct", device="cpu")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        raise_(RepositoryNotFoundError("Repository Not Found", response=_response(404))))
    with pytest.raises(ModelLoadError, match="neither a local folder nor a model id"):
        load_pair("someone/typo-model", device="cpu")


def test_a_draft_with_another_tokenizer_is_refused(tmp_path):
    write_model(tmp_path / "target", seed=0, hidden=32, layers=1, vocab=64)
    write_tokenizer(tmp_path / "target", 64)
    write_model(tmp_path / "draft", seed=1, hidden=32, layers=1, vocab=48)
    write_tokenizer(tmp_path / "draft", 48)
    with pytest.raises(ValueError, match="draft tokenizer differs from the target's"):
        load_pair(str(tmp_path / "target"), str(tmp_path / "draft"), device="cpu")


def test_a_draft_with_a_padded_vocabulary_is_compared_on_real_tokens(tmp_path):
    write_model(tmp_path / "target", seed=0, hidden=32, layers=1, vocab=64)
    write_tokenizer(tmp_path / "target", 64)
    write_model(tmp_path / "draft", seed=1, hidden=32, layers=1, vocab=80)  # output layer padded
    pair = load_pair(str(tmp_path / "target"), str(tmp_path / "draft"), device="cpu", dtype="float64")
    assert pair.vocab_size == 64
    reference = specdemo.generate(pair, "w5 w6", method="ar", max_new_tokens=12).token_ids
    assert specdemo.generate(pair, "w5 w6", method="sd", max_new_tokens=12).token_ids == reference


def test_a_target_alone_serves_ar_and_nasd(tmp_path):
    write_model(tmp_path / "target", seed=0, hidden=32, layers=1)
    write_tokenizer(tmp_path / "target")
    pair = load_pair(str(tmp_path / "target"), device="cpu")
    assert pair.draft is None
    assert len(specdemo.generate(pair, "w5 w6", method="nasd", max_new_tokens=5).token_ids) == 5


def test_unknown_dtype_is_refused():
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_pair("embedded", dtype="int3")


def test_presets_name_real_hub_pairs():
    for name, preset in specdemo.PRESETS.items():
        assert preset.target and preset.draft, name
        if preset.target != "embedded":
            assert "/" in preset.target and "/" in preset.draft
