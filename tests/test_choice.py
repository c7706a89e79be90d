"""The pair a fresh page opens with: the embedded pair unless a GPU and the Hub are there."""

from __future__ import annotations

import pytest

from specdemo.models import choice
from specdemo.models.choice import Machine, choose_preset


@pytest.mark.parametrize("machine,expected", [
    (Machine(None, True), "embedded"),            # no GPU
    (Machine(80.0, False), "embedded"),           # a GPU but no hub
    (Machine(80.0, True), "qwen2.5-7b"),
    (Machine(24.0, True), "qwen2.5-7b"),
    (Machine(16.0, True), "qwen2.5-1.5b"),
    (Machine(6.0, True), "embedded"),             # too small for a hub pair worth showing
])
def test_the_choice_follows_gpu_memory_and_the_hub(machine, expected):
    assert choose_preset(machine) == expected


def test_public_mode_only_opens_with_an_allowed_pair():
    assert choose_preset(Machine(80.0, True), allowed=("embedded", "qwen2.5-1.5b")) == "qwen2.5-1.5b"
    assert choose_preset(Machine(80.0, True), allowed=("embedded",)) == "embedded"


def test_offline_the_hub_is_not_reachable_and_nothing_is_fetched(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert choice.hub_reachable("qwen2.5-1.5b") is False


def test_a_cpu_machine_opens_with_the_embedded_pair(monkeypatch):
    monkeypatch.delenv("SPECDEMO_DEFAULT_PRESET", raising=False)
    monkeypatch.setattr(choice, "detect_machine", lambda candidate="": Machine(None, False))
    assert choice.default_preset() == "embedded"
    monkeypatch.setenv("SPECDEMO_DEFAULT_PRESET", "pythia-1.4b")
    assert choice.default_preset() == "pythia-1.4b"
