"""What the command line decides before it loads a model."""

from __future__ import annotations

import argparse

from specdemo.cli.common import default_chat
from specdemo.models.loading import EMBEDDED, EMBEDDED_HEAD, EMBEDDED_LM


def args(pair=None, target=None):
    return argparse.Namespace(pair=pair, target=target)


def test_the_chat_template_is_on_for_every_pair_around_the_embedded_instruct_target():
    # The same target, so the same prompt ids: the LM-draft pair's AR must equal the head pair's.
    for pair in (None, EMBEDDED, EMBEDDED_LM, EMBEDDED_HEAD):
        assert default_chat(args(pair)), pair


def test_the_chat_template_is_off_by_default_for_other_models():
    assert not default_chat(args("pythia-1.4b"))
    assert not default_chat(args(target="some/base-model"))
    assert not default_chat(args("no-such-preset"))
