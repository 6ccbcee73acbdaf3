"""An Anthropic Messages request, as the gateway takes it: every field of the SDK's
``MessageCreateParams`` (stable and beta) is applied, refused by name, or recorded on the turn;
its messages become chat messages (tool_use blocks tool calls, tool_result blocks tool
messages) for ``Gateway.chat``.

Where the real API's presentation to the model is not public, the choice keeps one exact
sample (docs/gateway.md, "Anthropic Messages"): text blocks of one message are joined with a
newline (as vLLM joins content parts), a ``system`` message inside ``messages`` stays a system
message where it is, tools marked ``defer_loading`` are left out of the tool list and shown,
as their definition, where a ``tool_reference`` names them, and the billing header block
(``x-anthropic-billing-header: ...``) is recorded, not rendered."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from rollway.errors import InvalidFieldsError
from rollway.gateway.request_schema import (
    ApiRequest,
    Temperature,
    TopK,
    TopP,
    refuse,
    sampling_rule,
    sampling_schema,
)

#: How the text blocks of one message are joined (vLLM's join of content parts).
BLOCK_JOIN = "\n"
#: The system block Claude Code adds for Anthropic's billing: not part of the prompt.
BILLING_HEADER = "x-anthropic-billing-header"
#: Tool types Anthropic's servers run: rollway cannot.
SERVER_TOOLS = ("web_search", "web_fetch", "code_execution", "tool_search", "mcp_toolset")


class _Block(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, citations...


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(_Block):
    """An earlier answer's reasoning sent back: the gateway keeps it as sampled (the answer is
    recognised with or without it); the signature is answered empty and not checked."""

    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block):
    """Encrypted reasoning of Anthropic's models: rollway never answers one; dropped."""

    type: Literal["redacted_thinking"]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    #: Text blocks and ``tool_reference`` blocks (tool search); others refused by name.
    content: str | list[dict[str, Any]] = ""
    is_error: bool | None = None


class OtherBlock(_Block):
    """A block a text-only policy cannot take (image, document, a server tool's use or
    result...): refused by name where it is."""

    type: str


def _block_kind(block: Any) -> str:
    kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", None)
    return kind if kind in _KNOWN else "other"


_KNOWN = ("text", "tool_use", "thinking", "redacted_thinking", "tool_result")

ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_kind),
]


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="ignore")  # cache_control, strict, input_examples...
    type: str | None = None
    name: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    #: Tool search: left out of the tool list, shown where a ``tool_reference`` names it.
    defer_loading: bool = False


class MessagesRequest(ApiRequest):
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
    output_config: dict[str, Any] | None = None
    mcp_servers: list[Any] | None = None
    thread: Any = None
    # Recorded (``RECORDED``): whether and how long to think is the template's to say; the
    # rest serves Anthropic's own servers (caches, tiers, betas, context management).
    thinking: Any = None
    metadata: Any = None
    service_tier: Any = None
    cache_control: Any = None
    container: Any = None
    diagnostics: Any = None
    inference_geo: Any = None
    speed: Any = None
    user_profile_id: Any = None
    workspace_id: Any = None
    betas: Any = None
    billing_policy: Any = None
    compaction: Any = None
    context_management: Any = None
    fallback_credit_token: Any = None
    fallbacks: Any = None

    RECORDED: ClassVar[tuple[str, ...]] = (
        "thinking",
        "metadata",
        "service_tier",
        "cache_control",
        "container",
        "diagnostics",
        "inference_geo",
        "output_config",
        "speed",
        "user_profile_id",
        "workspace_id",
        "betas",
        "billing_policy",
        "compaction",
        "context_management",
        "fallback_credit_token",
        "fallbacks",
    )

    @model_validator(mode="after")
    def _refuse_what_cannot_be_done(self) -> MessagesRequest:
        if (self.output_config or {}).get("format") is not None:
            refuse(
                "output_config.format",
                "structured output needs constrained decoding, which rollway's engines do "
                "not apply: ask for the format in the prompt",
            )
        if self.mcp_servers:
            refuse(
                "mcp_servers",
                "MCP servers are connected by Anthropic's servers; rollway "
                "cannot (give the agent its MCP tools as tools)",
            )
        if self.thread is not None:
            refuse(
                "thread",
                "server-held conversation state is not kept: send the whole "
                "conversation in messages",
            )
        for at, tool in enumerate(self.tools or ()):
            _check_tool(at, tool)
        return self

    def recorded_fields(self) -> dict[str, Any]:
        fields = super().recorded_fields()
        billing = [b.text for b in self._system_blocks() if _is_billing(b)]
        return fields | ({"billing_header": billing} if billing else {})

    def to_chat(self) -> dict[str, Any]:
        """The same request as a chat-completions body for ``Gateway.chat``."""
        messages: list[dict[str, Any]] = []
        system = [b.text for b in self._system_blocks() if not _is_billing(b)]
        if system:
            messages.append({"role": "system", "content": BLOCK_JOIN.join(system)})
        deferred = {t.name: t for t in self.tools or () if t.defer_loading and t.name}
        for at, message in enumerate(self.messages):
            messages += _chat_messages(at, message, deferred)
        chat: dict[str, Any] = {"messages": messages, "max_tokens": self.max_tokens}
        if self.messages[-1].role == "assistant":  # a prefill: the model continues it
            chat["continue_final_message"] = True
        tools = [_chat_tool(t) for t in self.tools or () if not t.defer_loading]
        if tools:
            chat["tools"] = tools
        if self.tool_choice and self.tool_choice.get("type") == "none":
            chat["tool_choice"] = "none"
        for name in ("temperature", "top_p", "top_k"):
            if getattr(self, name) is not None:
                chat[name] = getattr(self, name)
        if self.stop_sequences:
            chat["stop"] = self.stop_sequences
        return chat

    def _system_blocks(self) -> list[TextBlock]:
        if isinstance(self.system, str):
            return [TextBlock(type="text", text=self.system)] if self.system else []
        return list(self.system or ())


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    max_tokens: Annotated[int, sampling_schema("max_tokens"), sampling_rule("max_tokens")] = 1


