"""The model's answer, one name per level: an engine is asked with ``SamplingParams`` and
returns a ``GenerationResult`` (token ids; ``GenerationChunk`` as they stream) or, a chat-level
engine (a hosted API), a ``ChatGeneration`` (a message); the gateway turns either into a
recorded turn and answers every chat call, in process or over HTTP, with a ``ChatResult`` (what
``ctx.chat`` returns). Frozen dataclasses: they stay inside a process."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from rollway.sampling_settings import MAX_TOP_LOGPROBS as MAX_TOP_LOGPROBS
from rollway.sampling_settings import SETTING, SETTINGS

#: A chat message as OpenAI's API sends it (role, content, tool_calls...): a plain dict, because
#: agents and HTTP bodies hand over their own and the gateway keeps them as given.
Message = dict[str, Any]

FinishReason = Literal["stop", "length", "abort"]
#: What a recorded logprob is (vLLM's names): ``raw_logprobs`` is the log-softmax of the model's
#: logits at temperature 1; ``processed_logprobs`` is taken after the temperature reshaped the
#: distribution, ``log_softmax(logits / T)``: the behaviour policy a trainer recomputes at its
#: sampling temperature (vLLM's processed logprobs are also renormalised over the top-p/top-k set).
LogprobKind = Literal["raw_logprobs", "processed_logprobs"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How an engine samples, and what it records beside each sampled token. ``top_k=0`` (or
    vLLM's -1, made 0) and ``top_p=1.0`` switch those filters off; ``temperature=0`` means
    greedy decoding. ``top_logprobs`` (0 to 20) records the ids and logprobs of that many most
    likely tokens at each step; ``record_entropy`` records each step's entropy (engines that
    see the logits). Each field is declared once, in ``rollway.sampling_settings`` (type,
    range, default): checked here by the rule every surface applies (``InvalidFieldsError``
    naming the field)."""

    temperature: float = SETTING["temperature"].default
    top_p: float = SETTING["top_p"].default
    top_k: int = SETTING["top_k"].default
    max_tokens: int | None = SETTING["max_tokens"].default
    stop: tuple[str, ...] = SETTING["stop"].default
    stop_token_ids: tuple[int, ...] = SETTING["stop_token_ids"].default
    seed: int | None = SETTING["seed"].default
    top_logprobs: int = SETTING["top_logprobs"].default
    record_entropy: bool = SETTING["record_entropy"].default

    def __post_init__(self) -> None:
        for setting in SETTINGS:
            value = getattr(self, setting.name)
            held = setting.check(value)
            if held is not value:
                object.__setattr__(self, setting.name, held)

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        # By hand: dataclasses.asdict deep-copies recursively, a cost on every recorded turn.
        fields: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "stop_token_ids": list(self.stop_token_ids),
            "seed": self.seed,
        }
        # What to record beside the tokens, only where asked: most turns ask nothing, and a
        # turn's sampling dict is kept on every recorded turn.
        if self.top_logprobs:
            fields["top_logprobs"] = self.top_logprobs
        if self.record_entropy:
            fields["record_entropy"] = True
        return fields


