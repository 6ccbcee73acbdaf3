"""A family's real tokenizer without weights (what tests and users have to try a family's
template) given to the embedded engine: a clear refusal saying what is missing and what runs
without weights, not transformers' OSError called a possible bug."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollway.cli.failures import explain
from rollway.engines.embedded import EmbeddedEngine
from rollway.errors import ConfigError


def test_a_tokenizer_only_folder_is_refused_naming_the_missing_weights(qwen3_folder: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        EmbeddedEngine.from_pretrained(qwen3_folder)
    failure = explain(refused.value)
    assert f"model folder '{qwen3_folder}' has no weights (no model.safetensors" in failure.message
    assert "--engine scripted://FILE" in failure.message and "--engine sim" in failure.message
    assert "--model takes a local HF model folder" in failure.hint
    assert "bug" not in failure.hint
