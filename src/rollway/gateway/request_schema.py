"""Wire models of the gateway: the register body and OpenAI chat-completions requests.

Top-level request bodies forbid unknown fields so that a typo is named, not ignored. Message
objects ignore extra keys: agents echo back whole SDK message objects (``refusal``,
``annotations``, ``audio``...) that carry nothing the template renders.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rollway.checks import MAX_SEQ_LEN
from rollway.errors import InvalidFieldsError
from rollway.generation import MAX_TOP_LOGPROBS, SamplingParams, stop_strings, stop_token_ids


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    """A content part; only text is rendered (images and audio have no place in the prompt)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


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


class SamplingFields(_Strict):
    """Sampling fields shared by the register body and chat requests."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(default=None, ge=-1)
    max_tokens: int | None = Field(default=None, ge=1)
    #: Checked by ``SamplingParams``' own rules (``stop_strings``, ``stop_token_ids``).
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    #: A 64-bit seed: what engines (torch, SGLang, vLLM) accept.
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    #: Recorded on every turn (and answered where ``logprobs`` is asked): OpenAI's field.
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    #: rollway's: record each sampled token's entropy (engines that see the logits).
    record_entropy: bool | None = None

    # Strict even for in-process callers, whose lax mode takes True for 1, "3" for 3 and "no"
    # for false: what a turn records beside its tokens must be what was meant.
    @field_validator("top_logprobs", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        if value is None or (isinstance(value, int) and not isinstance(value, bool)):
            return value
        raise PydanticCustomError(
            "int_type", "must be a whole number, not {given}", {"given": repr(value)}
        )

    @field_validator("stop", "stop_token_ids")
    @classmethod
    def _sampling_rule(cls, value: Any, info: ValidationInfo) -> Any:
        """The rule ``SamplingParams`` applies, so that every surface refuses the same."""
        if value is None:
            return value
        check = stop_strings if info.field_name == "stop" else stop_token_ids
        try:
            check(value)
        except InvalidFieldsError as exc:
            reason = exc.message.removeprefix(f"{info.field_name} ")
            raise PydanticCustomError("sampling_rule", "{reason}", {"reason": reason}) from None
        return value

    @field_validator("record_entropy", mode="before")
    @classmethod
    def _true_or_false(cls, value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        raise PydanticCustomError(
            "bool_type", "must be true or false, not {given}", {"given": repr(value)}
        )

    def sampling_overrides(self) -> dict[str, Any]:
        """The fields that were set, as SamplingParams keyword arguments."""
        data = self.model_dump(
            include={
                "temperature",
                "top_p",
                "top_k",
                "max_tokens",
                "seed",
                "top_logprobs",
                "record_entropy",
            },
            exclude_none=True,
        )
        if data.get("top_k") == -1:
            data["top_k"] = 0
        if self.stop is not None:
            data["stop"] = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if self.stop_token_ids is not None:
            data["stop_token_ids"] = tuple(self.stop_token_ids)
        return data


class RegisterRequest(SamplingFields):
    model: str | None = None
    max_turns: int | None = Field(default=None, ge=1)
    max_seq_len: int | None = Field(default=None, ge=2, le=MAX_SEQ_LEN)
    metadata: dict[str, Any] = Field(default_factory=dict)
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


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    model: str | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    return_token_ids: bool = Field(
        default=False,
        description="vLLM's extension: the answer also carries the completion's token ids "
        "(choice.token_ids) and rollway.logprobs and rollway.turn_index.",
    )
    n: int = Field(default=1, ge=1, le=1)
    frequency_penalty: float | None = Field(default=None, ge=0.0, le=0.0)
    presence_penalty: float | None = Field(default=None, ge=0.0, le=0.0)
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None

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
        return [m.model_dump(exclude_none=True) for m in self.messages]


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
