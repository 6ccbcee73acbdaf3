"""How a rollout's turns become training samples (one per segment: prompt, then completions
under mask 1 and glue under mask 0), a drift figure and the trajectory a trainer reads."""

from __future__ import annotations

from rollway.gateway.chat_template import ChatRenderer
from rollway.gateway.rollout_state import RolloutState
from rollway.types import Drift, Sample, Trajectory, Turn


def build_samples(turns: list[Turn]) -> list[Sample]:
    """One sample per segment: the first prompt, then completions (mask 1) and glue (mask 0).
    Policy versions follow the tokens (-1 on glue), where every turn of the segment has them;
    so do raw logprobs where some turn's logprobs are not raw, and the kept mass where some
    turn's sampling cut the vocabulary (see ``_per_token``)."""
    samples: dict[int, Sample] = {}
    consumed: dict[int, int] = {}
    versioned = {t.segment for t in turns if t.policy_versions is not None}
    versioned -= {t.segment for t in turns if t.policy_versions is None}
    scaled = {t.segment for t in turns if t.logprob_kind != "raw_logprobs"}
    scaled -= {t.segment for t in turns if t.segment in scaled and _no_raw(t)}
    cut = {t.segment for t in turns if t.kept_mass is not None}
    for turn in turns:
        sample = samples.get(turn.segment)
        if sample is None:
            sample = samples[turn.segment] = Sample(
                segment=turn.segment,
                prompt_ids=list(turn.prompt_ids),
                response_ids=[],
                loss_mask=[],
                logprobs=[],
                policy_versions=[] if turn.segment in versioned else None,
                raw_logprobs=[] if turn.segment in scaled else None,
                kept_mass=[] if turn.segment in cut else None,
            )
            consumed[turn.segment] = len(turn.prompt_ids)
        glue = turn.prompt_ids[consumed[turn.segment] :]
        sample.response_ids += glue + turn.completion_ids
        sample.loss_mask += [0] * len(glue) + [1] * len(turn.completion_ids)
        sample.logprobs += [0.0] * len(glue) + list(turn.logprobs)
        if sample.policy_versions is not None and turn.policy_versions is not None:
            sample.policy_versions += [-1] * len(glue) + list(turn.policy_versions)
        if sample.raw_logprobs is not None:
            raw = turn.logprobs if turn.logprob_kind == "raw_logprobs" else turn.raw_logprobs
            sample.raw_logprobs += _per_token(len(glue), raw, len(turn.completion_ids), 0.0)
        if sample.kept_mass is not None:
            kept = turn.kept_mass
            sample.kept_mass += _per_token(len(glue), kept, len(turn.completion_ids), 1.0)
        consumed[turn.segment] = len(turn.prompt_ids) + len(turn.completion_ids)
    return [samples[k] for k in sorted(samples)]


def _no_raw(turn: Turn) -> bool:
    return turn.logprob_kind != "raw_logprobs" and turn.raw_logprobs is None


def _per_token(glue: int, values: list[float] | None, tokens: int, blank: float) -> list[float]:
    """A turn's per-token values after its glue (``blank`` there, and on every token of a turn
    that has none: a kept mass of 1.0 is a turn that cut nothing)."""
    return [blank] * glue + (list(values) if values is not None else [blank] * tokens)


def measure_drift(state: RolloutState, samples: list[Sample], renderer: ChatRenderer) -> Drift:
    """Compare the last segment's ids with a fresh render of the final messages."""
    last = samples[-1]
    last_turn = state.last_in_segment(last.segment)
    closing = renderer.encode(renderer.closing_glue(last_turn.completion_ids)) if last_turn else []
    recorded = last.prompt_ids + last.response_ids + closing
    fresh = renderer.transcript_ids(state.messages, state.tools)
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
    """The rollout's record. ``is_truncated``: a turn was cut (finish ``length``: the request's
    own ``max_tokens`` counts) or a gateway limit ended the rollout; ``truncation_reason`` names
    the gateway limit (``max_turns``, ``max_seq_len``), None where only a turn was cut."""
    samples = build_samples(state.turns) if state.has_token_ids else []
    cut_turn = any(turn.finish_reason == "length" for turn in state.turns)
    return Trajectory(
        rollout_id=state.rollout_id,
        model=state.model,
        sampling=state.sampling.to_dict(),
        max_turns=state.max_turns,
        max_seq_len=state.max_seq_len,
        messages=state.messages,
        tools=state.tools,
        turns=state.turns,
        samples=samples,
        is_truncated=cut_turn or state.truncation_reason is not None,
        truncation_reason=state.truncation_reason,
        is_cancelled=state.cut_by_cancel,
        engine_errors=list(state.engine_errors),
        segment_count=state.segment_count,
        drift=measure_drift(state, samples, renderer) if samples else None,
        has_token_ids=state.has_token_ids,
        metadata=state.metadata,
    )
