from __future__ import annotations

from pathlib import Path

import pytest

from rollway.engines import SimEngine, engine_from_spec
from rollway.errors import ConfigError
from rollway.model_folders import DEFAULT_MODEL, resolve_model_path


def test_a_folder_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"config\.json"):
        resolve_model_path(str(tmp_path))


def test_the_default_model_resolves_to_a_cached_safetensors_copy() -> None:
    path = resolve_model_path(DEFAULT_MODEL)
    assert (path / "model.safetensors").is_file()
    assert (path / "tokenizer.json").is_file()


def test_unknown_engine_spec_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="embedded"):
        engine_from_spec("tpu://nowhere")


def test_sim_spec_takes_latency_and_output_length() -> None:
    engine = engine_from_spec("sim://?latency_s=0.25&output_len=3")
    assert isinstance(engine, SimEngine)
    assert engine.config.latency_s == 0.25 and engine.config.output_len == 3


@pytest.mark.parametrize("spec", ["sim://?speed=9", "sim://?output_len=many"])
def test_bad_sim_options_are_named(spec: str) -> None:
    with pytest.raises(ConfigError, match="sim:// option"):
        engine_from_spec(spec)


def test_a_tokenizer_without_a_config_is_refused_saying_what_a_folder_needs(
    tmp_path: Path,
) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"holds a tokenizer but no config\.json") as refused:
        resolve_model_path(str(tmp_path))
    assert "--engine sim or scripted://FILE" in str(refused.value)
