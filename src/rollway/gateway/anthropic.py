"""The Anthropic Messages API over the same recording core: requests are translated to chat
messages (tool_use blocks become tool calls, tool_result blocks tool messages), answered by
``Gateway.chat`` token-exactly, and translated back (JSON, or SSE events the official
``anthropic`` SDK reads)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from rollway.errors import InvalidFieldsError
from rollway.types import ChatResult

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


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


#: The blocks a text-only policy can take; images, documents and thinking are refused.
ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
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
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
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
        return [out | {"tool_calls": calls}] if calls else [out]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def message_body(result: ChatResult, model: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if result.message.get("content"):
        content.append({"type": "text", "text": result.message["content"]})
    for call in result.message.get("tool_calls") or []:
        function = call["function"]
        content.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"],
             "input": json.loads(function["arguments"] or "{}")}
        )  # fmt: skip
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP_REASON.get(result.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.completion_tokens},
    }


def sse_events(result: ChatResult, model: str) -> Iterator[bytes]:
    """The answer as Anthropic stream events, in the order the SDK expects."""
    body = message_body(result, model)
    start = body | {
        "content": [],
        "stop_reason": None,
        "usage": body["usage"] | {"output_tokens": 0},
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            opening, delta = (
                {"type": "text", "text": ""},
                {"type": "text_delta", "text": block["text"]},
            )
        else:
            opening = {k: block[k] for k in ("type", "id", "name")} | {"input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield _event("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": opening})  # fmt: skip
        yield _event("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": delta})  # fmt: skip
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    delta = {"stop_reason": body["stop_reason"], "stop_sequence": None}
    usage = {"output_tokens": body["usage"]["output_tokens"]}
    yield _event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
    yield _event("message_stop", {"type": "message_stop"})


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
