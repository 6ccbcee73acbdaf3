"""The model's answer, one name per level: an engine is asked with ``SamplingParams`` and
returns a ``GenerationResult`` (token ids; ``GenerationChunk`` as they stream) or, a chat-level
engine (a hosted API), a ``ChatGeneration`` (a message); the gateway turns either into a
recorded turn and answers every chat call, in process or over HTTP, with a ``ChatResult`` (what
``ctx.chat`` returns). Frozen dataclasses: they stay inside a process."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from rollway.errors import InvalidFieldsError

#: A chat message as OpenAI's API sends it (role, content, tool_calls...): a plain dict, because
#: agents and HTTP bodies hand over their own and the gateway keeps them as given.
Message = dict[str, Any]

FinishReason = Literal["stop", "length", "abort"]
#: What a recorded logprob is (vLLM's names): ``raw_logprobs`` is the log-softmax of the model's
#: logits at temperature 1; ``processed_logprobs`` is taken after the temperature reshaped the
#: distribution, ``log_softmax(logits / T)``: the behaviour policy a trainer recomputes at its
#: sampling temperature (vLLM's processed logprobs are also renormalised over the top-p/top-k set).
LogprobKind = Literal["raw_logprobs", "processed_logprobs"]
#: The most top logprobs a turn records per token (OpenAI's and vLLM's chat cap).
MAX_TOP_LOGPROBS = 20
#: The largest token id anything accepts: engines keep ids as int32.
MAX_TOKEN_ID = 2**31 - 1


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How an engine samples, and what it records beside each sampled token. ``top_k=0`` (or
    vLLM's -1, made 0) and ``top_p=1.0`` switch those filters off; ``temperature=0`` means
    greedy decoding. ``top_logprobs`` (0 to 20) records the ids and logprobs of that many most
    likely tokens at each step; ``record_entropy`` records each step's entropy (engines that
    see the logits). Each field is checked as the HTTP schema checks it (``InvalidFieldsError``
    naming the field)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0
    record_entropy: bool = False

    def __post_init__(self) -> None:
        _check_number("temperature", self.temperature, low=0.0)
        _check_number("top_p", self.top_p, low=0.0, high=1.0, above_low=True)
        if self.top_k == -1:
            object.__setattr__(self, "top_k", 0)  # vLLM's and SGLang's "off", as over HTTP
        _check_whole("top_k", self.top_k, low=0, hint=" (0 or -1 switch it off)")
        if self.max_tokens is not None:
            _check_whole("max_tokens", self.max_tokens, low=0)
        if self.seed is not None:
            _check_whole("seed", self.seed, low=-(2**63), high=2**63 - 1)
        object.__setattr__(self, "stop", stop_strings(self.stop))
        object.__setattr__(self, "stop_token_ids", stop_token_ids(self.stop_token_ids))
        top = self.top_logprobs
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidFieldsError(
                f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}, not {top!r}",
                param="top_logprobs",
            )
        # Not merely truthy: "no" would record entropy on every turn.
        if not isinstance(self.record_entropy, bool):
            raise InvalidFieldsError(
                f"record_entropy must be True or False, not {self.record_entropy!r}",
                param="record_entropy",
            )

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


def stop_strings(value: Any) -> tuple[str, ...]:
    """``stop`` as a tuple, checked: the one rule of every surface (the CLI, the config file,
    in-process, HTTP). An empty stop string would end every answer before it began."""
    items = _items("stop", value, str)
    if "" in items:
        raise InvalidFieldsError(
            "stop strings must not be empty (an empty one ends every answer at once): "
            "drop it, or give the text that ends an answer",
            param="stop",
        )
    return items


def stop_token_ids(value: Any) -> tuple[int, ...]:
    """``stop_token_ids`` as a tuple, checked as ``stop_strings`` is: token ids are 0 to
    ``MAX_TOKEN_ID`` (an int32, what engines take); the gateway also checks them against its
    model's vocabulary."""
    items = _items("stop_token_ids", value, int)
    bad = next((i for i in items if not 0 <= i <= MAX_TOKEN_ID), None)
    if bad is not None:
        raise InvalidFieldsError(
            f"stop_token_ids must hold token ids from 0 to {MAX_TOKEN_ID}, not {bad}",
            param="stop_token_ids",
        )
    return items


def _items(name: str, value: Any, kind: type) -> tuple[Any, ...]:
    # One stop string or id is a tuple of one: ``stop="</answer>"`` must not become one stop
    # string per character.
    items = (value,) if isinstance(value, kind) else value
    try:
        items = tuple(items)
    except TypeError:
        raise InvalidFieldsError(
            f"{name} must be a {kind.__name__} or a list of them", param=name
        ) from None
    if not all(isinstance(i, kind) and not isinstance(i, bool) for i in items):
        raise InvalidFieldsError(f"{name} must hold only {kind.__name__}s", param=name)
    return items


def _check_number(
    name: str, value: Any, *, low: float, high: float = math.inf, above_low: bool = False
) -> None:
    """A real number (not a bool, not a string, finite) within ``low`` to ``high``."""
    real = isinstance(value, (int, float)) and not isinstance(value, bool)
    if (
        not real
        or not math.isfinite(value)
        or not low <= value <= high
        or (above_low and value == low)
    ):
        bound = f"above {low:g}" if above_low else f"at least {low:g}"
        upto = f" and at most {high:g}" if math.isfinite(high) else ""
        raise InvalidFieldsError(
            f"{name} must be a number {bound}{upto}, not {value!r}", param=name
        )


def _check_whole(
    name: str, value: Any, *, low: int, high: int | None = None, hint: str = ""
) -> None:
    """A whole number (not a bool) within ``low`` to ``high``."""
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not whole or value < low or (high is not None and value > high):
        within = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise InvalidFieldsError(
            f"{name} must be a whole number {within}{hint}, not {value!r}", param=name
        )


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
