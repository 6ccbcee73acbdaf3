"""The Anthropic Messages API over the same recording core: requests are translated to chat
messages (tool_use blocks become tool calls, tool_result blocks tool messages), answered by
``Gateway.chat`` token-exactly, and translated back (JSON, or SSE events the official
``anthropic`` SDK reads)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from rollway.errors import InvalidFieldsError, RollwayError
from rollway.gateway.render.turn_stream import (
    ContentDelta,
    ReasoningDelta,
    ToolCallDelta,
    TurnPiece,
)
from rollway.gateway.request_schema import (
    Temperature,
    TopK,
    TopP,
    sampling_rule,
    sampling_schema,
)
from rollway.generation import ChatResult

_STOP_REASON = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(BaseModel):
    """An earlier answer's reasoning sent back: the gateway keeps it as sampled (the answer is
    recognised with or without it); the signature is answered empty and not checked."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


#: The blocks a text-only policy can take; images and documents are refused.
ContentBlock = Annotated[
    TextBlock | ThinkingBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")
]


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    max_tokens: Annotated[int, sampling_schema("max_tokens"), sampling_rule("max_tokens")]
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    stop_sequences: Annotated[list[str] | None, sampling_schema("stop"), sampling_rule("stop")] = (
        None
    )
    stream: bool = False
    #: Whether and how long to think is the model's template's to say: accepted, not used.
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None

    def to_chat(self) -> dict[str, Any]:
        """The same request as a chat-completions body for ``Gateway.chat``."""
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": _text(self.system)})
        for message in self.messages:
            messages += _chat_messages(message)
        chat: dict[str, Any] = {"messages": messages, "max_tokens": self.max_tokens}
        if self.messages[-1].role == "assistant":  # a prefill: the model continues it
            chat["continue_final_message"] = True
        if self.tools:
            chat["tools"] = [_chat_tool(t) for t in self.tools]
        if self.tool_choice and self.tool_choice.get("type") == "none":
            chat["tool_choice"] = "none"
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                chat[name] = getattr(self, name)
        if self.stop_sequences:
            chat["stop"] = self.stop_sequences
        return chat


def _chat_tool(tool: AnthropicTool) -> dict[str, Any]:
    function = {
        "name": tool.name,
        "description": tool.description or "",
        "parameters": tool.input_schema,
    }
    return {"type": "function", "function": function}


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(block.text for block in content)


def _chat_messages(message: AnthropicMessage) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock) and message.role == "assistant":
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock) and message.role == "assistant":
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlock) and message.role == "user":
            results.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": _text(block.content)}
            )
        else:
            raise InvalidFieldsError(
                f"a {block.type} block cannot be in a {message.role} message", param="messages"
            )
    if message.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if thoughts:
            out["reasoning_content"] = "".join(thoughts)
        return [out | {"tool_calls": calls}] if calls else [out]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def message_body(result: ChatResult, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if reasoning := result.message.get("reasoning_content"):
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if result.message.get("content"):
        content.append({"type": "text", "text": result.message["content"]})
    content += [_tool_use(call) for call in result.message.get("tool_calls") or []]
    return _message(model, content, result) | {"usage": _usage(result)}


def _message(
    model: str, content: list[dict[str, Any]], result: ChatResult | None
) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None if result is None else _stop_reason(result),
        "stop_sequence": None if result is None else result.stop_sequence,
    }


def _stop_reason(result: ChatResult) -> str:
    if result.stop_sequence is not None and result.finish_reason == "stop":
        return "stop_sequence"
    return _STOP_REASON.get(result.finish_reason, "end_turn")


def _usage(result: ChatResult) -> dict[str, int]:
    return {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens}


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {
        "type": "tool_use",
        "id": call["id"],
        "name": function["name"],
        "input": json.loads(function["arguments"] or "{}"),
    }


async def sse_events(pieces: AsyncIterator[TurnPiece], model: str) -> AsyncGenerator[bytes, None]:
    """A streamed turn as Anthropic stream events, in the order the SDK expects: a thinking
    block and a text block whose deltas come as the tokens do, then a block per tool call.
    The prompt's token count is known at the end: ``message_delta`` carries it (the SDK
    takes it from there)."""
    start = _message(model, [], None) | {"usage": {"input_tokens": 0, "output_tokens": 0}}
    yield _event("message_start", {"type": "message_start", "message": start})
    blocks, text_open, thinking_open = 0, False, False
    async for piece in pieces:
        if isinstance(piece, ChatResult):
            result = piece
            continue
        if isinstance(piece, ReasoningDelta):  # the reasoning comes before anything else
            if not thinking_open:
                yield _block_start(blocks, {"type": "thinking", "thinking": "", "signature": ""})
                blocks, thinking_open = blocks + 1, True
            yield _block_delta(blocks - 1, {"type": "thinking_delta", "thinking": piece.text})
            continue
        if thinking_open:
            yield _block_stop(blocks - 1)
            thinking_open = False
        if text_open and isinstance(piece, ToolCallDelta):
            yield _block_stop(blocks - 1)
            text_open = False
        if isinstance(piece, ContentDelta):
            if not text_open:
                yield _block_start(blocks, {"type": "text", "text": ""})
                blocks, text_open = blocks + 1, True
            yield _block_delta(blocks - 1, {"type": "text_delta", "text": piece.text})
        else:
            block = _tool_use(piece.call)
            yield _block_start(
                blocks, {k: block[k] for k in ("type", "id", "name")} | {"input": {}}
            )
            arguments = json.dumps(block["input"])
            yield _block_delta(blocks, {"type": "input_json_delta", "partial_json": arguments})
            yield _block_stop(blocks)
            blocks += 1
    if text_open or thinking_open:
        yield _block_stop(blocks - 1)
    delta = {"stop_reason": _stop_reason(result), "stop_sequence": result.stop_sequence}
    usage = _usage(result)
    yield _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    yield _event("message_stop", {"type": "message_stop"})


def error_event(error: RollwayError) -> bytes:
    """An error after the stream began, as the anthropic SDK raises it."""
    body = {"type": error.error_type, "message": error.message}
    return _event("error", {"type": "error", "error": body})


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    payload = {"type": "content_block_start", "index": index, "content_block": block}
    return _event("content_block_start", payload)


def _block_delta(index: int, delta: dict[str, Any]) -> bytes:
    payload = {"type": "content_block_delta", "index": index, "delta": delta}
    return _event("content_block_delta", payload)


def _block_stop(index: int) -> bytes:
    return _event("content_block_stop", {"type": "content_block_stop", "index": index})


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
