"""Build an engine from a URL-like spec: ``embedded``, ``embedded:///path/to/model``, ``sim``."""

from __future__ import annotations

from rollway.engines.base import Engine
from rollway.errors import ConfigError


def engine_from_spec(spec: str, *, model: str | None = None) -> Engine:
    """``embedded`` (optionally ``embedded://PATH`` or ``model=PATH``) or ``sim``."""
    scheme, _, rest = spec.partition("://")
    if scheme == "embedded":
        from rollway.engines.embedded import EmbeddedEngine

        return EmbeddedEngine.from_pretrained(rest or model)
    if scheme == "sim":
        from rollway.engines.sim import SimEngine

        return SimEngine()
    raise ConfigError(f"unknown engine spec {spec!r}: expected 'embedded' or 'sim'", "engine")
