"""The agent SDK: ``AgentLoop``, its ``RolloutContext``, ``@tool``, validation, a registry."""

from rollway.agents.base import AgentLoop
from rollway.agents.context import ChatReply, RolloutContext
from rollway.agents.program import ProgramAgent
from rollway.agents.registry import load_agent, register_agent
from rollway.agents.tools import Tool, execute_tool_calls, tool
from rollway.agents.validate import Issue, validate

__all__ = [
    "AgentLoop",
    "ChatReply",
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