def _is_billing(block: TextBlock) -> bool:
    return block.text.lstrip().startswith(BILLING_HEADER)


def _check_tool(at: int, tool: AnthropicTool) -> None:
    """A tool the policy can call is one with an ``input_schema`` (a custom tool); others are
    Anthropic's: run by its servers, or with a schema its servers add."""
    if tool.input_schema is not None and tool.name:
        return
    kind = tool.type or "custom"
    if kind.startswith(SERVER_TOOLS):
        refuse(
            f"tools[{at}]",
            f"{kind!r} is a server tool that Anthropic's servers run; "
            "rollway cannot run it (give the agent a tool of its own)",
        )
    if not tool.name:
        refuse(f"tools[{at}].name", "a tool needs a name")
    refuse(
        f"tools[{at}]",
        f"{kind!r} is an Anthropic-defined tool whose schema Anthropic's "
        "servers add: send it as a custom tool with an input_schema",
    )


def _chat_tool(tool: AnthropicTool) -> dict[str, Any]:
    function = {
        "name": tool.name,
        "description": tool.description or "",
        "parameters": tool.input_schema,
    }
    return {"type": "function", "function": function}


def _tool_definition(tool: AnthropicTool) -> str:
    """A deferred tool as a ``tool_reference`` shows it: its definition, as JSON."""
    return json.dumps(_chat_tool(tool)["function"], ensure_ascii=False)


def _result_text(
    where: str, content: str | list[dict[str, Any]], deferred: dict[str, AnthropicTool]
) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for at, block in enumerate(content):
        kind = block.get("type")
        if not isinstance(kind, str) or (kind == "text" and not isinstance(block.get("text"), str)):
            # Malformed, not unsupported: a 422 as pydantic's are.
            field = f"{where}.content[{at}]"
            raise InvalidFieldsError(f"{field}: a content block needs a type (text: a text)", field)
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_reference" and block.get("tool_name") in deferred:
            texts.append(_tool_definition(deferred[block["tool_name"]]))
        elif kind == "tool_reference":
            refuse(
                f"{where}.content[{at}].tool_name",
                f"{block.get('tool_name')!r} names no tool marked defer_loading",
            )
        else:
            refuse(
                f"{where}.content[{at}].type",
                f"{kind!r} blocks are not supported: the model takes text only",
            )
    return BLOCK_JOIN.join(texts)


def _chat_messages(
    at: int, message: AnthropicMessage, deferred: dict[str, AnthropicTool]
) -> list[dict[str, Any]]:
    role = message.role
    if isinstance(message.content, str):
        return [{"role": role, "content": message.content}]
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for index, block in enumerate(message.content):
        where = f"messages[{at}].content[{index}]"
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, RedactedThinkingBlock) and role == "assistant":
            continue
        elif isinstance(block, ThinkingBlock) and role == "assistant":
            thoughts.append(block.thinking)
        elif isinstance(block, ToolUseBlock) and role == "assistant":
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlock) and role == "user":
            text = _result_text(where, block.content, deferred)
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": text})
        elif isinstance(block, OtherBlock):
            refuse(
                f"{where}.type",
                f"{block.type!r} blocks are not supported: the model "
                "takes text, tool use and tool results only",
            )
        else:
            refuse(f"{where}.type", f"a {block.type} block cannot be in a {role} message")
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": BLOCK_JOIN.join(texts) or None}
        if thoughts:
            out["reasoning_content"] = "".join(thoughts)
        return [out | {"tool_calls": calls}] if calls else [out]
    return results + ([{"role": role, "content": BLOCK_JOIN.join(texts)}] if texts else [])
