"""specdemo.app.limits: what a public deployment refuses."""

import pytest

import specdemo
from specdemo.app.limits import Limits


def test_public_mode_is_on_for_a_space_and_reads_its_allow_list(monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/specdemo")
    monkeypatch.setenv("SPECDEMO_ALLOWED_PRESETS", "embedded, qwen2.5-1.5b")
    limits = Limits.from_env()
    assert limits.public and limits.allowed_presets == ("embedded", "qwen2.5-1.5b")
    assert limits.max_new_tokens == 256


def test_local_runs_are_not_public(monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("SPECDEMO_PUBLIC", raising=False)
    assert not Limits.from_env().public


@pytest.mark.parametrize("target, draft", [("Qwen/Qwen2.5-7B-Instruct", None), ("/etc", None), (None, "./weights")])
def test_public_mode_refuses_typed_model_ids_and_paths(target, draft):
    with pytest.raises(ValueError, match="typed model ids and paths are refused"):
        Limits(public=True, allowed_presets=("embedded",)).check_models("embedded", target, draft)


def test_public_mode_serves_only_allowed_presets():
    limits = Limits(public=True, allowed_presets=("embedded",))
    limits.check_models("embedded")
    with pytest.raises(ValueError, match="not served here"):
        limits.check_models("qwen2.5-7b")
    with pytest.raises(ValueError, match="unknown preset"):
        limits.check_models("gpt-5")


def test_unknown_presets_in_the_environment_are_reported(monkeypatch):
    monkeypatch.setenv("SPECDEMO_PUBLIC", "1")
    monkeypatch.setenv("SPECDEMO_ALLOWED_PRESETS", "embedded,nope")
    with pytest.raises(ValueError, match="nope"):
        Limits.from_env()


def test_caps_apply_to_prompt_and_output_length(tiny_pair):
    limits = Limits(public=True, max_new_tokens=8, max_prompt_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens must be at most 8"):
        specdemo.generate(tiny_pair, "w5", method="ar", limits=limits, max_new_tokens=9)
    with pytest.raises(ValueError, match="prompt is too long"):
        specdemo.generate(tiny_pair, "w5 w6 w7 w8 w9 w10", method="ar", limits=limits, max_new_tokens=4)
    assert len(specdemo.generate(tiny_pair, "w5", method="ar", limits=limits, max_new_tokens=8).token_ids) == 8
