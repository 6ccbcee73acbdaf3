"""``engines.factory.ENGINES`` is the one list of engine schemes: the refusal of an unknown spec
and the CLI's ``--engine`` help are made from it, and an engine added as one row is built,
checked and listed with nothing else touched."""

from __future__ import annotations

import typing

import pytest

from rollway.cli.options import EngineOption
from rollway.engines import SimEngine, engine_from_spec, factory
from rollway.engines.factory import ENGINES, EngineKind, EngineSpec, engine_help
from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError


def test_the_refusal_of_an_unknown_spec_lists_every_engine_of_the_table() -> None:
    with pytest.raises(ConfigError) as refused:
        engine_from_spec("warp://somewhere?api_key=s3cret")
    message = str(refused.value)
    assert "unknown engine spec 'warp://somewhere?api_key=***'" in message
    for kind in ENGINES:
        assert kind.help in message


def test_the_clis_engine_help_is_made_from_the_table() -> None:
    help_text = typing.get_args(EngineOption)[1].help
    assert help_text == f"{engine_help()} (README: Engines)"
    assert [kind.help for kind in ENGINES] == engine_help().split(" | ")


@pytest.mark.parametrize("scheme", ["sglang", "vllm", "openai", "scripted"])
def test_a_scheme_that_names_a_place_refuses_to_go_without_one(scheme: str) -> None:
    with pytest.raises(ConfigError, match=f"unknown engine spec '{scheme}://'"):
        engine_from_spec(f"{scheme}://")


def test_a_row_added_to_the_table_is_an_engine_its_options_checked_and_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[EngineSpec] = []

    def build(spec: EngineSpec) -> SimEngine:
        built.append(spec)
        return SimEngine(SimConfig(output_len=spec.options["tokens"]))

    row = EngineKind(("echo",), build, {"tokens": int}, "echo://NAME?tokens=N")
    monkeypatch.setattr(factory, "ENGINES", (*ENGINES, row))
    engine = engine_from_spec("echo://there?tokens=3", model="folder")
    assert isinstance(engine, SimEngine) and engine.config.output_len == 3
    assert built == [EngineSpec("echo", "there", {"tokens": 3}, "folder", "echo://there?tokens=3")]
    assert engine_help().endswith(" | echo://NAME?tokens=N")
    with pytest.raises(ConfigError, match=r"echo:// option tokens='many' is not a whole number"):
        engine_from_spec("echo://there?tokens=many")
    with pytest.raises(ConfigError, match=r"unknown echo:// option 'size'; known: tokens"):
        engine_from_spec("echo://there?size=3")


def test_an_openai_spec_refuses_an_option_it_does_not_know() -> None:
    # It used to drop anything past ?model= without a word.
    with pytest.raises(ConfigError, match=r"unknown openai:// option 'temperature'; known: model"):
        engine_from_spec("openai://127.0.0.1:9?model=m&temperature=0")
