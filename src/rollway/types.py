"""Data types that cross seams: sampling, the model's answers, turns, samples, trajectories.

Frozen dataclasses for what stays inside a process; pydantic models for what goes over the wire.

The model's answer has one name per level: an engine returns a ``GenerationResult`` (token
ids) or, a chat-level engine (a hosted API), a ``ChatGeneration`` (a message); the gateway
turns either into a recorded turn and answers every chat call, in process or over HTTP, with a
``ChatResult`` (what ``ctx.chat`` returns). An agent's ``run`` returns an ``AgentResult``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollway import trajectory_format
from rollway.deprecated import deprecated_alias
from rollway.errors import ErrorKind as ErrorKind  # re-exported: defined with its categories
from rollway.errors import InvalidFieldsError
from rollway.trajectory_format import FORMAT_VERSION

FinishReason = Literal["stop", "length", "abort"]
#: What a recorded logprob is (vLLM's names): ``raw_logprobs`` is the log-softmax of the model's
#: logits at temperature 1; ``processed_logprobs`` is taken after the temperature reshaped the
#: distribution, ``log_softmax(logits / T)``: the behaviour policy a trainer recomputes at its
#: sampling temperature (vLLM's processed logprobs are also renormalised over the top-p/top-k set).
LogprobKind = Literal["raw_logprobs", "processed_logprobs"]
#: The most top logprobs a turn records per token (OpenAI's and vLLM's chat cap).
MAX_TOP_LOGPROBS = 20
Status = Literal["completed", "truncated", "error", "timeout", "cancelled"]


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How an engine samples, and what it records beside each sampled token. ``top_k=0`` and
    ``top_p=1.0`` switch those filters off; ``temperature=0`` means greedy decoding.
    ``top_logprobs`` (0 to 20) records the ids and logprobs of that many most likely tokens at
    each step; ``record_entropy`` records each step's entropy (engines that see the logits)."""

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
        # One stop string or id is a tuple of one: ``stop="</answer>"`` must not become one
        # stop string per character.
        for name, kind in (("stop", str), ("stop_token_ids", int)):
            value = getattr(self, name)
            items = (value,) if isinstance(value, kind) else value
            try:
                items = tuple(items)
            except TypeError:
                raise InvalidFieldsError(
                    f"{name} must be a {kind.__name__} or a list of them", param=name
                ) from None
            if not all(isinstance(i, kind) and not isinstance(i, bool) for i in items):
                raise InvalidFieldsError(f"{name} must hold only {kind.__name__}s", param=name)
            object.__setattr__(self, name, items)
        top = self.top_logprobs
        if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidFieldsError(
                f"top_logprobs must be a whole number from 0 to {MAX_TOP_LOGPROBS}, not {top!r}",
                param="top_logprobs",
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


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StepDistribution(_Wire):
    """Per completion id of a turn, what was asked of its step's distribution (the one its
    logprob is taken from, of the turn's logprob_kind)."""

    top_ids: list[list[int]] | None = Field(
        default=None,
        description="The ids of the sampling.top_logprobs most likely tokens at each step, most "
        "likely first; None when not asked or the engine gives none.",
    )
    top_logprobs: list[list[float]] | None = Field(
        default=None, description="The logprobs of top_ids, aligned with them."
    )
    entropy: list[float] | None = Field(
        default=None,
        description="The entropy (nats) of each step's distribution; None when not asked "
        "(sampling.record_entropy) or the engine cannot give it.",
    )

    @staticmethod
    def of(result: GenerationResult) -> StepDistribution | None:
        """What ``result`` holds of it; None when nothing."""
        if result.top_ids is None and result.entropy is None:
            return None
        return StepDistribution.model_construct(
            top_ids=result.top_ids, top_logprobs=result.top_logprobs, entropy=result.entropy
        )


class Turn(_Wire):
    """One model call: the prompt ids it added to its segment and the completion ids sampled.
    Its whole prompt (exactly what the engine got) is ``Trajectory.prompt_ids(index)``."""

    index: int
    segment: int
    request_id: str
    prompt_len: int = Field(
        description="Length of the whole prompt the engine got (behind a chat-level engine, "
        "the prompt tokens it reported: no ids are recorded there)."
    )
    new_prompt_ids: list[int] = Field(
        description="The prompt ids past the previous turn of its segment (that turn's prompt "
        "and completion): the template glue and the new messages. The whole prompt where the "
        "turn starts its segment."
    )
    completion_ids: list[int]
    logprobs: list[float] = Field(description="Engine logprob of each completion id.")
    finish_reason: str
    content: str | None
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    tool_call_parse_error: str | None = Field(
        default=None, description="Set when the completion held a tool call that did not parse."
    )
    sampling: dict[str, Any]
    latency_ms: float
    prompt_hash: str = Field(
        description="sha256 (hex, first 16) of the whole prompt's ids as int32: it proves the "
        "chain of new_prompt_ids (trajectory_format.check_prompt_hashes)."
    )
    policy_versions: list[int] | None = Field(
        default=None,
        description="Weights version that sampled each completion id; None: engine has none.",
    )
    logprob_kind: LogprobKind = Field(
        default="raw_logprobs",
        description="raw_logprobs: temperature-1 log-softmax; processed_logprobs: "
        "log_softmax(logits / T), the sampling temperature's (a trainer must not mix them).",
    )
    raw_logprobs: list[float] | None = Field(
        default=None,
        description="The temperature-1 logprob of each completion id, where the engine gave "
        "them beside processed logprobs; None when logprobs are raw or the engine cannot.",
    )
    kept_mass: list[float] | None = Field(
        default=None,
        description="Per completion id: the mass of the tokens top-p/top-k kept, under "
        "log_softmax(logits / T); None when nothing was cut.",
    )
    distribution: StepDistribution | None = Field(
        default=None,
        description="What the engine saw of each step's distribution beyond the sampled token, "
        "where the sampling asked (top_logprobs, record_entropy); None when nothing was.",
    )
    reissued: int = Field(
        default=0,
        description="Times this turn was aborted (a weight update, or its server was taken out) "
        "and sent again.",
    )
    special_tokens_at: list[int] = Field(
        default_factory=list,
        description="Positions in completion_ids of special tokens the model sampled inside its "
        "answer (a <|im_start|> mid-answer: the model opening a turn of its own); the content "
        "leaves them out. The special token that ends an answer is not one.",
    )

    # One field for the three, read through these: each field a turn has costs every turn
    # held in flight (a turn's __dict__ doubles past 21 fields).
    @property
    def top_ids(self) -> list[list[int]] | None:
        return self.distribution.top_ids if self.distribution else None

    @property
    def top_logprobs(self) -> list[list[float]] | None:
        return self.distribution.top_logprobs if self.distribution else None

    @property
    def entropy(self) -> list[float] | None:
        return self.distribution.entropy if self.distribution else None


class Sample(_Wire):
    """The training view of one segment: exact ids, a loss mask and aligned logprobs."""

    segment: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int] = Field(description="1 on engine-sampled tokens, 0 elsewhere.")
    logprobs: list[float] = Field(description="Aligned with response_ids; 0.0 where mask is 0.")
    policy_versions: list[int] | None = Field(
        default=None,
        description="Aligned with response_ids: the weights version of each sampled token, "
        "-1 where mask is 0; None when the engine has no versions.",
    )
    raw_logprobs: list[float] | None = Field(
        default=None,
        description="Aligned with response_ids: the temperature-1 logprobs (0.0 where mask is "
        "0); None when every turn's logprobs are raw already, or an engine gave none.",
    )
    kept_mass: list[float] | None = Field(
        default=None,
        description="Aligned with response_ids: the mass top-p/top-k kept for each sampled "
        "token (1.0 where nothing was cut and where mask is 0); None when no turn was cut.",
    )
    top_ids: list[list[int]] | None = Field(
        default=None,
        description="Aligned with response_ids: each sampled token's top ids (from "
        "Turn.distribution; [] where mask is 0); None when no turn of the segment has them.",
    )
    top_logprobs: list[list[float]] | None = Field(
        default=None, description="Aligned with top_ids: their logprobs ([] where mask is 0)."
    )
    entropy: list[float] | None = Field(
        default=None,
        description="Aligned with response_ids: each sampled token's entropy (0.0 where mask "
        "is 0); None when no turn of the segment has it.",
    )


