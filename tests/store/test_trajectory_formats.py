"""Records of the previous release (trajectory format 1: whole prompts on every turn, samples
stored) read as format 2 with the same samples and whole prompts; a record is stored with its
context once and its conversation once, and reads back equal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from rollway.results import RolloutRecord
from rollway.store import FileStore
from rollway.trajectory import Sample, Trajectory
from rollway.trajectory_format import FORMAT_VERSION, check_prompt_hashes

#: Written by rollway at commit 2d6975a (make_records.py says how): the embedded model at
#: T=0.7, top_p=0.9 (processed and raw logprobs, kept mass) and the sim engine; two segments.
V1 = Path(__file__).parent / "records_v1"


@pytest.mark.parametrize("name", ["embedded", "sim"])
def test_a_format_1_record_reads_with_its_samples_and_prompts(name: str, tmp_path: Path) -> None:
    text = (V1 / f"{name}.json").read_text()
    old = json.loads(text)["trajectory"]
    assert "format_version" not in old and old["samples"]  # it is format 1
    record = RolloutRecord.model_validate_json(text)
    trajectory = record.trajectory
    assert trajectory is not None and trajectory.format_version == FORMAT_VERSION
    assert trajectory.segment_count == 2 and len(trajectory.turns) == 5
    stored = [Sample.model_validate(s) for s in old["samples"]]
    assert trajectory.samples == stored
    for index, turn in enumerate(old["turns"]):
        assert trajectory.prompt_ids(index) == turn["prompt_ids"]
        assert trajectory.turns[index].prompt_len == len(turn["prompt_ids"])
    assert check_prompt_hashes(trajectory.turns) == []
    # Written again, it is format 2, smaller, and reads back equal.
    store = FileStore(tmp_path, record.exp_id)
    store.write(record)
    assert store.get(record.rollout_key) == record
    written = store._record_path(record.rollout_key).read_bytes()
    assert len(written) < len(text.encode()) / 2
    assert json.loads(written)["trajectory"]["format_version"] == FORMAT_VERSION


def test_a_newer_format_is_refused_naming_it() -> None:
    data = json.loads((V1 / "sim.json").read_text())["trajectory"]
    data = {**Trajectory.model_validate(data).model_dump(mode="json"), "format_version": 3}
    with pytest.raises(ValidationError, match="format 3 is newer"):
        Trajectory.model_validate(data)


def test_a_format_1_turn_that_does_not_extend_its_segment_is_an_error() -> None:
    data = json.loads((V1 / "sim.json").read_text())["trajectory"]
    data["turns"][1]["prompt_ids"][0] += 1  # no longer the first turn's sequence, extended
    with pytest.raises(ValidationError, match="turn 1 does not extend"):
        Trajectory.model_validate(data)


def test_the_conversation_is_stored_once_when_the_records_begins_with_it() -> None:
    record = RolloutRecord.model_validate_json((V1 / "sim.json").read_text())
    assert record.trajectory is not None
    conversation = record.trajectory.messages
    longer = record.model_copy(
        update={"messages": [*conversation, {"role": "user", "content": "after the last turn"}]}
    )
    other = record.model_copy(update={"messages": [{"role": "user", "content": "rewritten"}]})
    for case, once in ((record, True), (longer, True), (other, False)):
        stored = json.loads(case.stored())
        assert ("messages" not in stored["trajectory"]) is once
        if once:
            assert stored["trajectory"]["messages_in_record"] == len(conversation)
        assert RolloutRecord.model_validate_json(case.stored()) == case
    bad = json.loads(record.stored())
    bad["trajectory"]["messages_in_record"] = len(record.messages) + 1
    with pytest.raises(ValidationError, match="messages_in_record"):
        RolloutRecord.model_validate(bad)


@pytest.mark.parametrize("count", [-1, True, 1.0, "1"])
def test_a_messages_in_record_that_is_not_a_count_is_refused(count: object) -> None:
    record = RolloutRecord.model_validate_json((V1 / "sim.json").read_text())
    stored = json.loads(record.stored())
    stored["trajectory"]["messages_in_record"] = count
    with pytest.raises(ValidationError, match="messages_in_record"):
        RolloutRecord.model_validate(stored)
