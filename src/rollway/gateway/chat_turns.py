"""Chat turns behind a chat-level engine (a hosted OpenAI-compatible API): messages in,
message out, recorded without token ids. For evaluation; trajectories say
``has_token_ids: false`` and carry no samples."""

from __future__ import annotations

import time
from typing import Any

from rollway.engines.base import ChatEngine
from rollway.errors import InvalidFieldsError, RolloutClosedError
from rollway.gateway.engine_calls import EngineCalls
from rollway.gateway.metrics import GatewayMetrics
from rollway.gateway.request_schema import ChatCompletionRequest
from rollway.gateway.rollout_state import Conversation, RolloutState
from rollway.generation import ChatResult
from rollway.trajectory import Turn
from rollway.trajectory_format import prompt_hash


class ChatTurns:
    def __init__(self, engine: ChatEngine, calls: EngineCalls, metrics: GatewayMetrics) -> None:
        self.engine = engine
        self.calls = calls
        self.metrics = metrics

    async def answer_choices(
        self,
        state: RolloutState,
        request: ChatCompletionRequest,
        conversation: Conversation,
        tools: list[dict[str, Any]] | None,
        n: int,
    ) -> list[ChatResult]:
        """``n`` answers, one call each; the first answered last, so that the conversation
        goes on from it."""
        others = [await self.answer(state, request, conversation, tools) for _ in range(n - 1)]
        return [await self.answer(state, request, conversation, tools), *others]

    async def answer(
        self,
        state: RolloutState,
        request: ChatCompletionRequest,
        conversation: Conversation,
        tools: list[dict[str, Any]] | None,
    ) -> ChatResult:
        if request.continue_final_message:
            raise InvalidFieldsError(
                "continuing the final assistant message (an Anthropic prefill) needs a token "
                "engine: a chat-level one (openai://) answers messages, it cannot continue one",
                param="messages",
            )
        sampling = state.sampling_for(request.sampling_overrides())
        request_id = state.begin_turn()
        started = time.perf_counter()
        async with self.calls.track(state, request_id):
            answer = await self.engine.chat(conversation.messages, tools, sampling, request_id)
        latency = time.perf_counter() - started
        message = answer.message
        turn = Turn(
            index=len(state.turns),
            segment=0,
            request_id=request_id,
            prompt_len=answer.prompt_tokens,
            new_prompt_ids=[],
            completion_ids=[],
            logprobs=answer.logprobs or [],
            finish_reason=answer.finish_reason,
            content=message.get("content"),
            tool_calls=message.get("tool_calls") or [],
            sampling=state.recorded_sampling(sampling),
            latency_ms=latency * 1000.0,
            prompt_hash=prompt_hash([]),
        )
        state.turns.append(turn)
        state.segment_count = 1
        state.close_turn(conversation, message, tools)
        if answer.finish_reason == "abort":
            raise RolloutClosedError(
                f"rollout {state.rollout_id!r} was cancelled during generation"
            )
        self.metrics.turn_answered(answer.finish_reason)
        self.metrics.turn_latency.observe(latency)
        return ChatResult(
            message,
            answer.finish_reason,
            answer.prompt_tokens,
            answer.completion_tokens,
            completion_ids=None,
            logprobs=answer.logprobs,
            turn_index=turn.index,
        )