def build_samples(turns: list[Turn]) -> list[Sample]:
    """One training sample per segment of ``turns`` (``trajectory_format.sample_fields``)."""
    return [Sample.model_construct(**fields) for fields in trajectory_format.sample_fields(turns)]


class Drift(_Wire):
    """How far the recorded ids are from a fresh render of the final messages."""

    recorded_tokens: int
    rerendered_tokens: int
    first_mismatch: int | None = Field(description="First differing position; None if equal.")
    differing_tokens: int = Field(
        description="Tokens between the common prefix and the common suffix, in both; 0 if equal."
    )


class Trajectory(_Wire):
    """The full record of one rollout. Its turns keep what each added to its segment, so the
    record grows linearly with the conversation (``rollway.trajectory_format``: format 2;
    records of format 1 read into it). ``samples`` and each turn's whole prompt are made from
    the turns on demand."""

    format_version: int = Field(
        default=FORMAT_VERSION, description="The stored format (rollway.trajectory_format)."
    )
    rollout_id: str
    model: str
    sampling: dict[str, Any]
    max_turns: int | None
    max_seq_len: int | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    turns: list[Turn]
    is_truncated: bool = Field(
        description="A turn was cut (finish_reason 'length', its own max_tokens included) or "
        "a gateway limit ended the rollout."
    )
    truncation_reason: str | None = Field(
        description="The gateway limit that ended the rollout (max_turns, max_seq_len); None "
        "when none did, even where a turn was cut."
    )
    is_cancelled: bool
    segment_count: int
    drift: Drift | None
    has_token_ids: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)
    engine_errors: list[str] = Field(
        default_factory=list, description="Engine failures the rollout's calls met (the last 5)."
    )

    @model_validator(mode="before")
    @classmethod
    def _read_older_formats(cls, data: Any) -> Any:
        return trajectory_format.upgrade(data)

    @property
    def samples(self) -> list[Sample]:
        """The training view: one sample per segment (made from the turns on each access;
        none behind a chat-level engine, which records no ids)."""
        return build_samples(self.turns) if self.has_token_ids else []

    def prompt_ids(self, index: int) -> list[int]:
        """The whole prompt the engine got on turn ``index``."""
        return trajectory_format.whole_prompt(self.turns, index)

    def oldest_policy_version(self) -> int | None:
        """The oldest weights version among its sampled tokens (None: no versioned token)."""
        return min((min(t.policy_versions) for t in self.turns if t.policy_versions), default=None)