@dataclass(frozen=True, slots=True)
class GenerationResult:
    """What an engine sampled: token ids, the logprob of each, and why it stopped.

    ``policy_versions`` holds, per output id, the weights version that sampled it (None from
    engines without versions); a generation that ran across a ``keep`` update has two.
    ``logprobs`` are of ``logprob_kind``; ``raw_logprobs`` are the temperature-1 ones beside
    them, where the engine computes both and they differ (None: ``logprobs`` are raw, or the
    engine cannot tell). ``kept_mass`` is, per token, the probability mass of the tokens top-p
    and top-k left to sample from under ``log_softmax(logits / T)`` (None: nothing was cut).
    ``top_ids``/``top_logprobs`` are, per token, the ``sampling.top_logprobs`` most likely ids
    and their logprobs (of ``logprob_kind``), most likely first; ``entropy`` is, per token, the
    entropy in nats of the distribution ``logprobs`` are taken from (None: not asked, or the
    engine cannot give it)."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    policy_versions: list[int] | None = None
    logprob_kind: LogprobKind = "raw_logprobs"
    raw_logprobs: list[float] | None = None
    kept_mass: list[float] | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None
    entropy: list[float] | None = None


@dataclass(frozen=True, slots=True)
class GenerationChunk:
    """Tokens a streaming engine sampled since its last chunk (``engines.base.StreamingEngine``).

    ``output_ids``, ``logprobs`` and ``policy_versions`` are the new tokens only (a chunk may
    carry none, e.g. the last one of an aborted request). ``finish_reason`` is None until the
    last chunk, which has it; the chunks of one request, concatenated, are its
    ``GenerationResult`` (``engines.streaming.collect``), every per-token list included."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None = None
    policy_versions: list[int] | None = None
    logprob_kind: LogprobKind = "raw_logprobs"
    raw_logprobs: list[float] | None = None
    kept_mass: list[float] | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None
    entropy: list[float] | None = None

    @staticmethod
    def join(parts: list[GenerationChunk]) -> GenerationChunk:
        """``parts`` of one request as one chunk, finished as the last part is. A per-token
        list is kept where every part with tokens has it (an empty abort chunk has none)."""
        full = [part for part in parts if part.output_ids] or parts[:1]

        def joined(name: str) -> list[Any] | None:
            lists = [getattr(part, name) for part in full]
            if any(values is None for values in lists):
                return None
            return [value for values in lists for value in values]

        return GenerationChunk(
            [token for part in parts for token in part.output_ids],
            [logprob for part in parts for logprob in part.logprobs],
            parts[-1].finish_reason,
            joined("policy_versions"),
            full[-1].logprob_kind,
            joined("raw_logprobs"),
            joined("kept_mass"),
            joined("top_ids"),
            joined("top_logprobs"),
            joined("entropy"),
        )

    def result(self) -> GenerationResult:
        """This chunk as a result (its finish reason must be set)."""
        assert self.finish_reason is not None
        return GenerationResult(
            self.output_ids,
            self.logprobs,
            self.finish_reason,
            logprob_kind=self.logprob_kind,
            **{name: getattr(self, name) for name in PER_TOKEN_EXTRAS},
        )


#: The optional per-token lists a result and a chunk carry.
PER_TOKEN_EXTRAS = (
    "policy_versions",
    "raw_logprobs",
    "kept_mass",
    "top_ids",
    "top_logprobs",
    "entropy",
)


@dataclass(frozen=True, slots=True)
class ChatGeneration:
    """What a chat-level engine (a hosted API) answered: a message, no token ids. The
    engine-level twin of ``GenerationResult``: the gateway records it as a turn and answers
    with a ``ChatResult``."""

    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[float] | None = None


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The gateway's answer to one chat call, whoever asked (``ctx.chat``, an agent server, an
    HTTP client): the assistant message, usage, and what was sampled.

    ``completion_ids`` and ``logprobs`` are the recorded turn's own; ``completion_ids`` is None
    behind a chat-level engine, which gives no ids. ``turn_index`` is the turn's place in the
    trajectory; None when no turn was recorded (an answer past a limit, made without the engine).
    ``stop_sequence`` is the stop string that ended the answer, if one did (Anthropic's
    ``stop_sequence``). ``top_ids``/``top_logprobs`` are the turn's, where its sampling asked
    for top logprobs (``Turn.top_ids``).
    """

    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    turn_index: int | None = None
    stop_sequence: str | None = None
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None

    @property
    def content(self) -> str | None:
        return self.message.get("content")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.message.get("tool_calls") or []

    @property
    def usage(self) -> dict[str, int]:
        """OpenAI's usage object."""
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": total,
        }


__all__ = [
    "MAX_TOP_LOGPROBS",
    "PER_TOKEN_EXTRAS",
    "ChatGeneration",
    "ChatResult",
    "FinishReason",
    "GenerationChunk",
    "GenerationResult",
    "LogprobKind",
    "Message",
    "SamplingParams",
]
