"""rollway: token-exact collection of agentic reinforcement-learning rollouts.

The public surface is ``__all__`` (docs/architecture.md, "Public and internal"). Each name is
imported from its module on first use (PEP 562), so ``import rollway.generation`` or
``from rollway import RolloutRecord`` loads the data types without the gateway's HTTP stack,
the engines or Ray: a trainer's process imports what it reads, and only that."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what mypy and IDEs see; at run time, __getattr__ below
    from rollway.agents import (
        AgentLoop,
        ContextFolding,
        DropToolOutputs,
        KeepLastTurns,
        ProgramAgent,
        QuestionAgent,
        RolloutContext,
        SummarizeOlder,
        Tool,
        execute_tool_calls,
        tool,
    )
    from rollway.agents.server.remote_agent import PollPolicy
    from rollway.client import (
        BatchItem,
        RolloutClient,
        RolloutFuture,
    )
    from rollway.client.rescore import rescore, rescore_async
    from rollway.engines import (
        Engine,
        ScriptedEngine,
        SimConfig,
        SimEngine,
        engine_from_spec,
    )
    from rollway.errors import (
        AgentError,
        AuthError,
        BadRecordError,
        ConfigError,
        EngineConnectError,
        EngineError,
        ExperimentInUseError,
        InfrastructureError,
        InvalidFieldsError,
        JudgeAnswerError,
        MalformedBodyError,
        OverloadedError,
        PayloadTooLargeError,
        RequestError,
        RewardError,
        RolloutClosedError,
        RollwayError,
        StoredDataError,
        UnknownRolloutError,
        UnsupportedMediaTypeError,
    )
    from rollway.executors import (
        LocalExecutor,
        RayExecutor,
    )
    from rollway.gateway import (
        Gateway,
        RemoteGateway,
        build_gateway,
        create_app,
    )
    from rollway.generation import (
        ChatResult,
        GenerationResult,
        SamplingParams,
    )
    from rollway.model_folders import resolve_model_path
    from rollway.results import (
        AgentResult,
        RolloutMetrics,
        RolloutRecord,
    )
    from rollway.retry import (
        Backoff,
        RetryPolicy,
    )
    from rollway.rollouts import (
        Judge,
        RolloutLimits,
        RolloutOptions,
        Rubric,
        ServingConfig,
        parse_score,
    )
    from rollway.rollouts.rewards import RewardFn
    from rollway.sandbox import (
        LocalSandbox,
        Sandbox,
        SandboxLimits,
        SandboxResult,
    )
    from rollway.sandbox.environment import (
        RolloutEnvironment,
        uses_environment,
    )
    from rollway.store import (
        FileStore,
        Store,
        export_records,
        store_from_uri,
    )
    from rollway.trajectory import (
        Drift,
        Sample,
        Trajectory,
        Turn,
    )

__version__ = "0.1.0"

#: Each public name by the module that defines it (or the package that exports it).
_MODULES: dict[str, tuple[str, ...]] = {
    "rollway.agents": (
        "AgentLoop",
        "ContextFolding",
        "DropToolOutputs",
        "KeepLastTurns",
        "ProgramAgent",
        "QuestionAgent",
        "RolloutContext",
        "SummarizeOlder",
        "Tool",
        "execute_tool_calls",
        "tool",
    ),
    "rollway.agents.server.remote_agent": ("PollPolicy",),
    "rollway.client": ("BatchItem", "RolloutClient", "RolloutFuture"),
    "rollway.client.rescore": ("rescore", "rescore_async"),
    "rollway.engines": ("Engine", "ScriptedEngine", "SimConfig", "SimEngine", "engine_from_spec"),
    "rollway.errors": (
        "AgentError",
        "AuthError",
        "BadRecordError",
        "ConfigError",
        "EngineConnectError",
        "EngineError",
        "ExperimentInUseError",
        "InfrastructureError",
        "InvalidFieldsError",
        "JudgeAnswerError",
        "MalformedBodyError",
        "OverloadedError",
        "PayloadTooLargeError",
        "RequestError",
        "RewardError",
        "RolloutClosedError",
        "RollwayError",
        "StoredDataError",
        "UnknownRolloutError",
        "UnsupportedMediaTypeError",
    ),
    "rollway.executors": ("LocalExecutor", "RayExecutor"),
    "rollway.gateway": ("Gateway", "RemoteGateway", "build_gateway", "create_app"),
    "rollway.generation": ("ChatResult", "GenerationResult", "SamplingParams"),
    "rollway.model_folders": ("resolve_model_path",),
    "rollway.results": ("AgentResult", "RolloutMetrics", "RolloutRecord"),
    "rollway.retry": ("Backoff", "RetryPolicy"),
    "rollway.rollouts": (
        "Judge",
        "RolloutLimits",
        "RolloutOptions",
        "Rubric",
        "ServingConfig",
        "parse_score",
    ),
    "rollway.rollouts.rewards": ("RewardFn",),
    "rollway.sandbox": ("LocalSandbox", "Sandbox", "SandboxLimits", "SandboxResult"),
    "rollway.sandbox.environment": ("RolloutEnvironment", "uses_environment"),
    "rollway.store": ("FileStore", "Store", "export_records", "store_from_uri"),
    "rollway.trajectory": ("Drift", "Sample", "Trajectory", "Turn"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}

__all__ = [
    "AgentError",
    "AgentLoop",
    "AgentResult",
    "AuthError",
    "Backoff",
    "BadRecordError",
    "BatchItem",
    "ChatResult",
    "ConfigError",
    "ContextFolding",
    "Drift",
    "DropToolOutputs",
    "Engine",
    "EngineConnectError",
    "EngineError",
    "ExperimentInUseError",
    "FileStore",
    "Gateway",
    "GenerationResult",
    "InfrastructureError",
    "InvalidFieldsError",
    "Judge",
    "JudgeAnswerError",
    "KeepLastTurns",
    "LocalExecutor",
    "LocalSandbox",
    "MalformedBodyError",
    "OverloadedError",
    "PayloadTooLargeError",
    "PollPolicy",
    "ProgramAgent",
    "QuestionAgent",
    "RayExecutor",
    "RemoteGateway",
    "RequestError",
    "RetryPolicy",
    "RewardError",
    "RewardFn",
    "RolloutClient",
    "RolloutClosedError",
    "RolloutContext",
    "RolloutEnvironment",
    "RolloutFuture",
    "RolloutLimits",
    "RolloutMetrics",
    "RolloutOptions",
    "RolloutRecord",
    "RollwayError",
    "Rubric",
    "Sample",
    "SamplingParams",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "ScriptedEngine",
    "ServingConfig",
    "SimConfig",
    "SimEngine",
    "Store",
    "StoredDataError",
    "SummarizeOlder",
    "Tool",
    "Trajectory",
    "Turn",
    "UnknownRolloutError",
    "UnsupportedMediaTypeError",
    "build_gateway",
    "create_app",
    "engine_from_spec",
    "execute_tool_calls",
    "export_records",
    "parse_score",
    "rescore",
    "rescore_async",
    "resolve_model_path",
    "store_from_uri",
    "tool",
    "uses_environment",
]


def __getattr__(name: str) -> object:
    """Imports a public name's module on first use and keeps the name here (next time, a plain
    attribute). A lazy loader, not an alias: every name is what its module defines."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
