"""Samples laid out as token streams: each turn's span in its segment's stream, drift's start
in the last segment."""

from __future__ import annotations

from typing import Any

from rollway.trajectory import Drift, Trajectory
from rollway.viewer.token_view import sample_views
from tests.trajectories import chain


def turn(index: int, segment: int, prompt: list[int], completion: list[int]) -> dict[str, Any]:
    return dict(index=index, segment=segment, request_id=f"r{index}", prompt_ids=prompt,
                completion_ids=completion, logprobs=[-0.5] * len(completion),
                finish_reason="stop", content="", sampling={}, latency_ms=1.0,
                prompt_hash="0" * 16, policy_versions=[index] * len(completion))  # fmt: skip


def trajectory(drift_at: int | None) -> Trajectory:
    turns = chain(
        [
            turn(0, 0, [1, 2, 3], [4, 5]),
            turn(1, 0, [1, 2, 3, 4, 5, 6, 7], [8]),  # glue 6, 7 between the turns
            turn(2, 1, [1, 9], [10, 11, 12]),  # the history was rewritten: a new segment
        ]
    )
    drift = Drift(recorded_tokens=6, rerendered_tokens=6, first_mismatch=drift_at,
                  differing_tokens=0 if drift_at is None else 2)  # fmt: skip
    return Trajectory(
        rollout_id="r", model="m", sampling={}, max_turns=None, max_seq_len=None, messages=[],
        tools=None, turns=turns, is_truncated=False,
        truncation_reason=None, is_cancelled=False, segment_count=2, drift=drift,
    )  # fmt: skip


def test_each_segment_is_a_stream_with_its_turns_spans() -> None:
    first, second = sample_views(trajectory(None))
    assert first["ids"] == [1, 2, 3, 4, 5, 6, 7, 8] and first["prompt_len"] == 3
    assert first["loss_mask"] == [1, 1, 0, 0, 1]
    assert first["policy_versions"] == [0, 0, -1, -1, 1]
    assert [(t["index"], t["start"], t["end"]) for t in first["turns"]] == [(0, 3, 5), (1, 7, 8)]
    assert second["ids"] == [1, 9, 10, 11, 12] and second["loss_mask"] == [1, 1, 1]
    assert [(t["index"], t["start"], t["end"]) for t in second["turns"]] == [(2, 2, 5)]
    assert first["drift_at"] is second["drift_at"] is None


def test_drift_is_marked_in_the_last_segment_where_it_falls_inside() -> None:
    assert [v["drift_at"] for v in sample_views(trajectory(3))] == [None, 3]
    # Past the recorded ids: in the closing glue, which no sample holds.
    assert [v["drift_at"] for v in sample_views(trajectory(5))] == [None, None]
