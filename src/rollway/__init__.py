"""rollway: token-exact collection of agentic reinforcement-learning rollouts."""

from rollway.engines import Engine, SimConfig, SimEngine, engine_from_spec
from rollway.errors import (
    AuthError,
    ConfigError,
    EngineAbortedError,
    EngineError,
    InvalidFieldsError,
    MalformedBodyError,
    PayloadTooLargeError,
    RequestError,
    RolloutClosedError,
    RollwayError,
    UnknownRolloutError,
)
from rollway.gateway import (
    BackgroundServer,
    ChatRenderer,
    ChatResult,
    Gateway,
    Registration,
    build_gateway,
    create_app,
)
from rollway.types import Drift, GenerationResult, Sample, SamplingParams, Trajectory, Turn

__version__ = "0.1.0"

__all__ = [
    "AuthError",
    "BackgroundServer",
    "ChatRenderer",
    "ChatResult",
    "ConfigError",
    "Drift",
    "Engine",
    "EngineAbortedError",
    "EngineError",
    "Gateway",
    "GenerationResult",
    "InvalidFieldsError",
    "MalformedBodyError",
    "PayloadTooLargeError",
    "Registration",
    "RequestError",
    "RolloutClosedError",
    "RollwayError",
    "Sample",
    "SamplingParams",
    "SimConfig",
    "SimEngine",
    "Trajectory",
    "Turn",
    "UnknownRolloutError",
    "build_gateway",
    "create_app",
    "engine_from_spec",
]
