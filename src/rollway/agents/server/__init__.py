"""Serve an ``AgentLoop`` over HTTP (``rollway serve-agent module:Class``)."""

from typing import Any

from rollway.agents.server.agent_app import create_app
from rollway.agents.server.agent_schema import InitLimits, InitRequest
from rollway.agents.server.service import AgentServerConfig, AgentService
from rollway.deprecated import deprecated_alias

__all__ = ["AgentServerConfig", "AgentService", "InitLimits", "InitRequest", "create_app"]


#: Renamed in this release (one suffix per kind of setting: docs/architecture.md#names);
#: the old names import, with a DeprecationWarning, for one more.
_RENAMED = {"ServiceConfig": ("rollway.agents.server.AgentServerConfig", AgentServerConfig)}


def __getattr__(name: str) -> Any:
    return deprecated_alias(__name__, name, _RENAMED)
