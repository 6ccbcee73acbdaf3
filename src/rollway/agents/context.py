"""What an agent holds while it runs one rollout: the task, its tools, and a recorded chat."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from rollway.events import EventBus, ToolCalled
from rollway.generation import ChatResult
from rollway.logs import log_stage
from rollway.results import AgentResult, RolloutMetrics
from rollway.sandbox.environment import RolloutEnvironment

log = logging.getLogger(__name__)


class ChatBackend(Protocol):
    """Where a context's ``chat`` goes: the in-process gateway (``LocalGateway``), a served one
    (``RemoteGateway``), or one rollout's chat over HTTP (``HttpChat``) on an agent server."""

    model_name: str

    async def chat(self, rollout_id: str, request: dict[str, Any]) -> ChatResult: ...


class LimitFields(Protocol):
    @property
    def max_turns(self) -> int | None: ...
    @property
    def max_seq_len(self) -> int | None: ...
    @property
    def timeout(self) -> float | None: ...


class InitFields(Protocol):
    """A rollout's settings as an agent that runs elsewhere passes them on (an agent server's
    init carries them)."""

    @property
    def exp_id(self) -> str: ...
    @property
    def limits(self) -> LimitFields: ...
    @property
    def debug(self) -> bool: ...
    def fixed_sampling(self) -> dict[str, Any]: ...


@dataclass(eq=False)
class RolloutContext:
    """Passed to ``AgentLoop.run``; every ``chat`` goes through the recording gateway."""

    task: dict[str, Any]
    tools: list[dict[str, Any]]
    rollout_id: str
    gateway: ChatBackend
    debug_path: Path | None = None
    metrics: RolloutMetrics = field(default_factory=RolloutMetrics)
    #: The rollout's OpenAI base URL and key, when the client serves its gateway over HTTP
    #: (program agents and other out-of-process callers use these).
    base_url: str | None = None
    api_key: str | None = None
    #: The gateway's Unix socket, for sandboxes whose only way out is a relay to it.
    gateway_socket: str | None = None
    #: Cleanup steps that failed (stopping the agent, tearing down its sandbox): they go on
    #: the rollout's record, and never replace its outcome.
    cleanup_errors: list[str] = field(default_factory=list)
    #: This rollout's settings, per-call overrides applied (None outside a client).
    settings: InitFields | None = None
    #: Where the rollout's events go (the client's listeners; empty when nobody listens).
    events: EventBus | None = None
    #: The reward uses the rollout's environment (``@uses_environment``): an agent that has one
    #: (a program agent's sandbox) lends it (``environment``) instead of tearing it down, and
    #: the runner tears it down once the rollout is scored.
    keep_environment: bool = False
    environment: RolloutEnvironment | None = None

    async def chat(self, messages: list[dict[str, Any]], **sampling: Any) -> ChatResult:
        """Ask the model; ``sampling`` takes chat-completions fields (max_tokens, stop, ...).
        The answer has the message to append (``.message``, ``.content``, ``.tool_calls``),
        usage, and what was sampled: ``completion_ids`` and ``logprobs``, the recorded turn's
        own (``completion_ids`` is None behind a chat-level engine), and ``turn_index``."""
        request: dict[str, Any] = {"messages": messages, **sampling}
        if self.tools:
            request.setdefault("tools", self.tools)
        started = time.perf_counter()
        result = await self.gateway.chat(self.rollout_id, request)
        latency_ms = (time.perf_counter() - started) * 1000.0
        completion = result.completion_tokens
        m = self.metrics
        m.llm_calls += 1
        m.llm_latency_ms += latency_ms
        m.prompt_tokens += result.prompt_tokens
        m.response_tokens += completion
        m.max_context = max(m.max_context, result.prompt_tokens + completion)
        self.log_event("chat", finish_reason=result.finish_reason, latency_ms=latency_ms)
        return result

    def complete(
        self,
        messages: list[dict[str, Any]],
        finish_reason: str = "stop",
        reward: float | None = None,
    ) -> AgentResult:
        """The rollout ended normally; ``reward`` (if given) overrides the reward function."""
        self.log_event("complete", finish_reason=finish_reason, reward=reward)
        return AgentResult(messages, finish_reason, reward)

    def error(self, message: str, messages: list[dict[str, Any]] | None = None) -> AgentResult:
        """The agent gives up: recorded as an ``error`` outcome of kind ``agent``."""
        self.log_event("error", message=message)
        return AgentResult(messages or [], "error", None, message)

    def cleanup_failed(self, stage: str, error: BaseException) -> None:
        """Record a failed cleanup step instead of raising it over the rollout's result."""
        self.cleanup_errors.append(f"{stage}: {type(error).__name__}: {error}")
        log_stage(log, stage, self.rollout_id, level=logging.WARNING, error=repr(error))

    def record_tool_call(self, latency_ms: float, name: str = "") -> None:
        self.metrics.tool_calls += 1
        self.metrics.tool_latency_ms += latency_ms
        if self.events:
            self.events(
                ToolCalled(rollout_id=self.rollout_id, name=name, latency_s=latency_ms / 1e3)
            )

    def log_event(self, kind: str, **data: Any) -> None:
        """Log a stage of the rollout (a DEBUG line with ``stage=kind rollout_id=...``) and
        append it to the rollout's debug JSONL (when debug output is on)."""
        log_stage(log, kind, self.rollout_id, **data)
        if self.debug_path is None:
            return
        line = {"t": time.time(), "rollout_id": self.rollout_id, "kind": kind, **data}
        with self.debug_path.open("ab") as out:
            out.write(orjson.dumps(line, default=str) + b"\n")
