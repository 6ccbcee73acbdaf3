"""The viewer's views for RL runs, through its JSON API: a folded rollout's whole conversation
(earlier segments rebuilt from their turns, few-shot messages marked), reward and completion per
policy version, GRPO advantages in the listing and among a rollout's siblings, and per-token
entropy where the run recorded it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from rollway.results import RolloutRecord
from rollway.store import FileStore
from rollway.viewer import create_viewer_app, open_run
from tests.viewer.conftest import FOLDED_ID, RealRun
from tests.viewer.test_listing_scale import small_record


@pytest.fixture(scope="module")
def folded(folded_run: RealRun) -> Iterator[tuple[RolloutRecord, dict[str, Any]]]:
    record = FileStore(folded_run.folder.parent, FOLDED_ID).get("fold.0")
    assert record is not None and record.trajectory is not None
    with TestClient(create_viewer_app(open_run(str(folded_run.folder)))) as client:
        yield record, client.get("/api/rollouts/fold.0").json()


def test_a_folded_rollouts_earlier_segment_is_rebuilt_from_its_turns(
    folded: tuple[RolloutRecord, dict[str, Any]], folded_run: RealRun
) -> None:
    record, detail = folded
    trajectory = record.trajectory
    assert trajectory is not None and trajectory.segment_count == 2
    first, last = detail["conversation"]
    early = [t for t in trajectory.turns if t.segment == 0]
    assert (first["segment"], first["turns"]) == (0, [t.index for t in early]) == (0, [0, 1])
    assert [p["kind"] for p in first["parts"]] == ["prompt", "reply", "between", "reply"]
    prompt, reply0, between, reply1 = first["parts"]
    tokenizer = folded_run.renderer.tokenizer
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    assert prompt["text"] == decode(early[0].new_prompt_ids)
    assert prompt["tokens"] == early[0].prompt_len == len(early[0].new_prompt_ids)
    # The example's tool output, which the fold dropped: visible in the segment it was in.
    assert "add(3, 4) = 7; " * 30 in prompt["text"]
    assert not any("add(3, 4) = 7;" in str(m.get("content")) for m in trajectory.messages)
    assert between["text"] == decode(early[1].new_prompt_ids) and "Go on." in between["text"]
    assert between["tokens"] == len(early[1].new_prompt_ids)
    for part, turn in ((reply0, early[0]), (reply1, early[1])):
        assert part["turn"] == turn.index and part["message"]["content"] == turn.content
    assert last["segment"] == 1 and last["turns"] == [2] and "parts" not in last
    assert [m["message"] for m in last["messages"]] == trajectory.messages


def test_few_shot_messages_are_marked_and_replies_tied_to_their_turns(
    folded: tuple[RolloutRecord, dict[str, Any]],
) -> None:
    _, detail = folded
    messages = detail["conversation"][-1]["messages"]
    assistant = [m for m in messages if m["message"]["role"] == "assistant"]
    assert [(m["turn"], m["turn_segment"], m["not_sampled"]) for m in assistant] == [
        (None, None, True),  # the example's tool call
        (None, None, True),  # the example's answer
        (0, 0, False),
        (1, 0, False),
        (2, 1, False),
    ]
    assert not any(m["not_sampled"] for m in messages if m["message"]["role"] != "assistant")


def test_entropy_comes_with_each_token_page_where_the_run_recorded_it(
    folded: tuple[RolloutRecord, dict[str, Any]], real_run: RealRun
) -> None:
    record, detail = folded
    assert record.trajectory is not None
    samples = record.trajectory.samples
    assert [v["entropy"] for v in detail["samples"]] == [s.entropy for s in samples]
    assert all(s.entropy and any(e > 0 for e in s.entropy) for s in samples)
    with TestClient(create_viewer_app(open_run(str(real_run.folder)))) as client:
        default = client.get("/api/rollouts/add.0").json()  # record_entropy left at False
        page = client.get("/api/rollouts/add.0/tokens?segment=0&offset=0").json()
    assert [v["entropy"] for v in default["samples"]] == [None] and page["entropy"] is None


def versioned_run(tmp_path) -> list[RolloutRecord]:
    """Groups of four over policy versions 0 and 1 (and rollouts with none): rewards spread,
    a flat group, an agent error (scored 0 when rewarded, else not) and an engine failure
    (never scored)."""
    rows = [  # task, sample, version, status, error_kind, reward
        (0, 0, 0, "completed", None, 1.0), (0, 1, 0, "completed", None, 0.0),
        (0, 2, 0, "completed", None, 0.5), (0, 3, 0, "error", "engine", 1.0),
        (1, 0, 1, "completed", None, 1.0), (1, 1, 1, "truncated", None, 1.0),
        (1, 2, 1, "error", "agent", None), (1, 3, 1, "completed", None, 1.0),
        (2, 0, 1, "completed", None, 0.25), (2, 1, None, "error", "agent", 0.0),
    ]  # fmt: skip
    store = FileStore(tmp_path, "exp")
    records = []
    for task, sample, version, status, kind, reward in rows:
        record = small_record(1).model_copy(update={
            "rollout_key": f"t{task}.{sample}", "group_id": f"exp:t{task}", "task_index": task,
            "sample_index": sample, "policy_version": version, "status": status,
            "error_kind": kind, "reason": "x" if kind else None, "reward": reward,
        })  # fmt: skip
        store.write(record)
        records.append(record)
    return records


def counts(record: RolloutRecord) -> bool:
    return record.reward is not None and record.error_kind not in ("engine", "infrastructure")


def test_reward_and_completion_per_policy_version_match_the_records(tmp_path) -> None:
    records = versioned_run(tmp_path)
    with TestClient(create_viewer_app(open_run(str(tmp_path / "exp")))) as client:
        versions = client.get("/api/run").json()["versions"]
    assert [v["policy_version"] for v in versions] == [0, 1, None]  # oldest first, none last
    for shown in versions:
        mine = [r for r in records if r.policy_version == shown["policy_version"]]
        scored = [r.reward for r in mine if counts(r)]
        assert shown["n"] == len(mine) and shown["scored"] == len(scored)
        assert shown["mean_reward"] == pytest.approx(statistics.fmean(scored))
        completed = [r for r in mine if r.status in ("completed", "truncated")]
        assert shown["success_rate"] == pytest.approx(len(completed) / len(mine))
    assert [v["mean_reward"] for v in versions] == pytest.approx([0.5, 0.8125, 0.0])


def expected_advantages(records: list[RolloutRecord]) -> dict[str, float | None]:
    """(r - mean) / pstdev over each group's scored rewards; 0 where they do not differ."""
    groups: dict[str, list[float]] = {}
    for record in records:
        if record.reward is not None and counts(record):
            groups.setdefault(record.group_id, []).append(record.reward)
    answer: dict[str, float | None] = {}
    for record in records:
        rewards = groups.get(record.group_id, [])
        if record.reward is None or not counts(record):
            answer[record.rollout_key] = None
        elif len(set(rewards)) < 2:
            answer[record.rollout_key] = 0.0
        else:
            centred = record.reward - statistics.fmean(rewards)
            answer[record.rollout_key] = centred / statistics.pstdev(rewards)
    return answer


