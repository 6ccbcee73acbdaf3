"""Assemble a gateway from an engine spec and a model folder."""

from __future__ import annotations

from rollway.engines.base import ChatEngine, Engine, ModelInfo
from rollway.engines.factory import engine_from_spec
from rollway.gateway.core import Gateway
from rollway.gateway.render.renderers import load_renderer
from rollway.model_folders import DEFAULT_MODEL_NAME, resolve_model_path


def build_gateway(
    engine: str | Engine | ChatEngine = "embedded",
    *,
    model: str | None = None,
    rollout_ttl_s: float | None = 3600.0,
    renderer: str | None = None,
) -> Gateway:
    """A gateway over ``engine`` (a spec or an engine object), templating with ``model``'s
    tokenizer (default: SmolLM2-135M-Instruct). An embedded engine's own tokenizer is reused,
    and its context bounds prompts; a server enforces its own. ``renderer`` names the model
    family's renderer (``render.renderers``); by default it is chosen from the model folder."""
    if isinstance(engine, str):
        engine = engine_from_spec(engine, model=model)
    info = engine if isinstance(engine, ModelInfo) else None
    tokenizer = info.tokenizer if info else None
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model))
    name = (info.model_name if info else None) or (
        DEFAULT_MODEL_NAME if model is None else model.rstrip("/").rsplit("/", 1)[-1]
    )
    return Gateway(
        engine,
        load_renderer(tokenizer, renderer),
        model_name=name,
        context_length=info.context_length if info else None,
        rollout_ttl_s=rollout_ttl_s,
    )
