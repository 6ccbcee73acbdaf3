"""The embedded engine: a real small model in this process (PyTorch + transformers), batched
continuously. ``embedded_engine.EmbeddedEngine`` is the engine; the other modules are its
passes (``batch_runner``), running batch (``decode_batch``), prefix cache (``kv_cache``),
sampling and weight loading (``state_dicts``)."""

from rollway.engines.embedded.embedded_engine import (
    DEFAULT_PREFIX_CACHE_TOKENS,
    EmbeddedEngine,
    parse_dtype,
)

__all__ = ["DEFAULT_PREFIX_CACHE_TOKENS", "EmbeddedEngine", "parse_dtype"]
