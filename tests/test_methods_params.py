"""Which methods read a parameter is declared once, by each method's registry entry; the schema
declares only what the parameter is, and `DecodeParams` is built from the schema."""

import dataclasses
import pickle

import pytest

from specdemo.cli.common import _flag_help
from specdemo.engine.methods import METHODS, methods_reading, register
from specdemo.engine.params import PARAMS, SCHEMA, DecodeParams, EngineOptions, ENGINE_PARAMS


def test_every_parameter_a_method_declares_is_in_the_schema():
    for method in METHODS.values():
        assert set(method.params) <= set(PARAMS), method.name


def test_a_parameter_is_read_by_the_methods_whose_entries_declare_it():
    for spec in SCHEMA:
        readers = methods_reading(spec.name)
        assert list(readers) == [name for name, method in METHODS.items() if spec.name in method.params]
    assert set(methods_reading("num_beams")) == {"beam"}
    assert {"sd", "egag", "draft"} <= set(methods_reading("draft_kv"))
    assert methods_reading("temperature") == ()  # every method reads it


def test_an_entry_that_reads_an_undeclared_parameter_is_refused():
    entry = dataclasses.replace(METHODS["sd"], name="sd-misspelt", params=("gamma", "gama"))
    with pytest.raises(ValueError, match="gama"):
        register(entry)
    assert "sd-misspelt" not in METHODS


def test_a_flag_names_the_methods_that_read_it():
    assert _flag_help(PARAMS["num_beams"]).startswith("beam: ")
    assert _flag_help(PARAMS["ngram_storage"]).startswith("nasd: ")
    assert _flag_help(PARAMS["temperature"]).startswith(PARAMS["temperature"].help)


def test_decode_params_has_one_field_per_schema_parameter_defaulting_to_it():
    assert [(f.name, f.default) for f in dataclasses.fields(DecodeParams)] == [(p.name, p.default) for p in SCHEMA]
    assert [f.name for f in dataclasses.fields(EngineOptions)] == list(ENGINE_PARAMS)


@pytest.mark.parametrize("value", [DecodeParams(gamma=5, temperature=0.7, seed=3),
                                   EngineOptions(cache="static", compile=True)])
def test_the_schema_dataclasses_are_frozen_hashable_equal_by_value_and_pickle(value):
    again = pickle.loads(pickle.dumps(value))
    assert again == value and hash(again) == hash(value) and type(again) is type(value)
    assert value != type(value)()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, dataclasses.fields(value)[0].name, None)


def test_decode_params_validates_whatever_builds_it():
    with pytest.raises(ValueError, match="gamma"):
        DecodeParams(gamma=0)
    with pytest.raises(ValueError, match="gamma"):
        DecodeParams().replace(gamma=65)
    assert DecodeParams.resolve(DecodeParams(gamma=5), ema="0.5") == DecodeParams(gamma=5, ema=0.5)
    assert DecodeParams().as_dict() == {p.name: p.default for p in SCHEMA}
