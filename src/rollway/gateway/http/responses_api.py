"""The OpenAI Responses API (the subset agent frameworks use) over the same recording core:
``input`` items (messages, ``reasoning``, ``function_call``, ``function_call_output``) and
``instructions`` become chat messages, ``previous_response_id`` continues a response this
rollout gave, and the answer comes back as output items: a ``reasoning`` item (the thinking, as
``reasoning_text`` content, as vLLM answers it), the message, the function calls (JSON here, the
SSE events in ``responses_stream``)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from rollway.errors import InvalidFieldsError
from rollway.gateway.request_schema import (
    ApiRequest,
    MaxTokens,
    Temperature,
    TopLogprobs,
    TopP,
    refuse,
)
from rollway.generation import ChatResult, Message


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


class ReasoningText(_Lenient):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(_Lenient):
    """An answer's reasoning sent back before its message and calls: kept as the answer's
    ``reasoning_content`` (the answer is recognised with or without it). Only ``content`` is
    the reasoning; a ``summary`` is not what was sampled, and is not used."""

    type: Literal["reasoning"]
    summary: list[dict[str, Any]] = Field(default_factory=list)
    content: list[ReasoningText] | None = None


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
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(
        _item_type,
        custom_error_type="unsupported_item",
        custom_error_message="this input item is not supported "
        "(only message, reasoning, function_call and function_call_output)",
    ),
]


class FunctionTool(BaseModel):
    """A function tool; a ``namespace`` tool (Codex's) groups function tools, which the
    policy sees as function tools of their own names. Other types are refused by name."""

    model_config = ConfigDict(extra="allow")  # echoed back as sent
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


#: Tool types OpenAI's servers run: rollway cannot.
HOSTED_TOOLS = (
    "web_search",
    "file_search",
    "computer",
    "mcp",
    "code_interpreter",
    "programmatic_tool_calling",
    "image_generation",
    "tool_search",
)


def _functions(at: int, tool: FunctionTool) -> list[dict[str, Any]]:
    """The chat function tools ``tool`` gives the policy."""
    if tool.type == "function" and tool.name:
        fields: dict[str, Any] = {"name": tool.name, "description": tool.description}
        fields["parameters"] = tool.parameters
        function = {k: v for k, v in fields.items() if v is not None}
        return [{"type": "function", "function": function}]
    if tool.type == "namespace":
        inner = [FunctionTool.model_validate(t) for t in tool.tools or ()]
        return [f for t in inner for f in _functions(at, t)]
    if tool.type.startswith(HOSTED_TOOLS):
        refuse(
            f"tools[{at}]",
            f"{tool.type!r} is a hosted tool that OpenAI's servers run; "
            "rollway cannot run it (give the agent a function tool of its own)",
        )
    if tool.type == "function":  # malformed, not unsupported: a 422 as pydantic's are
        raise InvalidFieldsError(
            f"tools.{at}.name: a function tool needs a name", f"tools.{at}.name"
        )
    refuse(
        f"tools[{at}]",
        f"{tool.type!r} tools are not supported: the policy calls function "
        "tools (send it as a function tool with parameters)",
    )


class TextFormat(_Lenient):
    #: Only plain text output: structured outputs would need constrained decoding (refused).
    type: str = "text"


class TextOptions(_Lenient):
    format: TextFormat | None = None
    verbosity: str | None = None


#: What ``include`` names to get logprobs back (OpenAI's name).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
#: The logprobs of a turn's output text, in OpenAI's shape (``TextLogprobs`` makes them).
TextLogprobs = Callable[[ChatResult], list[dict[str, Any]]]


#: Responses fields refused whenever they are set, and why.
_REFUSED = {
    "conversation": "server-held conversations are not kept: send previous_response_id or "
    "the whole input",
    "prompt": "stored prompt templates live on OpenAI's servers: send the instructions",
    "image": "image generation is not supported: the model answers in text",
}


class ResponsesRequest(ApiRequest):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: MaxTokens = None
    temperature: Temperature = None
    top_p: TopP = None
    stream: bool = False
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None
    store: Any = None
    metadata: Any = None
    user: Any = None
    truncation: Any = None
    #: ``message.output_text.logprobs`` answers each output text's ``logprobs``; the others
    #: are accepted and ignored, as the fields below.
    include: list[str] | None = None
    #: The most likely tokens each answered logprob carries (OpenAI's 0 to 20); recorded on the
    #: turn too, as chat's ``top_logprobs`` is.
    top_logprobs: TopLogprobs = None
    background: bool | None = None
    text: TextOptions | None = None
    conversation: Any = None
    prompt: Any = None
    image: Any = None
    # Recorded (``RECORDED``): they change nothing for a self-hosted policy without hidden
    # reasoning or server-side caches (agent frameworks send them by default).
    reasoning: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    service_tier: Any = None
    safety_identifier: Any = None
    client_metadata: Any = None
    access_programs: Any = None
    background_options: Any = None
    context_management: Any = None
    max_tool_calls: Any = None
    moderation: Any = None
    stream_options: Any = None

    RECORDED: ClassVar[tuple[str, ...]] = (
        "store",
        "metadata",
        "user",
        "truncation",
        "reasoning",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "service_tier",
        "safety_identifier",
        "client_metadata",
        "access_programs",
        "background_options",
        "context_management",
        "max_tool_calls",
        "moderation",
        "stream_options",
    )

    @model_validator(mode="after")
    def _refuse_what_cannot_be_done(self) -> ResponsesRequest:
        for name, why in _REFUSED.items():
            if getattr(self, name) is not None:
                refuse(name, why)
        if self.background:
            refuse("background", "background responses are not run: send the request and wait")
        form = self.text.format if self.text else None
        if form is not None and form.type != "text":
            refuse(
                "text.format",
                f"{form.type!r} needs constrained decoding, which rollway's "
                "engines do not apply: ask for the format in the instructions",
            )
        for at, tool in enumerate(self.tools or ()):
            _functions(at, tool)
        return self

    def to_chat(self, history: list[Message]) -> dict[str, Any]:
        messages: list[Message] = list(history)
        if self.instructions and not history:
            messages.append({"role": "system", "content": self.instructions})
        items = (
            [MessageItem(role="user", content=self.input)]
            if isinstance(self.input, str)
            else self.input
        )
        answer: int | None = None  # where the answer the items are sending back is
        for item in items:
            answer = _append_item(messages, item, answer)
        chat: dict[str, Any] = {"messages": messages}
        tools = [f for at, t in enumerate(self.tools or ()) for f in _functions(at, t)]
        if tools:
            chat["tools"] = tools
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


#: An input item, as ``ResponsesRequest.input`` reads it.
Item = MessageItem | ReasoningItem | FunctionCallItem | FunctionCallOutputItem


def _append_item(messages: list[Message], item: Item, answer: int | None) -> int | None:
    """Add ``item`` to ``messages``. One answer's output items (reasoning, message, function
    calls, in that order) make one assistant message, as it was recorded; ``answer`` is the
    index of the one the items before built (None: they built none). Returns the new one."""
    if isinstance(item, ReasoningItem):
        message: Message = {"role": "assistant", "content": None}
        if item.content is not None:
            message["reasoning_content"] = "".join(part.text for part in item.content)
        messages.append(message)
        return len(messages) - 1
    if isinstance(item, MessageItem):
        text = _text(item.content)
        if item.role == "assistant" and answer is not None and not messages[answer].get("content"):
            messages[answer] = {**messages[answer], "content": text}
            return answer
        messages.append({"role": item.role, "content": text})
        return len(messages) - 1 if item.role == "assistant" else None
    if isinstance(item, FunctionCallItem):
        function = {"name": item.name, "arguments": item.arguments}
        call = {"id": item.call_id, "type": "function", "function": function}
        last = messages[-1] if messages else None
        if answer is not None or (
            last is not None and last["role"] == "assistant" and not last.get("content")
        ):
            # Parallel calls share one turn, and join the text before them. A new dict: the
            # turn may be the rollout's own record of an earlier answer (the history of
            # ``previous_response_id``).
            at = len(messages) - 1 if answer is None else answer
            turn = messages[at]
            messages[at] = {**turn, "tool_calls": [*(turn.get("tool_calls") or []), call]}
            return at
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        return len(messages) - 1
    output = item.output
    text = output if isinstance(output, str) else json.dumps(output)
    messages.append({"role": "tool", "tool_call_id": item.call_id, "content": text})
    return None


def _text(content: str | list[InputText]) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def response_body(
    result: ChatResult,
    model: str,
    response_id: str,
    request: ResponsesRequest,
    logprobs: TextLogprobs,
    item_ids: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The response: its output items in the order the answer wrote them, each reasoning or
    message item under ``item_ids``' id for its type where given (a stream named them)."""
    ids = item_ids or {}
    output: list[dict[str, Any]] = []
    if reasoning := result.message.get("reasoning_content"):
        output.append(reasoning_item(ids.get("reasoning") or item_id("reasoning"), reasoning))
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
                "id": ids.get("message") or item_id("message"),
                "status": "completed",
                "role": "assistant",
                "content": [text],
            }
        )
    for call in result.message.get("tool_calls") or []:
        output.append(
            {
                "type": "function_call",
                "id": item_id("function_call"),
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
    return pending(model, response_id, request) | {
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "usage": usage,
    }


_ID_PREFIX = {"reasoning": "rs", "message": "msg", "function_call": "fc"}


def item_id(kind: str) -> str:
    """A new id for an output item of type ``kind``, prefixed as OpenAI's."""
    return f"{_ID_PREFIX[kind]}_{uuid.uuid4().hex}"


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """The answer's thinking as OpenAI's ``ResponseReasoningItem``: the text as sampled in
    ``content`` (``reasoning_text``, as vLLM and open models answer it), no summary (the model
    wrote none)."""
    content = [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def pending(model: str, response_id: str, request: ResponsesRequest) -> dict[str, Any]:
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
