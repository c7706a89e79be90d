"""specdemo.engine.pair: what a pair and its writers declare to the decode loop, which reads nothing else."""

import typing

import pytest

from specdemo.engine.pair import Pair
from specdemo.engine.runtimes.onnx_lm import OnnxCachedLM, TORCH_THREADS_BETWEEN_FORWARDS
from specdemo.engine.targets.lm import CachedLM
from specdemo.engine.targets.nocache import EncoderDecoderRecomputingLM, RecomputingLM
from specdemo.engine.targets.seq2seq import EncoderDecoderLM


def declared_names(cls) -> set[str]:
    hints = set(typing.get_type_hints(cls, include_extras=False)) - {"return"}
    members = {name for name in vars(cls) if not name.startswith("_")}
    return hints | members


def test_a_loaded_pair_declares_everything_the_loop_reads(tiny_pair):
    missing = sorted(name for name in declared_names(Pair) if not hasattr(type(tiny_pair), name)
                     and name not in vars(tiny_pair))
    assert not missing, f"ModelPair does not declare {missing}"
    assert isinstance(tiny_pair, Pair)
    assert (tiny_pair.runtime, tiny_pair.target_runtime, tiny_pair.draft_runtime) == ("torch", None, None)
    assert isinstance(tiny_pair.exactness, str) and tiny_pair.exactness


def test_an_object_missing_a_declaration_is_not_a_pair(tiny_pair):
    class Undeclared:
        target, draft, tokenizer = tiny_pair.target, tiny_pair.draft, tiny_pair.tokenizer

    assert not isinstance(Undeclared(), Pair)


@pytest.mark.parametrize("writer", [CachedLM, EncoderDecoderLM, RecomputingLM, EncoderDecoderRecomputingLM])
def test_every_torch_writer_declares_it_leaves_torch_threads_as_they_are(writer):
    assert writer.torch_threads is None


def test_a_runtime_writer_declares_torch_threads_for_the_work_between_its_forwards():
    assert OnnxCachedLM.torch_threads == TORCH_THREADS_BETWEEN_FORWARDS == 1
