"""Shared fixtures: the embedded engine (loaded once), gateways in-process and over HTTP."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import BackgroundServer, ChatRenderer, Gateway, create_app

ADD_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def tool_call(call_id: str, a: int, b: int) -> dict[str, Any]:
    arguments = json.dumps({"a": a, "b": b})
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


# Two worked examples make the 135M model answer with a tool call.
FEW_SHOT: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", 3, 4)]},
    {"role": "user", "content": "What is 10 + 5?"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("call_1", 10, 5)]},
]


@pytest.fixture(scope="session")
def engine() -> Iterator[EmbeddedEngine]:
    loaded = EmbeddedEngine.from_pretrained()
    yield loaded
    asyncio.run(loaded.close())


@pytest.fixture(scope="session")
def renderer(engine: EmbeddedEngine) -> ChatRenderer:
    return ChatRenderer(engine.tokenizer)


@pytest.fixture
def gateway(engine: EmbeddedEngine, renderer: ChatRenderer) -> Gateway:
    return Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")


def sim_gateway(renderer: ChatRenderer, **config: Any) -> Gateway:
    return Gateway(SimEngine(SimConfig(**config)), renderer, model_name="sim")


@dataclass(frozen=True)
class Served:
    url: str
    admin_key: str
    gateway: Gateway

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_key}"}


@pytest.fixture(scope="session")
def served(engine: EmbeddedEngine, renderer: ChatRenderer) -> Iterator[Served]:
    """The HTTP gateway over the embedded engine, on a loopback port chosen by the OS."""
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    admin_key = f"ak-{secrets.token_hex(8)}"
    app = create_app(gateway, admin_key=admin_key, max_body_bytes=64 * 1024, close_engine=False)
    with BackgroundServer(app) as url:
        yield Served(url, admin_key, gateway)
