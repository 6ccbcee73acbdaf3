"""The agent SDK: ``AgentLoop``, its ``RolloutContext``, ``@tool``, validation, a registry."""

from rollway.agents.base import AgentLoop
from rollway.agents.context import RolloutContext
from rollway.agents.folding import ContextFolding, DropToolOutputs, KeepLastTurns, SummarizeOlder
from rollway.agents.program import ProgramAgent
from rollway.agents.question import QuestionAgent
from rollway.agents.registry import list_agents, load_agent, register_agent, unregister_agent
from rollway.agents.tools import Tool, execute_tool_calls, tool
from rollway.agents.validate import IssueCode, ValidationIssue, ValidationResult, validate

__all__ = [
    "AgentLoop",
    "ContextFolding",
    "DropToolOutputs",
    "IssueCode",
    "KeepLastTurns",
    "ProgramAgent",
    "QuestionAgent",
    "RolloutContext",
    "SummarizeOlder",
    "Tool",
    "ValidationIssue",
    "ValidationResult",
    "execute_tool_calls",
    "list_agents",
    "load_agent",
    "register_agent",
    "tool",
    "unregister_agent",
    "validate",
]
