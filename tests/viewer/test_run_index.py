"""Where the listing's rows come from: index lines (no record read), records read once where
the index says too little (older runs, object storage), and a fresh reading when the run
writes again."""

from __future__ import annotations

import orjson
import pytest
from starlette.testclient import TestClient
from transformers import AutoTokenizer

from rollway.errors import ConfigError
from rollway.model_folders import resolve_model_path
from rollway.store import FileStore, store_from_uri
from rollway.viewer import Query, RunIndex, create_viewer_app, open_run
from tests.viewer.test_listing_scale import small_record


def test_the_index_serves_the_listing_and_a_new_write_shows_up(tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    for i in range(1, 6):
        store.write(small_record(i))
    index = RunIndex(open_run(str(store.path)), recheck_s=0.0)
    listing = index.rollouts(Query(sort="reward", descending=True), 0, 10)
    assert [r["reward"] for r in listing["rows"]] == [1.0, 1.0, 0.5, 0.5, 0.0]
    assert index.records_read == 0
    store.write(small_record(10))  # an agent error, written while the viewer runs
    errors = index.rollouts(Query(status=frozenset({"error"})), 0, 10)
    assert [r["reason"] for r in errors["rows"]] == ["bad luck 10"]
    assert index.totals()["rollouts"] == 6 and index.records_read == 0


def test_an_older_index_gets_its_rows_from_the_records_once(tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    for i in range(1, 5):
        store.write(small_record(i))
    # What runs wrote before index lines carried the listing's fields.
    short = [
        {"key": r["key"], "status": r["status"], "reward": r["reward"]}
        for r in map(orjson.loads, (store.path / "index.jsonl").read_bytes().splitlines())
    ]
    (store.path / "index.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in short))
    index = RunIndex(open_run(str(store.path)), recheck_s=0.0)
    rows = index.rollouts(Query(), 0, 10)["rows"]
    assert [r["turns"] for r in rows] == [2] * 4 and index.records_read == 4
    index.rollouts(Query(sort="sampled_tokens"), 0, 10)
    with (store.path / "index.jsonl").open("ab") as lines:  # another reader's line: no change
        lines.write(orjson.dumps(short[0]) + b"\n")
    assert index.rollouts(Query(), 0, 10)["total"] == 4 and index.records_read == 4
    rerun = small_record(1).model_copy(update={"reward": 0.25})
    store.write(rerun)  # a new-style line for it now
    assert index.rollouts(Query(text=rerun.rollout_key), 0, 1)["rows"][0]["reward"] == 0.25
    assert index.records_read == 4


def test_an_object_store_run_is_listed_from_its_records(s3_env: str) -> None:
    store = store_from_uri(s3_env, "exp")
    for i in range(1, 4):
        store.write(small_record(i))
    location = open_run(f"{s3_env}/exp")
    assert location.folder is None and location.name == f"{s3_env}/exp"
    index = RunIndex(location)
    with TestClient(create_viewer_app(location, index=index)) as client:
        rows = client.get("/api/rollouts").json()["rows"]
        assert [r["sampled_tokens"] for r in rows] == [4 + 2, 4 + 3, 4 + 4]
        assert client.get(f"/api/rollouts/{rows[0]['key']}").json()["samples"][0]["ids"]
        client.get("/api/groups")
    assert index.records_read == 3  # once each, not once a request


def test_a_folder_that_is_not_a_run_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not an experiment folder"):
        open_run(str(tmp_path))


def test_token_ids_show_as_ids_unless_a_tokenizer_loads(tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    store.write(small_record(1))  # its model "m" names no tokenizer
    location = open_run(str(store.path))
    with TestClient(create_viewer_app(location)) as client:
        bare = client.get("/api/rollouts/t00000.1").json()
    assert bare["tokenizer"] is None and bare["texts"] == {} and bare["samples"][0]["ids"]
    folder = str(resolve_model_path(None))
    with TestClient(create_viewer_app(location, tokenizer=folder)) as client:
        decoded = client.get("/api/rollouts/t00000.1").json()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert decoded["tokenizer"] == folder
    assert decoded["texts"] == {
        str(i): tokenizer.decode([i]) for i in set(decoded["samples"][0]["ids"])
    }


def test_groups_without_reward_spread_are_flagged_and_counted(tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    rewards = {"t1": [1.0, 1.0], "t2": [0.0, 1.0], "t3": [0.5, None]}
    for task, values in rewards.items():
        for sample, reward in enumerate(values):
            store.write(small_record(1).model_copy(update={
                "rollout_key": f"{task}.{sample}", "group_id": f"exp:{task}",
                "sample_index": sample, "reward": reward,
            }))  # fmt: skip
    index = RunIndex(open_run(str(store.path)), recheck_s=0.0)
    flat = {g["group_id"]: g["flat"] for g in index.groups("", "group_id", False, 0, 10)["rows"]}
    assert flat == {"exp:t1": True, "exp:t2": False, "exp:t3": True}  # one scored is flat too
    assert index.totals()["flat_groups"] == 2


def test_rollouts_filter_by_policy_version_and_show_it(tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    for i, version in enumerate([0, 1, 1, None], start=1):
        store.write(small_record(i).model_copy(update={"policy_version": version}))
    with TestClient(create_viewer_app(open_run(str(store.path)))) as client:
        one = client.get("/api/rollouts?policy_version=1").json()["rows"]
        zero = client.get("/api/rollouts?policy_version=0").json()["rows"]
        every = client.get("/api/rollouts?sort=policy_version").json()["rows"]
        bad = client.get("/api/rollouts?policy_version=x")
    assert [r["policy_version"] for r in one] == [1, 1] and len(zero) == 1
    assert len(every) == 4 and bad.status_code == 422