def test_advantages_in_the_listing_and_among_a_rollouts_siblings(tmp_path) -> None:
    records = versioned_run(tmp_path)
    expected = expected_advantages(records)
    assert expected["t0.0"] == pytest.approx(0.5 / math.sqrt(1 / 6))
    assert expected["t1.0"] == 0.0 and expected["t0.3"] is None  # flat; an engine failure
    with TestClient(create_viewer_app(open_run(str(tmp_path / "exp")))) as client:
        rows = client.get("/api/rollouts", params={"limit": 50}).json()["rows"]
        detail = client.get("/api/rollouts/t0.1").json()
        flat = client.get("/api/rollouts/t1.3").json()["group"]
    assert {r["key"]: r["advantage"] for r in rows} == pytest.approx(expected)
    group = detail["group"]
    assert group["group_id"] == "exp:t0" and group["flat"] is False and group["scored"] == 3
    siblings = group["rollouts"]
    assert [r["key"] for r in siblings] == ["t0.0", "t0.1", "t0.2", "t0.3"]
    assert [r["advantage"] for r in siblings] == pytest.approx(
        [expected[r["key"]] for r in siblings]
    )
    assert [(r["status"], r["reward"]) for r in siblings] == [
        (r.status, r.reward) for r in records[:4]
    ]
    assert flat["flat"] is True
    assert [r["advantage"] for r in flat["rollouts"]] == [0.0, 0.0, None, 0.0]


def test_a_rollout_of_the_real_run_lists_its_group(real_run: RealRun) -> None:
    with TestClient(create_viewer_app(open_run(str(real_run.folder)))) as client:
        group = client.get("/api/rollouts/add.1").json()["group"]
    assert [r["key"] for r in group["rollouts"]] == ["add.0", "add.1"]
    assert all(r["advantage"] is not None for r in group["rollouts"])
