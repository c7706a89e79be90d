"""Tiny random models built on the spot: no hub, no downloads."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
import torch

# Tiny models gain nothing from threads, and on a shared 2-core machine threads fight.
torch.set_num_threads(1)

from tests.tiny import build_tiny_pair


@pytest.fixture
def one_thread():
    """One thread for this test (timed or counted runs), the previous count restored after it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """A 64-token-vocab Llama target and a smaller draft, saved and loaded back through load_pair."""
    return build_tiny_pair(tmp_path_factory.mktemp("tiny"), draft_noise=0.3)
