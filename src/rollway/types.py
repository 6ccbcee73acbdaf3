"""Every data type that crosses a seam, importable from one place. Each lives with its owner:
``rollway.generation`` (sampling and the model's answers), ``rollway.trajectory`` (turns,
samples, trajectories) and ``rollway.results`` (what a rollout ends with)."""

from __future__ import annotations

from typing import Any

from rollway.deprecated import deprecated_alias
from rollway.errors import ErrorKind
from rollway.generation import (
    MAX_TOP_LOGPROBS,
    PER_TOKEN_EXTRAS,
    ChatGeneration,
    ChatResult,
    FinishReason,
    GenerationChunk,
    GenerationResult,
    LogprobKind,
    Message,
    SamplingParams,
)
from rollway.results import (
    AgentReport,
    AgentResult,
    ReportStatus,
    RolloutMetrics,
    RolloutRecord,
    Status,
    TrajectoryStats,
)
from rollway.trajectory import Drift, Sample, StepDistribution, Trajectory, Turn, build_samples

__all__ = [
    "MAX_TOP_LOGPROBS",
    "PER_TOKEN_EXTRAS",
    "AgentReport",
    "AgentResult",
    "ChatGeneration",
    "ChatResult",
    "Drift",
    "ErrorKind",
    "FinishReason",
    "GenerationChunk",
    "GenerationResult",
    "LogprobKind",
    "Message",
    "ReportStatus",
    "RolloutMetrics",
    "RolloutRecord",
    "Sample",
    "SamplingParams",
    "Status",
    "StepDistribution",
    "Trajectory",
    "TrajectoryStats",
    "Turn",
    "build_samples",
]

#: Renamed types, importable under their old names (with a DeprecationWarning) for one release.
_RENAMED = {"RolloutResult": ("AgentResult", AgentResult)}


def __getattr__(name: str) -> Any:
    return deprecated_alias(__name__, name, _RENAMED)
