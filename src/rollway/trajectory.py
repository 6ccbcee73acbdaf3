"""What the gateway records: a rollout's ``Trajectory`` of ``Turn``s (each with its
``StepDistribution`` where asked), the training ``Sample``s made from them (built in
``rollway.samples``, public here), and the ``Drift`` from a fresh render. Pydantic models: they
go over the wire and into stores."""

from __future__ import annotations

from array import array
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollway import trajectory_format
from rollway.errors import BadRecordError
from rollway.generation import GenerationResult, LogprobKind
from rollway.samples import Sample, build_samples
from rollway.trajectory_format import FORMAT_VERSION


class WireModel(BaseModel):
    """A wire model: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")


class StepDistribution(WireModel):
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


class Turn(WireModel):
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

    def as_recorded(self) -> Turn:
        """This turn with lists where it holds arrays: the gateway keeps a turn in flight with
        its ids as ``array("i")`` and its logprobs as ``array("d")`` (float64, so the values
        recorded are the engine's, exactly), 4 and 8 bytes an element where a list takes 8 a
        pointer and 32 more an int or float. The record, its JSON and its samples get lists."""
        arrays = {
            name: value.tolist()
            for name in ("new_prompt_ids", "completion_ids", "logprobs")
            if isinstance(value := getattr(self, name), array)
        }
        return self.model_copy(update=arrays) if arrays else self

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


class TurnFields(WireModel):
    """What a request sent that changed nothing sampled or rendered (``metadata``,
    ``service_tier``, an effort hint, a cache marker...), kept with the turn it made."""

    turn: int = Field(description="The turn's index.")
    fields: dict[str, Any] = Field(description="The fields as sent, by their API's names.")


class Refusals(WireModel):
    """The 4xx answers the gateway gave a rollout's agent (a field it cannot honour, a
    malformed request): how many, and the first one."""

    count: int
    first_status: int
    first_body: dict[str, Any] = Field(description="The first refusal's body, as answered.")


class Drift(WireModel):
    """How far the recorded ids are from a fresh render of the final messages."""

    recorded_tokens: int
    rerendered_tokens: int
    first_mismatch: int | None = Field(description="First differing position; None if equal.")
    differing_tokens: int = Field(
        description="Tokens between the common prefix and the common suffix, in both; 0 if equal."
    )


def truncation_reason(turns: list[Turn], gateway_limit: str | None) -> str | None:
    """Why a rollout was truncated, decided once (the gateway's record carries it): the gateway
    limit that ended it (``max_turns``, ``max_seq_len``), else ``max_tokens`` where its last turn
    was cut at its token budget (finish ``length``: the request's ``max_tokens``, or the room
    the model's context left). A turn cut before the last, after which the rollout went on,
    shows on that turn only. None: it ended on its own."""
    if gateway_limit is not None:
        return gateway_limit
    return "max_tokens" if turns and turns[-1].finish_reason == "length" else None


class Trajectory(WireModel):
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
        description="The rollout was cut short: a gateway limit ended it or its last turn "
        "was cut (truncation_reason says which; the one truth its record and export carry)."
    )
    truncation_reason: str | None = Field(
        description="Why it was truncated: max_turns or max_seq_len (a gateway limit ended "
        "it), max_tokens (its last turn was cut at its token budget: finish_reason 'length'); "
        "None exactly when it was not truncated."
    )
    is_cancelled: bool
    segment_count: int
    side_calls: list[int] = Field(
        default_factory=list,
        description="Segments that are side calls (a title, a summary: a conversation that "
        "offers no tools and opens with a system prompt the main one, the first to offer "
        "tools, does not open with); their samples are labelled and left out of samples.",
    )
    conversations: int = Field(
        default=1,
        description="Conversations its calls held, told apart by their first non-system "
        "message (a main thread, its subagents and side calls); past the registration's "
        "max_conversations the gateway warned that separate rollouts may share its URL.",
    )
    drift: Drift | None
    has_token_ids: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)
    engine_errors: list[str] = Field(
        default_factory=list, description="Engine failures the rollout's calls met (the last 5)."
    )
    # Left out of a record when empty: records of rollouts that had neither stay as they were.
    request_fields: list[TurnFields] = Field(
        default_factory=list,
        description="Fields of the requests that changed nothing sampled, by turn.",
        exclude_if=lambda fields: not fields,
    )
    refusals: Refusals | None = Field(
        default=None,
        description="The 4xx answers its agent got; None: none.",
        exclude_if=lambda refusals: refusals is None,
    )

    @model_validator(mode="before")
    @classmethod
    def _read_older_formats(cls, data: Any) -> Any:
        return trajectory_format.upgrade(data)

    @model_validator(mode="after")
    def _one_truncation_truth(self) -> Trajectory:
        """Records written before the reason was always named (``is_truncated`` for a cut turn
        anywhere, reason null) read with the truth as it is now decided."""
        if self.truncation_reason is None:
            cut = self.is_truncated
            self.truncation_reason = truncation_reason(self.turns, None) if cut else None
        self.is_truncated = self.truncation_reason is not None
        return self

    @property
    def samples(self) -> list[Sample]:
        """The training view: one sample per segment, side calls' left out (made from the
        turns on each access; none behind a chat-level engine, which records no ids). Turns
        whose token data do not line up (``check``) are a ``BadRecordError`` naming the
        rollout and the turn."""
        return [sample for sample in self.all_samples if not sample.side_call]

    @property
    def all_samples(self) -> list[Sample]:
        """Every segment's sample, side calls' too (each labelled ``side_call``)."""
        if not self.has_token_ids:
            return []
        self.check()
        return build_samples(self.turns, set(self.side_calls))

    def check(self) -> None:
        """Refuse turns a sample cannot be made of: per-token lists not one per completion id
        (logprobs, versions, distribution fields), ids outside int32, or a chain of prompts
        that does not hash to each turn's ``prompt_hash`` (``trajectory_format.check_turns``);
        a ``BadRecordError`` naming the rollout and the turns."""
        problems = trajectory_format.check_turns(self.turns) if self.has_token_ids else []
        if problems:
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            raise BadRecordError.of(f"rollout {self.rollout_id}", "; ".join(problems[:3]) + more)

    def prompt_ids(self, index: int) -> list[int]:
        """The whole prompt the engine got on turn ``index``."""
        return trajectory_format.whole_prompt(self.turns, index)

    def oldest_policy_version(self) -> int | None:
        """The oldest weights version among its sampled tokens (None: no versioned token)."""
        return min((min(t.policy_versions) for t in self.turns if t.policy_versions), default=None)


__all__ = ["Drift", "Sample", "StepDistribution", "Trajectory", "Turn", "build_samples"]
