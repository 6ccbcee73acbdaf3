from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from rollway.errors import BadRecordError, ConfigError
from rollway.results import RolloutRecord
from rollway.store import FileStore, export_records, store_from_uri
from rollway.trajectory import Sample, Trajectory
from rollway.trajectory_format import prompt_hash
from tests.trajectories import chain

# The one sample of ``TURNS``: the second turn's prompt adds 6 (glue, mask 0) to the first's.
SAMPLE = Sample(
    segment=0,
    prompt_ids=[1, 2, 3],
    response_ids=[4, 5, 6, 7],
    loss_mask=[1, 1, 0, 1],
    logprobs=[-0.125, -1.0e-7, 0.0, -3.3333333333],
)


def turn(
    index: int, prompt: list[int], completion: list[int], logprobs: list[float]
) -> dict[str, Any]:
    return dict(
        index=index, segment=0, request_id=f"r-{index + 1}", prompt_ids=prompt,
        completion_ids=completion, logprobs=logprobs, finish_reason="stop", content="",
        sampling={}, latency_ms=1.0, prompt_hash=prompt_hash(prompt),
    )  # fmt: skip


TURNS = chain(
    [
        turn(0, [1, 2, 3], [4, 5], [-0.125, -1.0e-7]),
        turn(1, [1, 2, 3, 4, 5, 6], [7], [-3.3333333333]),
    ]
)


def record(key: str, *, reward: float | None = 1.0, status: str = "completed") -> RolloutRecord:
    trajectory = Trajectory(
        rollout_id=f"exp.{key}.1", model="m", sampling={}, max_turns=None, max_seq_len=None,
        messages=[], tools=None, turns=TURNS, is_truncated=False,
        truncation_reason=None, is_cancelled=False, segment_count=1, drift=None,
    )  # fmt: skip
    return RolloutRecord(
        exp_id="exp", rollout_key=key, rollout_id=f"exp.{key}.1", task_index=0,
        group_id="exp:t", group_index=0, sample_index=int(key[-1]), status=status,
        reward=reward, started_at=time.time(), elapsed_s=0.5, trajectory=trajectory,
    )  # fmt: skip


def test_records_round_trip_and_config_is_written(tmp_path: Path) -> None:
    store = FileStore(tmp_path, "exp")
    store.write_config({"agent": "a"})
    store.write(record("t.0"))
    store.write(record("t.1", reward=0.0))
    assert store.get("t.0") == record("t.0").model_copy(
        update={"started_at": store.get("t.0").started_at}
    )
    assert [r.rollout_key for r in store.records()] == ["t.0", "t.1"]
    assert store.keys() == {"t.0", "t.1"}
    assert store.get("missing.0") is None
    assert orjson.loads((tmp_path / "exp" / "config.json").read_bytes()) == {"agent": "a"}
    index = (tmp_path / "exp" / "index.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["key"] for line in index] == ["t.0", "t.1"]


def test_a_crash_mid_write_leaves_the_old_record_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = FileStore(tmp_path, "exp")
    store.write(record("t.0", reward=1.0))

    def crash(fd: int) -> None:
        raise OSError("disk vanished")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="disk vanished"):
        store.write(record("t.0", reward=0.0))
    monkeypatch.undo()
    assert store.get("t.0").reward == 1.0
    assert sorted(p.name for p in (tmp_path / "exp" / "trajectories").iterdir()) == ["t.0.json"]


def test_unsafe_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        FileStore(tmp_path, "../escape")
    with pytest.raises(ConfigError):
        FileStore(tmp_path, "exp").get("../../etc/passwd")


def test_store_uri_forms(tmp_path: Path) -> None:
    assert store_from_uri(str(tmp_path), "a").path == tmp_path / "a"
    assert store_from_uri(f"file://{tmp_path}", "b").path == tmp_path / "b"
    with pytest.raises(ConfigError, match="unsupported"):
        store_from_uri("gopher://x", "c")


def test_parquet_and_jsonl_exports_round_trip(tmp_path: Path) -> None:
    records = [record("t.0"), record("t.1", reward=None, status="truncated")]
    parquet = tmp_path / "s.parquet"
    assert export_records(records, parquet, "parquet") == 2
    rows = pq.read_table(parquet).to_pylist()
    jsonl = tmp_path / "s.jsonl"
    assert export_records(records, jsonl, "jsonl") == 2
    assert [orjson.loads(line) for line in jsonl.read_bytes().splitlines()] == rows
    for row, rec in zip(rows, records, strict=True):
        (sample,) = rec.trajectory.samples
        assert sample == SAMPLE
        assert row["prompt_ids"] == sample.prompt_ids
        assert row["response_ids"] == sample.response_ids
        assert row["loss_mask"] == sample.loss_mask
        assert row["logprobs"] == sample.logprobs
        assert (row["reward"], row["status"], row["group_id"]) == (rec.reward, rec.status, "exp:t")


