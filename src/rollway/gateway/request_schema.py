"""Wire models of the gateway: the register body and OpenAI chat-completions requests.

Top-level request bodies forbid unknown fields so that a typo is named, not ignored. Message
objects ignore extra keys: agents echo back whole SDK message objects (``refusal``,
``annotations``, ``audio``...) that carry nothing the template renders.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, NoReturn

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from rollway.checks import MAX_SEQ_LEN
from rollway.errors import InvalidFieldsError, RequestError
from rollway.generation import SamplingParams
from rollway.sampling_settings import SAMPLING_NAMES, SETTING, checked


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def refuse(field: str, why: str) -> NoReturn:
    """A field the real API defines that rollway cannot honour: a 400 naming it and why."""
    raise RequestError(f"{field}: {why}", param=field)


class ApiRequest(_Strict):
    """A request body of one of the APIs the gateway speaks, accepting every field its SDK
    defines (``tests/gateway/test_api_fields.py`` walks them): a field that changes sampling or
    the prompt is applied or refused (``refuse``); one that does not is listed in ``RECORDED``,
    accepted as sent and recorded on the turn (``Trajectory.request_fields``)."""

    RECORDED: ClassVar[tuple[str, ...]] = ()

    def recorded_fields(self) -> dict[str, Any]:
        """The ``RECORDED`` fields the request set, as sent."""
        return {
            name: getattr(self, name) for name in self.RECORDED if getattr(self, name) is not None
        }


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Strict):
    type: Literal["function"] = "function"
    function: FunctionSpec


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class TextPart(BaseModel):
    """A content part. Only text is rendered: another type (``image_url``, ``input_audio``,
    ``file``) is refused by name (``refuse_non_text``), as the API refuses it on a text model."""

    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


def refuse_non_text(messages: list[dict[str, Any]], start: int = 0) -> None:
    """A 400 naming the first content part that is not text (``messages[i].content[j].type``):
    the policy is a text-only model."""
    for i, message in enumerate(messages, start):
        content = message.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            where = f"messages[{i}].content[{j}]"
            if part["type"] != "text":
                refuse(
                    f"{where}.type",
                    f"{part['type']!r} parts are not supported: the model takes text only",
                )
            if part.get("text") is None:
                raise InvalidFieldsError(
                    f"{where}.text: a text part needs its text", f"{where}.text"
                )


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    #: An answer's reasoning (vLLM's and SGLang's field, the one the gateway answers in): as
    #: sent, an edited reasoning is the history the template renders; on other roles ignored.
    reasoning_content: str | None = None

    @field_validator("reasoning_content")
    @classmethod
    def _answers_only(cls, value: str | None, info: ValidationInfo) -> str | None:
        return value if info.data.get("role") == "assistant" else None


def sampling_schema(name: str) -> Any:
    """A wire field's schema from the setting's declaration: its bounds and meaning (what
    ``/openapi.json`` shows; ``sampling_rule`` refuses first, in the declaration's words)."""
    setting = SETTING[name]
    bounds: dict[str, Any] = {"description": setting.meaning}
    if setting.low is not None:
        bounds["gt" if setting.above_low else "ge"] = setting.low
    if setting.high is not None:
        bounds["le"] = setting.high
    if setting.kind == "number":
        bounds["allow_inf_nan"] = False
    return Field(**bounds)


def sampling_rule(name: str) -> Any:
    """The setting's own check on a wire field, before pydantic's: the same refusal as in
    process and on the command line, naming the field sent (``max_output_tokens`` is held to
    ``max_tokens``' rule). Strict even for in-process callers, whose lax mode would take True
    for 1 and "3" for 3."""
    setting = SETTING[name]

    def check(value: Any, info: ValidationInfo) -> Any:
        field = info.field_name or name
        try:
            held = setting.check(value, field)
        except InvalidFieldsError as exc:
            reason = exc.message.removeprefix(f"{field}: ")
            raise PydanticCustomError("sampling_rule", "{reason}", {"reason": reason}) from None
        # A lone stop string stays as sent; numbers as held (top_k's -1 is 0).
        return value if isinstance(held, tuple) else held

    return BeforeValidator(check)


Temperature = Annotated[float | None, sampling_schema("temperature"), sampling_rule("temperature")]
TopP = Annotated[float | None, sampling_schema("top_p"), sampling_rule("top_p")]
TopK = Annotated[int | None, sampling_schema("top_k"), sampling_rule("top_k")]
MaxTokens = Annotated[int | None, sampling_schema("max_tokens"), sampling_rule("max_tokens")]
Stop = Annotated[str | list[str] | None, sampling_schema("stop"), sampling_rule("stop")]
StopTokenIds = Annotated[
    list[int] | None, sampling_schema("stop_token_ids"), sampling_rule("stop_token_ids")
]
Seed = Annotated[int | None, sampling_schema("seed"), sampling_rule("seed")]
TopLogprobs = Annotated[int | None, sampling_schema("top_logprobs"), sampling_rule("top_logprobs")]
RecordEntropy = Annotated[
    bool | None, sampling_schema("record_entropy"), sampling_rule("record_entropy")
]


class SamplingFields(_Strict):
    """Sampling fields shared by the register body and chat requests, each made from its
    declaration (``rollway.sampling_settings``); None: not asked."""

    temperature: Temperature = None
    top_p: TopP = None
    top_k: TopK = None
    max_tokens: MaxTokens = None
    stop: Stop = None
    stop_token_ids: StopTokenIds = None
    seed: Seed = None
    #: Recorded on every turn (and answered where ``logprobs`` is asked): OpenAI's field.
    top_logprobs: TopLogprobs = None
    #: rollway's: record each sampled token's entropy (engines that see the logits).
    record_entropy: RecordEntropy = None

    def sampling_overrides(self) -> dict[str, Any]:
        """The fields that were set, as SamplingParams keyword arguments (held as the
        declaration holds them: stop strings and ids as tuples)."""
        given = {name: getattr(self, name) for name in SAMPLING_NAMES}
        return dict(checked({k: v for k, v in given.items() if v is not None}))


class RegisterRequest(SamplingFields):
    model: str | None = None
    max_turns: int | None = Field(default=None, ge=1)
    max_seq_len: int | None = Field(default=None, ge=2, le=MAX_SEQ_LEN)
    metadata: dict[str, Any] = Field(default_factory=dict)
    max_conversations: int | None = Field(
        default=None,
        ge=1,
        description="Conversations (told apart by their first non-system message) the "
        "rollout may hold before the gateway warns that separate rollouts share its URL "
        "(default 4: a main thread with subagents and side calls).",
    )
    side_calls: Literal["label", "train"] = Field(
        default="label",
        description="Side calls (a conversation offering no tools that opens with a system "
        "prompt the rollout's main one does not: a title, a summary): label them and leave "
        "their samples out of the training view (label), or train on them like any segment "
        "(train).",
    )
    history: Literal["as_sampled", "as_template"] = Field(
        default="as_sampled",
        description="Where the chat template renders earlier answers differently once more "
        "messages follow (Qwen3 drops their thinking at a new question): as_sampled keeps "
        "the sampled ids (one sample), as_template renders as the template does (a new segment).",
    )
    renderer: str | None = Field(
        default=None,
        description="The model family's renderer for this rollout (hermes, qwen3, llama3, "
        "gemma3); default: the gateway's.",
    )

    def sampling(self) -> SamplingParams:
        return SamplingParams(**self.sampling_overrides())


class StreamOptions(BaseModel):
    #: ``include_obfuscation`` and what comes next change nothing here.
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


#: The most choices one request may ask (OpenAI's bound).
MAX_CHOICES = 128

#: Chat-completions fields refused whenever they are set, and why.
_CHAT_REFUSED = {
    "audio": "audio output is not supported: the model answers in text",
    "functions": "the deprecated functions field is not supported: send tools",
    "function_call": "the deprecated function_call field is not supported: send tool_choice",
    "web_search_options": "a hosted web search runs on OpenAI's servers; rollway cannot run "
    "it (give the agent a search tool of its own)",
}


class ChatCompletionRequest(SamplingFields, ApiRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: MaxTokens = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    return_token_ids: bool = Field(
        default=False,
        description="vLLM's extension: the answer also carries the completion's token ids "
        "(choice.token_ids) and rollway.logprobs and rollway.turn_index.",
    )
    continue_final_message: bool = Field(
        default=False,
        description="vLLM's extension (and how an Anthropic prefill is asked): the final "
        "assistant message is continued, not answered; the answer is the continuation.",
    )
    n: int = Field(
        default=1,
        ge=1,
        le=MAX_CHOICES,
        description="That many samples of the same prompt: the first continues the rollout's "
        "conversation, each other is recorded as its own branch (a segment, one exact sample).",
    )
    response_format: dict[str, Any] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: Any = None
    functions: Any = None
    function_call: Any = None
    web_search_options: Any = None
    # Recorded (``RECORDED``): they change nothing sampled for a self-hosted policy.
    user: Any = None
    metadata: Any = None
    store: Any = None
    moderation: Any = None
    prediction: Any = None
    prompt_cache_key: Any = None
    prompt_cache_options: Any = None
    prompt_cache_retention: Any = None
    reasoning_effort: Any = None
    safety_identifier: Any = None
    service_tier: Any = None
    verbosity: Any = None

    RECORDED: ClassVar[tuple[str, ...]] = (
        "user",
        "metadata",
        "store",
        "moderation",
        "prediction",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "reasoning_effort",
        "safety_identifier",
        "service_tier",
        "verbosity",
    )
    #: Fields a Messages or Responses request carried that are recorded with the turn.
    _carried: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _refuse_what_cannot_be_done(self) -> ChatCompletionRequest:
        for name, why in _CHAT_REFUSED.items():
            if getattr(self, name) is not None:
                refuse(name, why)
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                refuse(
                    name, "penalties are not applied by rollway's engines: send 0 or leave it out"
                )
        if self.logit_bias:
            refuse("logit_bias", "logit biases are not applied by rollway's engines")
        if self.modalities is not None and set(self.modalities) - {"text"}:
            refuse("modalities", "the model answers in text only: ask ['text']")
        if self.response_format is not None and self.response_format.get("type") != "text":
            refuse(
                "response_format",
                f"{self.response_format.get('type')!r} needs constrained decoding, which "
                "rollway's engines do not apply: ask for the format in the prompt, or send "
                "{'type': 'text'}",
            )
        if self.n > 1 and self.stream:
            refuse("n", "more than one choice is answered as JSON only: send stream: false")
        return self

    @model_validator(mode="after")
    def _top_logprobs_with_logprobs(self) -> ChatCompletionRequest:
        # OpenAI's rule. An InvalidFieldsError, not a pydantic error: one raised here would be
        # placed at the body, and the caller must read which field to fix.
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidFieldsError(
                "top_logprobs needs logprobs: true (the answer's logprobs carry them): set "
                "logprobs, or leave top_logprobs out",
                param="top_logprobs",
            )
        return self

    def sampling_overrides(self) -> dict[str, Any]:
        data = super().sampling_overrides()
        if self.max_completion_tokens is not None:
            data["max_tokens"] = min(self.max_completion_tokens, data.get("max_tokens", 1 << 30))
        return data

    def tool_dicts(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def message_dicts(self) -> list[dict[str, Any]]:
        messages = [m.model_dump(exclude_none=True) for m in self.messages]
        refuse_non_text(messages)
        return messages

    def carry(self, fields: dict[str, Any]) -> None:
        """Record ``fields`` (another API's recorded fields) with this request's turn."""
        self._carried = fields

    def recorded_fields(self) -> dict[str, Any]:
        return super().recorded_fields() | self._carried


#: Versions stay exact in JSON (a double) and in every integer column a trainer reads.
MAX_VERSION = 2**53


class WeightUpdateRequest(_Strict):
    """``POST /admin/weights``: a checkpoint folder the engine can read (on a remote engine's
    server, a path there), the version it becomes (default: the next), and the pause mode.
    ``loaded``: another gateway sharing the engine's servers loaded it (``--workers``): take the
    version, load nothing (a remote engine only)."""

    source: str = Field(min_length=1, strict=True)
    version: int | None = Field(default=None, ge=0, le=MAX_VERSION, strict=True)
    mode: Literal["abort", "drain", "keep"] = "abort"
    loaded: bool = Field(default=False, strict=True)


class PauseRequest(_Strict):
    """``POST /admin/pause``: how generations in flight are treated (see ``PauseMode``)."""

    mode: Literal["abort", "drain", "keep"] = "abort"
