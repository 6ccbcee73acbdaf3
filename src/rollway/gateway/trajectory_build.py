"""A rollout's Trajectory built from its state at the gateway, and the drift figure (its last
segment's ids against a fresh render). Samples are built by ``rollway.samples``: the drift
needs the last segment's."""

from __future__ import annotations

import logging

from rollway.gateway.conversations import side_call_segments
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.rollout_state import RolloutState
from rollway.samples import Sample, build_samples
from rollway.trajectory import Drift, Trajectory, truncation_reason

log = logging.getLogger(__name__)


def measure_drift(
    state: RolloutState, samples: list[Sample], renderer: ChatRenderer
) -> Drift | None:
    """Compare the last segment's ids with a fresh render of the final messages. None where
    the template cannot render them, the reason logged: the record is whole without the
    figure (its turns are what was sampled), so it is never a failure of the trajectory."""
    last = samples[-1]
    last_turn = state.last_in_segment(last.segment)
    # In flight a turn's ids are an array (``Turn.as_recorded``): the tokenizer takes a list.
    glue = renderer.closing_glue(list(last_turn.completion_ids)) if last_turn else None
    closing = renderer.encode(glue) if glue is not None else []
    recorded = last.prompt_ids + last.response_ids + closing
    try:
        fresh = renderer.transcript_ids(state.messages, state.tools)
    except Exception as error:  # a template's own refusal (raise_exception) or its bug
        log.warning(
            "rollout %s: no drift figure: the %s renderer cannot render its final messages "
            "afresh (%s: %s)",
            state.rollout_id,
            renderer.name,
            type(error).__name__,
            error,
        )
        return None
    return compare_ids(recorded, fresh)


def compare_ids(recorded: list[int], fresh: list[int]) -> Drift:
    """The drift figure in linear time: the common prefix gives the first mismatch, and the
    common prefix and suffix together bound the differing window (see docs/trajectory.md).
    A full diff would be quadratic on repetitive ids, which a collapsing policy produces."""
    sizes = {"recorded_tokens": len(recorded), "rerendered_tokens": len(fresh)}
    if recorded == fresh:  # the common case, compared in C
        return Drift(**sizes, first_mismatch=None, differing_tokens=0)
    shorter = min(len(recorded), len(fresh))
    prefix = next((i for i in range(shorter) if recorded[i] != fresh[i]), shorter)
    room = shorter - prefix
    suffix = next((i for i in range(room) if recorded[-1 - i] != fresh[-1 - i]), room)
    window = len(recorded) + len(fresh) - 2 * (prefix + suffix)
    return Drift(**sizes, first_mismatch=prefix, differing_tokens=window)


def build_trajectory(state: RolloutState, renderer: ChatRenderer) -> Trajectory:
    """The rollout's record, with its one truncation truth (``trajectory.truncation_reason``:
    a gateway limit, or its last turn cut)."""
    # Drift needs the last segment's sample only; the trajectory makes every sample on demand.
    turns = [turn.as_recorded() for turn in state.turns]
    # The last turn's segment, the last answered thread's (``state.messages`` is its
    # conversation); a branch (another of ``n`` choices) may have a later number.
    last = turns[-1].segment if turns else None
    tail = [turn for turn in turns if turn.segment == last]
    samples = build_samples(tail) if state.has_token_ids and tail else []
    truncated = truncation_reason(state.turns, state.truncation_reason)
    return Trajectory(
        rollout_id=state.rollout_id,
        model=state.model,
        sampling=state.sampling.to_dict(),
        max_turns=state.max_turns,
        max_seq_len=state.max_seq_len,
        messages=state.messages,
        tools=state.tools,
        turns=turns,
        is_truncated=truncated is not None,
        truncation_reason=truncated,
        is_cancelled=state.cut_by_cancel,
        engine_errors=list(state.engine_errors),
        segment_count=state.segment_count,
        conversations=max(len(state.openings), 1) if state.turns else 0,
        side_calls=side_call_segments(state),
        drift=measure_drift(state, samples, renderer) if samples else None,
        has_token_ids=state.has_token_ids,
        metadata=state.metadata,
        request_fields=list(state.request_fields),
        refusals=state.refusals,
    )
