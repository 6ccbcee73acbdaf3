"""A restarted trainer's step source goes on from the store by task identity: the same tasks
in another order are neither repeated nor skipped, a batch the trainer was not done with is
handed again, and progress stored for other tasks is said, not silently applied."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rollway.client import StepBatch
from tests.client.test_step_source import MakeClient, make_client, task_ids

__all__ = ["make_client"]  # the fixture, imported to be found


def tasks_of(batches: list[StepBatch]) -> list[str]:
    return [t for b in batches for t in task_ids(b)]


@pytest.mark.timeout(60)
def test_resume_goes_by_task_identity_whatever_the_order(make_client: MakeClient) -> None:
    tasks = [{"task_id": f"t{i}"} for i in range(6)]
    client = make_client()
    with client.step_source(tasks, group_size=2, groups_per_step=1) as source:
        first = [source.next_batch(), source.next_batch()]
    assert tasks_of(first) == ["t0", "t1"]
    again = make_client()
    with again.step_source(list(reversed(tasks)), group_size=2, groups_per_step=1) as source:
        rest = list(source)
    assert tasks_of(rest) == ["t5", "t4", "t3", "t2"]  # none repeated, none skipped
    assert [b.step for b in rest] == [2, 3, 4, 5]


@pytest.mark.timeout(60)
def test_a_batch_handed_to_a_trainer_that_died_before_it_was_done_is_handed_again(
    make_client: MakeClient,
) -> None:
    tasks = [{"task_id": f"t{i}"} for i in range(4)]
    client = make_client()
    with (
        pytest.raises(RuntimeError, match="trainer died"),
        client.step_source(tasks, group_size=2, groups_per_step=1) as source,
    ):
        source.next_batch()  # step 0: done with it once step 1 is asked for
        source.next_batch().done()  # step 1: said done at once
        assert task_ids(source.next_batch()) == ["t2"]  # step 2: the trainer dies training it
        raise RuntimeError("trainer died")
    again = make_client()
    with again.step_source(tasks, group_size=2, groups_per_step=1) as source:
        rest = list(source)
    assert tasks_of(rest) == ["t2", "t3"] and [b.step for b in rest] == [2, 3]


@pytest.mark.timeout(60)
def test_stored_progress_that_matches_none_of_the_tasks_is_warned_about(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="rollway.client")
    client = make_client()
    with client.step_source([{"task_id": "a0"}, {"task_id": "a1"}], group_size=2,
                            groups_per_step=1) as source:  # fmt: skip
        assert len(list(source)) == 2
    # Tasks that can be read again are checked up front; a one-pass iterator once it ends.
    for settled, given in ((2, [{"task_id": "b0"}, {"task_id": "b1"}]),
                           (4, iter([{"task_id": "c0"}, {"task_id": "c1"}]))):  # fmt: skip
        caplog.clear()
        with make_client().step_source(given, group_size=2, groups_per_step=1) as source:
            assert len(tasks_of(list(source))) == 2  # every task runs
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"records {settled} settled tasks, none of them among the tasks given" in w
                   and "own exp_id" in w for w in warned), warned  # fmt: skip


@pytest.mark.timeout(60)
def test_progress_stored_by_position_before_identities_is_still_read(
    make_client: MakeClient, tmp_path: Path
) -> None:
    folder = tmp_path / "runs" / "steps"
    folder.mkdir(parents=True)
    (folder / "steps.json").write_text(
        json.dumps({"step": 1, "settled_below": 1, "settled_above": [2]})
    )
    tasks = [{"task_id": f"t{i}"} for i in range(4)]
    with make_client().step_source(tasks, group_size=2, groups_per_step=1) as source:
        rest = list(source)
    assert tasks_of(rest) == ["t1", "t3"] and [b.step for b in rest] == [1, 2]
    stored = json.loads((folder / "steps.json").read_text())
    assert stored["settled"] == {"t0": 1, "t1": 1, "t2": 1, "t3": 1} and stored["step"] == 3
