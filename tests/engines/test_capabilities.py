"""Capabilities are declared, not guessed: every built-in engine states what it knows of its
model, and optional abilities are protocols the gateway checks by type."""

from __future__ import annotations

import pytest

from rollway.agents.base import AgentLoop
from rollway.agents.program import ProgramAgent
from rollway.agents.server.remote_agent import RemoteAgent
from rollway.engines.base import HealthChecked, ModelInfo, ReportsStats
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.remote.openai_chat import OpenAIChatEngine
from rollway.engines.remote.router import RoutedEngine
from rollway.engines.remote.sglang import SGLangEngine
from rollway.engines.remote.vllm import VLLMEngine
from rollway.engines.sim import SimEngine

ENGINES = [EmbeddedEngine, OpenAIChatEngine, RoutedEngine, SGLangEngine, SimEngine, VLLMEngine]


@pytest.mark.parametrize("engine", ENGINES, ids=lambda cls: cls.__name__)
def test_every_engine_declares_what_it_knows_of_its_model(engine: type) -> None:
    declared = {name for cls in engine.__mro__ for name in getattr(cls, "__annotations__", {})}
    for attribute in ModelInfo.__annotations__:
        assert attribute in declared, f"{engine.__name__} does not declare {attribute}"


def test_optional_abilities_are_typed() -> None:
    assert issubclass(RoutedEngine, ReportsStats)
    assert not issubclass(SimEngine, ReportsStats)
    for engine in (SGLangEngine, VLLMEngine, OpenAIChatEngine):
        assert issubclass(engine, HealthChecked), engine
    assert not issubclass(SimEngine, HealthChecked)


def test_agents_declare_how_they_reach_the_gateway() -> None:
    assert AgentLoop.needs_http is False and AgentLoop.reattaches is False
    assert ProgramAgent.needs_http is True and ProgramAgent.reattaches is False
    assert RemoteAgent.needs_http is True and RemoteAgent.reattaches is True
