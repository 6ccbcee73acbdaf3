"""The training view: one ``Sample`` per segment of a rollout's turns, with exact ids, a loss
mask and the per-token values aligned with them. The one place samples are built: a
trajectory's ``samples`` (``rollway.trajectory``, which re-exports ``Sample`` and
``build_samples``), the gateway's drift and the export all come here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollway.trajectory_format import Turn


class Sample(BaseModel):
    """The training view of one segment: exact ids, a loss mask and aligned logprobs. A wire
    model: unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    segment: int
    side_call: bool = Field(
        default=False,
        description="A side call's segment (Turn.side_call): not a training sample unless asked.",
    )
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


def build_samples(
    turns: Sequence[Turn], side_calls: set[int] | frozenset[int] = frozenset()
) -> list[Sample]:
    """One training sample per segment of ``turns``: its first prompt, then completions (mask
    1) and each later turn's new prompt ids, the glue (mask 0). Policy versions follow the
    tokens (-1 on glue), where every turn of the segment has them; so do raw logprobs where
    some turn's logprobs are not raw, and the kept mass, top logprobs and entropy where some
    turn of the segment has them. Segments in ``side_calls`` are labelled ``side_call``."""
    samples: dict[int, dict[str, Any]] = {}
    versioned = {t.segment for t in turns if t.policy_versions is not None}
    versioned -= {t.segment for t in turns if t.policy_versions is None}
    scaled = {t.segment for t in turns if t.logprob_kind != "raw_logprobs"}
    scaled -= {t.segment for t in turns if t.segment in scaled and _no_raw(t)}
    recorded = {
        name: {t.segment for t in turns if getattr(t, name) is not None} for name in _BLANKS
    }
    for turn in turns:
        sample = samples.get(turn.segment)
        if sample is None:
            sample = samples[turn.segment] = {
                "segment": turn.segment,
                "side_call": turn.segment in side_calls,
                "prompt_ids": list(turn.new_prompt_ids),
                "response_ids": [],
                "loss_mask": [],
                "logprobs": [],
                "policy_versions": [] if turn.segment in versioned else None,
                "raw_logprobs": [] if turn.segment in scaled else None,
                **{name: [] if turn.segment in recorded[name] else None for name in _BLANKS},
            }
            glue: list[int] = []
        else:
            glue = turn.new_prompt_ids
        tokens = len(turn.completion_ids)
        sample["response_ids"] += glue + turn.completion_ids
        sample["loss_mask"] += [0] * len(glue) + [1] * tokens
        sample["logprobs"] += [0.0] * len(glue) + list(turn.logprobs)
        if sample["policy_versions"] is not None and turn.policy_versions is not None:
            sample["policy_versions"] += [-1] * len(glue) + list(turn.policy_versions)
        if sample["raw_logprobs"] is not None:
            raw = turn.logprobs if turn.logprob_kind == "raw_logprobs" else turn.raw_logprobs
            sample["raw_logprobs"] += _per_token(len(glue), raw, tokens, 0.0)
        for name, blank in _BLANKS.items():
            if sample[name] is not None:
                sample[name] += _per_token(len(glue), getattr(turn, name), tokens, blank)
    return [Sample.model_construct(**samples[k]) for k in sorted(samples)]


#: The per-token lists a sample keeps where some turn of its segment has them, and the value on
#: glue and on a turn without them: a kept mass of 1.0 is a turn that cut nothing.
_BLANKS: dict[str, Any] = {"kept_mass": 1.0, "top_ids": [], "top_logprobs": [], "entropy": 0.0}


def _no_raw(turn: Turn) -> bool:
    return turn.logprob_kind != "raw_logprobs" and turn.raw_logprobs is None


def _per_token(glue: int, values: list[Any] | None, tokens: int, blank: Any) -> list[Any]:
    """A turn's per-token values after its glue (``blank`` there, and on every token of a turn
    that has none)."""
    return [blank] * glue + (list(values) if values is not None else [blank] * tokens)
