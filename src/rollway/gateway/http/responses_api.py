"""The OpenAI Responses API (the subset agent frameworks use) over the same recording core:
``input`` items (messages, ``function_call``, ``function_call_output``) and ``instructions``
become chat messages, ``previous_response_id`` continues a response this rollout gave, and the
answer comes back as output items (JSON, or the SSE events the openai SDK reads)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from rollway.errors import RollwayError
from rollway.gateway.render.turn_stream import ContentDelta, TurnPiece
from rollway.generation import MAX_TOP_LOGPROBS, ChatResult, Message
from rollway.web.handlers import error_body


class _Lenient(BaseModel):
    # SDKs echo whole output items back (``id``, ``status``, ``annotations``...).
    model_config = ConfigDict(extra="ignore")


class InputText(_Lenient):
    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(_Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]


class FunctionCallItem(_Lenient):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str = "{}"


class FunctionCallOutputItem(_Lenient):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[Any] | dict[str, Any] = ""


def _item_type(item: Any) -> str | None:
    """A message item may leave out its ``type``."""
    kind: str | None = (
        item.get("type", "message") if isinstance(item, dict) else getattr(item, "type", None)
    )
    return kind


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(
        _item_type,
        custom_error_type="unsupported_item",
        custom_error_message="this input item is not supported "
        "(only message, function_call and function_call_output)",
    ),
]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")  # echoed back as sent
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class TextFormat(_Lenient):
    #: Only plain text output: structured outputs would need constrained decoding.
    type: Literal["text"] = "text"


class TextOptions(_Lenient):
    format: TextFormat | None = None
    verbosity: str | None = None


#: What ``include`` names to get logprobs back (OpenAI's name).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
#: The logprobs of a turn's output text, in OpenAI's shape (``TextLogprobs`` makes them).
TextLogprobs = Callable[[ChatResult], list[dict[str, Any]]]


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    truncation: str | None = None
    #: ``message.output_text.logprobs`` answers each output text's ``logprobs``; the others
    #: are accepted and ignored, as the fields below.
    include: list[str] | None = None
    #: The most likely tokens each answered logprob carries (OpenAI's 0 to 20); recorded on the
    #: turn too, as chat's ``top_logprobs`` is.
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # Accepted and ignored: they change nothing for a self-hosted policy without hidden
    # reasoning or server-side caches (agent frameworks send them by default).
    reasoning: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    background: bool = Field(default=False, le=False)
    text: TextOptions | None = None

    def to_chat(self, history: list[Message]) -> dict[str, Any]:
        messages: list[Message] = list(history)
        if self.instructions and not history:
            messages.append({"role": "system", "content": self.instructions})
        items = (
            [MessageItem(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        for item in items:
            _append_item(messages, item)
        chat: dict[str, Any] = {"messages": messages}
        if self.tools:
            chat["tools"] = [_chat_tool(t) for t in self.tools]
        if self.tool_choice == "none":
            chat["tool_choice"] = "none"
        if self.max_output_tokens is not None:
            chat["max_tokens"] = self.max_output_tokens
        for name in ("temperature", "top_p"):
            if getattr(self, name) is not None:
                chat[name] = getattr(self, name)
        if self.top_logprobs is not None:
            chat |= {"logprobs": True, "top_logprobs": self.top_logprobs}
        return chat

    @property
    def wants_logprobs(self) -> bool:
        """Whether each output text answers its ``logprobs`` (OpenAI answers an empty list
        unless ``include`` asks)."""
        return LOGPROBS_INCLUDE in (self.include or ())

    def tool_dicts(self) -> list[dict[str, Any]]:
        """The tools as the caller sent them, for the response body."""
        return [t.model_dump(exclude_unset=True) for t in self.tools or []]


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = tool.model_dump(include={"name", "description", "parameters"}, exclude_none=True)
    return {"type": "function", "function": function}


def _append_item(
    messages: list[Message], item: MessageItem | FunctionCallItem | FunctionCallOutputItem
) -> None:
    if isinstance(item, MessageItem):
        messages.append({"role": item.role, "content": _text(item.content)})
    elif isinstance(item, FunctionCallItem):
        function = {"name": item.name, "arguments": item.arguments}
        call = {"id": item.call_id, "type": "function", "function": function}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and not last.get("content"):
            # Parallel calls share one turn. A new dict: ``last`` may be the rollout's own record
            # of an earlier answer (the history of ``previous_response_id``).
            messages[-1] = {**last, "tool_calls": [*(last.get("tool_calls") or []), call]}
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    else:
        output = item.output
        text = output if isinstance(output, str) else json.dumps(output)
        messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})


def _text(content: str | list[InputText]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def response_body(
    result: ChatResult,
    model: str,
    response_id: str,
    request: ResponsesRequest,
    logprobs: TextLogprobs,
    message_id: str | None = None,
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if result.message.get("content"):
        text = {
            "type": "output_text",
            "text": result.message["content"],
            "annotations": [],
            "logprobs": logprobs(result) if request.wants_logprobs else [],
        }
        output.append(
            {
                "type": "message",
                "id": message_id or f"msg_{uuid.uuid4().hex}",
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        )
    for call in result.message.get("tool_calls") or []:
        output.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": call["id"],
                "name": call["function"]["name"],
                "arguments": call["function"]["arguments"],
                "status": "completed",
            }
        )
    incomplete = result.finish_reason == "length"
    usage = {
        "input_tokens": result.prompt_tokens,
        "output_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }
    return _pending(model, response_id, request) | {
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "usage": usage,
    }


def _pending(model: str, response_id: str, request: ResponsesRequest) -> dict[str, Any]:
    """The response before its answer: what the request alone says."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "incomplete_details": None,
        "error": None,
        "model": model,
        "output": [],
        "instructions": request.instructions,
        "tools": request.tool_dicts(),
        "tool_choice": request.tool_choice or "auto",
        "parallel_tool_calls": True,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_logprobs": request.top_logprobs or 0,
        "metadata": request.metadata or {},
        "usage": None,
    }


