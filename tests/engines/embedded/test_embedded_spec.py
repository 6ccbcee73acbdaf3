"""The embedded engine's options in its spec (``embedded://[PATH]?prefix_cache_tokens=N``), as
``engine_from_spec`` and the CLI's ``--engine`` take it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rollway.engines import engine_from_spec
from rollway.engines.embedded import DEFAULT_PREFIX_CACHE_TOKENS, EmbeddedEngine
from rollway.errors import ConfigError
from rollway.generation import SamplingParams
from rollway.model_folders import DEFAULT_MODEL, resolve_model_path


async def test_the_spec_sets_the_prefix_cache_budget_of_the_models_engine() -> None:
    path = resolve_model_path(DEFAULT_MODEL)
    engine = engine_from_spec(f"embedded://{path}?prefix_cache_tokens=0")
    assert isinstance(engine, EmbeddedEngine)
    try:
        assert engine.prefix_cache.max_tokens == 0
        ids = engine.tokenizer.encode("The sea is")
        await engine.generate(ids, SamplingParams(max_tokens=2), "no-cache")
        assert len(engine.prefix_cache) == 0  # nothing kept: the cache is off
    finally:
        await engine.close()


def test_the_session_engine_keeps_the_default_budget(engine: EmbeddedEngine) -> None:
    assert engine.prefix_cache.max_tokens == DEFAULT_PREFIX_CACHE_TOKENS == 8192


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("embedded://?prefix_cache_tokens=lots", "prefix_cache_tokens='lots' is not a whole"),
        ("embedded://?prefix_cache_tokens=1.5", "prefix_cache_tokens='1.5' is not a whole"),
        ("embedded://?prefix_cache_tokens=-1", "prefix_cache_tokens must be a whole number of"),
        ("embedded://?prefix_cache=9", "unknown embedded:// option 'prefix_cache'; known: prefix"),
        ("embedded://?prefix_cache_tokens", "bad embedded:// options"),
        ("embedded://?prefix_cache_tokens=", "prefix_cache_tokens='' is not a whole"),
    ],
)
def test_a_bad_option_is_a_config_error_before_any_model_loads(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        engine_from_spec(spec)


def test_a_negative_budget_is_refused_by_the_engine_too(engine: EmbeddedEngine) -> None:
    with pytest.raises(ConfigError, match="prefix_cache_tokens must be a whole number"):
        EmbeddedEngine(engine.model, engine.tokenizer, device=engine.device, prefix_cache_tokens=-8)


def test_the_cli_engine_option_takes_the_spec_and_names_a_bad_value() -> None:
    spec = "embedded://?prefix_cache_tokens=-1"
    result = subprocess.run(
        [sys.executable, "-m", "rollway", "gateway", "--engine", spec],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert "prefix_cache_tokens must be a whole number of at least 0" in result.stderr
    assert "Traceback" not in result.stderr
