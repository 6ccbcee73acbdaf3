"""The agent SDK: ``AgentLoop``, its ``RolloutContext``, ``@tool``, validation, a registry."""

from rollway.agents.base import AgentLoop
from rollway.agents.context import RolloutContext
from rollway.agents.program import ProgramAgent
from rollway.agents.registry import load_agent, register_agent
from rollway.agents.tools import Tool, execute_tool_calls, tool
from rollway.agents.validate import Issue, validate
from rollway.deprecated import deprecated_alias as _deprecated_alias
from rollway.types import ChatResult

__all__ = [
    "AgentLoop",
    "Issue",
    "ProgramAgent",
    "RolloutContext",
    "Tool",
    "execute_tool_calls",
    "load_agent",
    "register_agent",
    "tool",
    "validate",
]


def __getattr__(name: str) -> object:
    return _deprecated_alias(__name__, name, {"ChatReply": ("rollway.ChatResult", ChatResult)})
