"""What an agent holds while it runs one rollout: the task, its tools, and a recorded chat."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from rollway.gateway.chat_answer import ChatResult
from rollway.logs import log_stage
from rollway.types import RolloutMetrics, RolloutResult

log = logging.getLogger(__name__)


class ChatBackend(Protocol):
    """Where a context's ``chat`` goes: the in-process ``Gateway`` itself, or the gateway over
    HTTP (``rollway.agents.server.gateway_http.HttpChat``) on an agent server."""

    model_name: str

    async def chat(self, rollout_id: str, request: dict[str, Any]) -> ChatResult: ...


@dataclass(frozen=True, slots=True)
class ChatReply:
    """One model answer: the message to append, its tool calls, token counts, finish reason."""

    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    @property
    def content(self) -> str | None:
        return self.message.get("content")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []


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

    async def chat(self, messages: list[dict[str, Any]], **sampling: Any) -> ChatReply:
        """Ask the model; ``sampling`` takes chat-completions fields (max_tokens, stop, ...)."""
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
        return ChatReply(result.message, result.finish_reason, result.prompt_tokens, completion)

    def complete(
        self,
        messages: list[dict[str, Any]],
        finish_reason: str = "stop",
        reward: float | None = None,
    ) -> RolloutResult:
        """The rollout ended normally; ``reward`` (if given) overrides the reward function."""
        self.log_event("complete", finish_reason=finish_reason, reward=reward)
        return RolloutResult(messages, finish_reason, reward)

    def error(self, message: str, messages: list[dict[str, Any]] | None = None) -> RolloutResult:
        """The agent gives up: recorded as an ``error`` outcome of kind ``agent``."""
        self.log_event("error", message=message)
        return RolloutResult(messages or [], "error", None, message)

    def cleanup_failed(self, stage: str, error: BaseException) -> None:
        """Record a failed cleanup step instead of raising it over the rollout's result."""
        self.cleanup_errors.append(f"{stage}: {type(error).__name__}: {error}")
        log_stage(log, stage, self.rollout_id, level=logging.WARNING, error=repr(error))

    def record_tool_call(self, latency_ms: float) -> None:
        self.metrics.tool_calls += 1
        self.metrics.tool_latency_ms += latency_ms

    def log_event(self, kind: str, **data: Any) -> None:
        """Log a stage of the rollout (a DEBUG line with ``stage=kind rollout_id=...``) and
        append it to the rollout's debug JSONL (when debug output is on)."""
        log_stage(log, kind, self.rollout_id, **data)
        if self.debug_path is None:
            return
        line = {"t": time.time(), "rollout_id": self.rollout_id, "kind": kind, **data}
        with self.debug_path.open("ab") as out:
            out.write(orjson.dumps(line, default=str) + b"\n")
