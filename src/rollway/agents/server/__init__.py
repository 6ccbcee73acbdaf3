"""Serve an ``AgentLoop`` over HTTP (``rollway serve-agent module:Class``)."""

from rollway.agents.server.agent_app import create_app
from rollway.agents.server.agent_schema import InitLimits, InitRequest
from rollway.agents.server.service import AgentServerConfig, AgentService

__all__ = ["AgentServerConfig", "AgentService", "InitLimits", "InitRequest", "create_app"]
