"""rollway: token-exact collection of agentic reinforcement-learning rollouts."""

from rollway.agents import (
    AgentLoop,
    ContextFolding,
    DropToolOutputs,
    KeepLastTurns,
    ProgramAgent,
    RolloutContext,
    SummarizeOlder,
    Tool,
    execute_tool_calls,
    tool,
)
from rollway.agents.server.remote_agent import PollPolicy
from rollway.client import BatchItem, RolloutClient, RolloutFuture
from rollway.deprecated import deprecated_alias as _deprecated_alias
from rollway.deprecated import install_moved_module_finder as _install_moved_module_finder
from rollway.engines import Engine, ScriptedEngine, SimConfig, SimEngine, engine_from_spec
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
from rollway.executors import LocalExecutor, RayExecutor
from rollway.gateway import ChatResult, Gateway, RemoteGateway, build_gateway, create_app
from rollway.generation import GenerationResult, SamplingParams
from rollway.results import AgentResult, RolloutMetrics, RolloutRecord
from rollway.retry import Backoff, RetryPolicy
from rollway.rollouts import (
    Judge,
    RolloutLimits,
    RolloutOptions,
    Rubric,
    ServingConfig,
    parse_score,
)
from rollway.sandbox import LocalSandbox, Sandbox, SandboxLimits, SandboxResult
from rollway.sandbox.environment import RolloutEnvironment, uses_environment
from rollway.store import FileStore, Store, export_records, store_from_uri
from rollway.trajectory import Drift, Sample, Trajectory, Turn

__version__ = "0.1.0"

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
    "RayExecutor",
    "RemoteGateway",
    "RequestError",
    "RetryPolicy",
    "RewardError",
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
    "store_from_uri",
    "tool",
    "uses_environment",
]

#: Names renamed in this release, importable under the old ones (with a DeprecationWarning)
#: for one more.
_RENAMED = {
    "ChatReply": ("rollway.ChatResult", ChatResult),
    "RolloutResult": ("rollway.AgentResult", AgentResult),
}


def __getattr__(name: str) -> object:
    return _deprecated_alias(__name__, name, _RENAMED)


# Modules moved into sub-packages in this release still import under their old paths, for one
# more (rollway.deprecated.MOVED_MODULES).
_install_moved_module_finder()
