"""A reward or a component that is no finite float (NaN, an infinity, ``10**400``) is the
rollout's ``error/reward`` naming the value, never the run's crash; a stored record holding one
(edited by hand, or by an older version) is a bad record to the export, the viewer and resume."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
from starlette.testclient import TestClient

from rollway.client import RolloutClient
from rollway.errors import BadRecordError
from rollway.store import export_records
from rollway.store.file import FileStore
from rollway.trajectory import Trajectory
from rollway.viewer import create_viewer_app, open_run

MakeClient = Callable[..., RolloutClient]

VALUES: dict[str, Any] = {
    "huge": 10**400,
    "huge-dict": {"reward": 10**400},
    "huge-part": {"reward": 1.0, "big": 10**400},
    "nan-part": {"reward": 1.0, "x": math.nan},
    "inf": -math.inf,
    "fine": {"reward": 0.5, "passed": 3, "why": "text is no component"},
}


def by_task(task: dict[str, Any], trajectory: Trajectory) -> Any:
    return VALUES[task["task_id"]]


def test_a_reward_or_component_that_is_no_finite_float_fails_only_its_rollout(
    make_client: MakeClient, tmp_path: Path
) -> None:
    client = make_client(reward=by_task, exp_id="values", reward_retries=0)
    by_id = {i.result.task["task_id"]: i.result for i in client.run_batch(list(map(_task, VALUES)))}
    reasons = {key: r.reason or "" for key, r in by_id.items() if key != "fine"}
    assert {key: r.error_kind for key, r in by_id.items()} == {
        "huge": "reward", "huge-dict": "reward", "huge-part": "reward", "nan-part": "reward",
        "inf": "reward", "fine": None,
    }  # fmt: skip
    assert "an integer of 1329 bits" in reasons["huge"] == reasons["huge-dict"]
    assert "an integer of 1329 bits for component 'big'" in reasons["huge-part"]
    assert "nan for component 'x'" in reasons["nan-part"] and "-inf" in reasons["inf"]
    assert by_id["fine"].reward_components == {"passed": 3.0}
    # Every record was written, and every reader takes them.
    assert len(list(client.store.records())) == len(VALUES)
    summary = orjson.loads((_folder(client) / "summary.json").read_bytes())
    assert summary["total"] == len(VALUES)
    for fmt in ("jsonl", "parquet"):
        assert export_records(client.store.records(), tmp_path / f"rows.{fmt}", fmt) >= 1


def test_a_stored_non_finite_reward_is_a_bad_record_to_export_viewer_and_resume(
    make_client: MakeClient, tmp_path: Path
) -> None:
    def fine(task: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
        return {"reward": 1.0, "part": 0.5}

    tasks = [{"task_id": k} for k in ("a", "b", "c")]
    client = make_client(reward=fine, exp_id="edited")
    assert all(item.success for item in client.run_batch(tasks))
    folder = _folder(client)
    client.close()
    files = sorted((folder / "trajectories").iterdir())
    _edit(files[0], b'"reward":1.0,', b'"reward":NaN,')  # as json.dumps writes a NaN
    _edit(files[1], b'"part":0.5', b'"part":1' + b"0" * 400)
    # The export, in both formats: the two named and skipped, the good one written.
    for fmt in ("jsonl", "parquet"):
        bad: list[BadRecordError] = []
        out = tmp_path / f"rows.{fmt}"
        records = list(client.store.records(on_bad=bad.append))
        assert export_records(records, out, fmt) == 1
        assert sorted(b.reason.removeprefix("Value error, ") for b in bad) == [
            "reward: nan is no finite float", "reward_info.part: an integer of 1329 bits is no "
            "finite float"]  # fmt: skip
    assert pq.read_table(tmp_path / "rows.parquet").column("reward").to_pylist() == [1.0]
    # The viewer's listing: both unreadable, with why; the good one listed.
    listing = TestClient(create_viewer_app(open_run(str(folder)))).get("/api/rollouts").json()
    assert [row["reward"] for row in listing["rows"]] == [1.0]
    # Resume: both run again, counted as bad records; the summary reads the new ones.
    again = make_client(reward=fine, exp_id="edited")
    items = list(again.run_batch(tasks))
    assert sorted(i.from_store for i in items) == [False, False, True]
    summary = orjson.loads((folder / "summary.json").read_bytes())
    assert summary["rerun"] == {"bad record": 2} and summary["mean_reward"] == 1.0


def _folder(client: RolloutClient) -> Path:
    assert isinstance(client.store, FileStore)
    return client.store.path


def _task(task_id: str) -> dict[str, Any]:
    return {"task_id": task_id}


def _edit(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert old in data, data[:300]
    path.write_bytes(data.replace(old, new, 1))