async def sse_events(
    pieces: AsyncIterator[TurnPiece],
    model: str,
    response_id: str,
    request: ResponsesRequest,
    logprobs: TextLogprobs,
) -> AsyncGenerator[bytes, None]:
    """A streamed turn as Responses API events, in the order the openai SDK expects: the
    message item's text deltas as the tokens come, then each function call item. Asked
    logprobs come whole with the text's ``done`` event (a delta's text is not cut at token
    boundaries)."""
    sequence = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> bytes:
        payload = {"type": kind, "sequence_number": next(sequence), **data}
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    pending = _pending(model, response_id, request)
    yield event("response.created", response=pending)
    yield event("response.in_progress", response=pending)
    message_id = f"msg_{uuid.uuid4().hex}"
    where = {"item_id": message_id, "output_index": 0, "content_index": 0}
    opened = False
    async for piece in pieces:
        if isinstance(piece, ChatResult):
            result = piece
        elif isinstance(piece, ContentDelta):
            if not opened:
                item = {
                    "type": "message",
                    "id": message_id,
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                }
                yield event("response.output_item.added", output_index=0, item=item)
                part = {"type": "output_text", "text": "", "annotations": []}
                yield event("response.content_part.added", **where, part=part)
                opened = True
            yield event("response.output_text.delta", **where, delta=piece.text, logprobs=[])
    body = response_body(result, model, response_id, request, logprobs, message_id)
    for index, item in enumerate(body["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            text, answered = part["text"], part["logprobs"]
            yield event("response.output_text.done", **where, text=text, logprobs=answered)
            yield event("response.content_part.done", **where, part=part)
        else:
            yield event(
                "response.output_item.added",
                output_index=index,
                item=item | {"status": "in_progress", "arguments": ""},
            )
            at = {"item_id": item["id"], "output_index": index}
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done",
                **at,
                arguments=item["arguments"],
                name=item["name"],
            )
        yield event("response.output_item.done", output_index=index, item=item)
    yield event("response.completed", response=body)


def error_event(error: RollwayError) -> bytes:
    """An error after the stream began, as the openai SDK raises it."""
    payload = {
        "type": "error",
        "code": type(error).__name__,
        "message": error.message,
        "param": error.param,
    } | error_body(error)
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"