@dataclass(frozen=True, slots=True)
class AgentResult:
    """What an agent's ``run`` returns: made by ``ctx.complete(...)`` or ``ctx.error(...)``.
    Formerly ``RolloutResult``, a deprecated alias for one release."""

    messages: list[dict[str, Any]]
    finish_reason: str = "stop"
    reward: float | None = None
    error: str | None = None


class RolloutMetrics(_Wire):
    """Counters of one attempt: its context counts the model calls made through ``ctx.chat``
    and the tool calls; an agent that calls the gateway over HTTP instead (a program, an SDK)
    gets its model-call figures from the turns the gateway recorded."""

    llm_calls: int = 0
    llm_latency_ms: float = 0.0
    tool_calls: int = 0
    tool_latency_ms: float = 0.0
    prompt_tokens: int = 0
    response_tokens: int = 0
    max_context: int = 0
    total_latency_ms: float = Field(
        default=0.0,
        description="Wall time of the agent's run, stop included (0: it never started); the "
        "record's elapsed_s spans every attempt.",
    )


class TrajectoryStats(_Wire):
    """What a run summary needs of a trajectory, for records that travel without it."""

    turns: int
    sampled_tokens: int | None = Field(description="None where the engine gave no token ids.")
    turn_latency_ms: list[float]

    @classmethod
    def of(cls, trajectory: Trajectory) -> TrajectoryStats:
        sampled = sum(len(turn.completion_ids) for turn in trajectory.turns)
        return cls(
            turns=len(trajectory.turns),
            sampled_tokens=sampled if trajectory.has_token_ids else None,
            turn_latency_ms=[turn.latency_ms for turn in trajectory.turns],
        )


