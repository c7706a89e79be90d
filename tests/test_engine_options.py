"""Engine options (cache, compile): declared once, validated once, the same on every front end."""

import argparse

import pandas as pd
import pytest

import specdemo
from specdemo import cli
from specdemo.cli.common import add_decoding_arguments, engine_options
from specdemo.engine.params import COMPILING_NOTE, ENGINE_SCHEMA, SCHEMA, EngineOptions


def test_defaults_coercion_and_the_concrete_cache():
    assert EngineOptions() == EngineOptions(cache="auto", compile=False)
    assert EngineOptions.from_values(cache=None, compile="true") == EngineOptions(compile=True)
    assert EngineOptions().cache_for("cpu") == "dynamic" and EngineOptions().cache_for("cuda") == "static"
    # Compiling needs the static cache, so auto picks it on any device.
    assert EngineOptions(compile=True).cache_for("cpu") == "static"
    assert EngineOptions(cache="static").cache_for("cpu") == "static"
    assert EngineOptions(cache="dynamic").cache_for("cuda") == "dynamic"
    assert EngineOptions(compile=True).as_kwargs() == {"cache": "auto", "compile": True}
    assert EngineOptions(compile=True).first_round_note == COMPILING_NOTE and EngineOptions().first_round_note is None


@pytest.mark.parametrize("values, message", [
    ({"cache": "paged"}, "cache must be one of auto, static, dynamic"),
    ({"compile": "maybe"}, "compile must be true or false"),
    ({"cache": "dynamic", "compile": True}, "compile: graph capture needs the static cache"),
    ({"colour": "red"}, "unknown engine option"),
])
def test_bad_options_say_what_is_allowed(values, message):
    with pytest.raises(ValueError, match=message):
        EngineOptions.from_values(**values)


def test_engine_options_are_apart_from_decoding_parameters():
    # The page builds its controls from these entries: a label, a help text and the choices.
    assert {p.name for p in ENGINE_SCHEMA}.isdisjoint({p.name for p in SCHEMA})
    cache, compile_ = ENGINE_SCHEMA
    assert cache.choices == ("auto", "static", "dynamic") and cache.label and cache.help
    assert compile_.kind is bool and compile_.label and compile_.help


def test_cli_flags_come_from_the_schema():
    parser = argparse.ArgumentParser()
    add_decoding_arguments(parser)
    assert engine_options(parser.parse_args([])) == EngineOptions()
    assert engine_options(parser.parse_args(["--cache", "static", "--compile"])) == EngineOptions("static", True)
    assert engine_options(parser.parse_args(["--no-compile"])) == EngineOptions(compile=False)
    with pytest.raises(SystemExit):
        parser.parse_args(["--cache", "paged"])


def test_api_accepts_auto_and_records_the_cache(tiny_pair):
    result = specdemo.generate(tiny_pair, "w5 w6", method="sd", cache="auto", max_new_tokens=6)
    assert result.cache == "dynamic" and result.compile_seconds == 0.0  # auto on CPU
    stats = specdemo.generate(tiny_pair, "w5 w6", method="sd", cache="static", max_new_tokens=6).stats
    assert stats["cache"] == "static" and stats["compile_seconds"] == 0.0
    assert "compile_seconds" in stats and stats["seconds"] > 0


def test_compare_command_passes_the_engine_options(tiny_pair, tmp_path, capsys):
    csv = tmp_path / "compare.csv"
    code = cli.main(["compare", "--prompt", "w5 w6 w7", "--target", tiny_pair.target_ref, "--draft",
                     tiny_pair.draft_ref, "--device", "cpu", "--dtype", "float64", "--methods", "ar,sd",
                     "--max-new-tokens", "6", "--cache", "static", "--csv", str(csv)])
    assert code == 0, capsys.readouterr().err
    table = pd.read_csv(csv)
    assert list(table.cache) == ["static", "static"] and (table.compile_seconds == 0).all()
    assert table.matches_ar.all()
    code = cli.main(["compare", "--prompt", "w5", "--target", tiny_pair.target_ref, "--device", "cpu",
                     "--methods", "ar", "--cache", "dynamic", "--compile"])
    assert code == 2 and "compile: graph capture needs the static cache" in capsys.readouterr().err


def test_page_controls_come_from_the_engine_schema():
    import gradio as gr

    from specdemo.app.engine_controls import ENGINE_NAMES, engine_controls, engine_options, first_round_status

    with gr.Blocks():
        controls = engine_controls(EngineOptions(cache="static"))
    assert list(controls) == list(ENGINE_NAMES) == ["cache", "compile"]
    cache, compile_ = controls["cache"], controls["compile"]
    assert isinstance(cache, gr.Dropdown) and cache.value == "static" and cache.label == ENGINE_SCHEMA[0].label
    assert [c[1] for c in cache.choices] == ["auto", "static", "dynamic"]
    assert isinstance(compile_, gr.Checkbox) and compile_.value is False
    assert engine_options({"cache": "auto", "compile": True}) == EngineOptions(compile=True)
    assert first_round_status(EngineOptions(compile=True)).startswith(COMPILING_NOTE)
    assert first_round_status(EngineOptions()) is None
    with pytest.raises(ValueError, match="compile"):
        engine_options({"cache": "dynamic", "compile": True})
