"""Chat turns behind a chat-level engine (a hosted OpenAI-compatible API): messages in,
message out, recorded without token ids. For evaluation; trajectories say
``has_token_ids: false`` and carry no samples."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rollway.errors import RolloutClosedError
from rollway.gateway.chat_template import Message
from rollway.gateway.protocol import ChatCompletionRequest
from rollway.gateway.rollout import MessageKey, RolloutState, message_key, prompt_hash
from rollway.types import Turn

if TYPE_CHECKING:
    from rollway.gateway.core import ChatResult, Gateway


async def chat_passthrough(
    gateway: Gateway,
    state: RolloutState,
    request: ChatCompletionRequest,
    messages: list[Message],
    keys: list[MessageKey],
) -> ChatResult:
    from rollway.gateway.core import ChatResult

    tools = request.tool_dicts()
    sampling = gateway.effective_sampling(state, request)
    state.turns_started += 1
    request_id = f"{state.rollout_id}-{state.turns_started}"
    started = time.perf_counter()
    async with gateway.engine_call(state, request_id):
        answer = await gateway.engine.chat(messages, tools, sampling, request_id)  # type: ignore[union-attr]
    latency = time.perf_counter() - started
    message = answer.message
    turn = Turn(
        index=len(state.turns),
        segment=0,
        request_id=request_id,
        prompt_ids=[],
        completion_ids=[],
        logprobs=answer.logprobs or [],
        finish_reason=answer.finish_reason,
        content=message.get("content"),
        tool_calls=message.get("tool_calls") or [],
        sampling=sampling.to_dict(),
        latency_ms=latency * 1000.0,
        prompt_hash=prompt_hash([]),
    )
    state.turns.append(turn)
    state.segment_count = 1
    state.messages = [*messages, message]
    state.message_keys = [*keys, message_key(message)]
    state.tools = tools
    if answer.finish_reason == "abort":
        raise RolloutClosedError(f"rollout {state.rollout_id!r} was cancelled during generation")
    gateway.metrics.turns.labels(answer.finish_reason).inc()
    gateway.metrics.turn_latency.observe(latency)
    return ChatResult(
        message, answer.finish_reason, answer.prompt_tokens, answer.completion_tokens, [], [],
        turn.index,
    )  # fmt: skip