def bad_bodies(good: bytes) -> dict[str, tuple[bytes, str]]:
    """Records edited by hand, cut short or written by a newer rollway: each body and what its
    reason must say."""
    data = orjson.loads(good)

    def trajectory(**changes: Any) -> bytes:
        return orjson.dumps(data | {"trajectory": data["trajectory"] | changes})

    return {
        "cut.0": (good[: len(good) // 2], "Invalid JSON"),
        "newer.0": (trajectory(format_version=99), "trajectory format 99 is newer"),
        "text.0": (trajectory(format_version="2"), "format_version must be an integer"),
        "missing.0": (
            orjson.dumps({k: v for k, v in data.items() if k != "status"}),
            "status: Field required",
        ),
        "list.0": (b"[1, 2]", "Input should be an object"),
    }


@pytest.fixture(params=["file", "s3"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "runs") if request.param == "file" else request.getfixturevalue("s3_env")


def test_a_bad_record_is_named_with_its_reason_and_the_others_are_read(uri: str) -> None:
    store = store_from_uri(uri, "exp")
    store.write(record("good.0"))
    bodies = bad_bodies(record("x.0").stored())
    for key, (body, _) in bodies.items():
        if isinstance(store, FileStore):
            (store.path / "trajectories" / f"{key}.json").write_bytes(body)
        else:
            store._put(f"trajectories/{key}.json", body)
    bad: list[BadRecordError] = []
    assert [r.rollout_key for r in store.records(on_bad=bad.append)] == ["good.0"]
    assert sorted(error.key or "" for error in bad) == sorted(bodies)
    where = str(store.path / "trajectories") if isinstance(store, FileStore) else uri
    for error in bad:
        assert error.where.startswith(where) and error.where.endswith(f"/{error.key}.json")
        assert bodies[error.key or ""][1] in error.reason, error
    with pytest.raises(BadRecordError, match=r"cut\.0\.json: Invalid JSON"):
        store.get("cut.0")
    with pytest.raises(BadRecordError):  # no on_bad: the first bad record is raised, named
        list(store.records())


def test_a_record_that_is_a_link_or_a_folder_is_never_followed(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs", "exp")
    outside = tmp_path / "outside.json"
    outside.write_bytes(record("link.0").stored())  # a good record: following it would read it
    secret = tmp_path / "shadow"
    secret.write_text('{"root": "$6$secret-hash"}')
    trajectories = store.path / "trajectories"
    (trajectories / "link.0.json").symlink_to(outside)
    (trajectories / "leak.0.json").symlink_to(secret)
    (trajectories / "folder.0.json").mkdir()
    bad: list[BadRecordError] = []
    assert list(store.records(on_bad=bad.append)) == []
    reasons = {error.key: error.reason for error in bad}
    assert reasons == {
        "link.0": "a symbolic link, which rollway does not follow",
        "leak.0": "a symbolic link, which rollway does not follow",
        "folder.0": "a folder",
    }
    assert all("secret" not in str(error) for error in bad)
    with pytest.raises(BadRecordError, match=r"link\.0\.json: a symbolic link"):
        store.get("link.0")


def test_a_folder_where_a_record_goes_is_moved_aside_so_the_rollout_can_be_written_again(
    tmp_path: Path,
) -> None:
    """Resume reruns a record that is a folder: writing its new record must not fail on it
    (every later run would), and the folder's content is kept, out of the listing."""
    store = FileStore(tmp_path / "runs", "exp")
    folder = store.path / "trajectories" / "t07.0.json"
    folder.mkdir()
    (folder / "kept.txt").write_text("hand-made")
    with pytest.raises(BadRecordError, match="a folder"):
        store.get("t07.0")
    written = record("t07.0")
    store.write(written)
    again = store.get("t07.0")
    assert again is not None and again.rollout_id == written.rollout_id
    assert store.keys() == {"t07.0"}
    (aside,) = [p for p in folder.parent.iterdir() if p.name.startswith(".t07.0.json.folder-")]
    assert (aside / "kept.txt").read_text() == "hand-made"