class RolloutRecord(_Wire):
    """The one recorded outcome of one rollout, as the store keeps it."""

    exp_id: str
    rollout_key: str = Field(description="Stable across reruns: task key + sample index.")
    rollout_id: str = Field(description="The gateway's id of the last attempt.")
    task_index: int
    group_id: str
    group_index: int
    sample_index: int
    status: Status
    error_kind: ErrorKind | None = None
    reason: str | None = None
    reward: float | None = None
    reward_info: dict[str, Any] = Field(default_factory=dict)
    attempts: int = 1
    started_at: float
    elapsed_s: float
    metrics: RolloutMetrics = Field(default_factory=RolloutMetrics)
    messages: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The final conversation the agent passed to ctx.complete or ctx.error; "
        "where it passed none (a program agent, a timeout), the gateway's recorded one.",
    )
    finish_reason: str | None = Field(
        default=None,
        description="Why the agent ended, as it told ctx.complete (stop, max_steps, ...); "
        "error from ctx.error; None when it returned nothing (timeout, cancel, a raise).",
    )
    task: dict[str, Any] = Field(default_factory=dict)
    cleanup_errors: list[str] = Field(default_factory=list)
    run_id: str | None = Field(default=None, description="The batch (or invoke) it was run in.")
    policy_version: int | None = Field(
        default=None,
        description="The oldest weights version that sampled any of its tokens (staleness is "
        "the latest version minus this); None without versioned tokens.",
    )
    trajectory: Trajectory | None = None
    trajectory_stats: TrajectoryStats | None = Field(
        default=None, description="Set on light copies, whose trajectory stays in the store."
    )

    @model_validator(mode="before")
    @classmethod
    def _conversation_once(cls, data: Any) -> Any:
        """A stored record's trajectory may keep its conversation as a count of the record's
        messages (``stored``)."""
        trajectory = data.get("trajectory") if isinstance(data, dict) else None
        if isinstance(trajectory, dict) and "messages_in_record" in trajectory:
            trajectory = dict(trajectory)
            count = trajectory.pop("messages_in_record")
            messages = data.get("messages")
            whole = isinstance(count, int) and not isinstance(count, bool)
            if not whole or not isinstance(messages, list) or not 0 <= count <= len(messages):
                raise ValueError("trajectory.messages_in_record: not a count of the messages")
            trajectory.setdefault("messages", messages[:count])
            data = {**data, "trajectory": trajectory}
        return data

    @property
    def success(self) -> bool:
        return self.status in ("completed", "truncated")

    def stored(self) -> bytes:
        """The record as a store keeps it: JSON, with the final conversation once. Where the
        trajectory's conversation begins the record's (the agent ended on the gateway's, or
        added tool results after it), the trajectory keeps only how many of the record's
        messages it is (``messages_in_record``); reading it back puts them in again."""
        trajectory = self.trajectory
        count = len(trajectory.messages) if trajectory is not None else 0
        if trajectory is None or not count or self.messages[:count] != trajectory.messages:
            return self.model_dump_json().encode()
        # Spliced at the ends of the two objects: a field's text never holds a bare brace.
        record = self.model_dump_json(exclude={"trajectory"})
        inner = trajectory.model_dump_json(exclude={"messages"})
        marked = f'{inner[:-1]},"messages_in_record":{count}}}'
        return f'{record[:-1]},"trajectory":{marked}}}'.encode()

    def light(self) -> RolloutRecord:
        """This record without its trajectory (kept in the store), with the trajectory's
        figures: what a Ray worker sends back to the driver."""
        if self.trajectory is None:
            return self
        stats = TrajectoryStats.of(self.trajectory)
        return self.model_copy(update={"trajectory": None, "trajectory_stats": stats})


RunStatus = Literal["running", "completed", "error", "timeout", "cancelled"]


class AgentReport(_Wire):
    """What an agent server reports about one rollout it ran: to the client's callback, to
    the store (``agent-reports/<run_key>.json``) and from its status route. The trajectory is
    not here: the gateway that recorded it hands it to the client."""

    run_key: str = Field(description="The idempotency key the rollout was started with.")
    rollout_id: str
    agent: str
    status: RunStatus
    error_kind: ErrorKind | None = None
    reason: str | None = None
    messages: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str | None = None
    reward: float | None = None
    metrics: RolloutMetrics = Field(default_factory=RolloutMetrics)
    started_at: float
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.status != "running"


#: Renamed types, importable under their old names (with a DeprecationWarning) for one release.
_RENAMED = {"RolloutResult": ("AgentResult", AgentResult)}


def __getattr__(name: str) -> Any:
    return deprecated_alias(__name__, name, _RENAMED)
