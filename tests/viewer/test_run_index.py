"""Where the listing's rows come from: index lines (no record read), records read once where
the index says too little (older runs, object storage), and a fresh reading when the run
writes again."""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import httpx
import orjson
import pytest
from starlette.testclient import TestClient
from transformers import AutoTokenizer

from rollway.errors import ConfigError
from rollway.model_folders import resolve_model_path
from rollway.store import FileStore, index_row, store_from_uri
from rollway.viewer import Query, RunIndex, create_viewer_app, open_run
from rollway.web.background_server import BackgroundServer
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


SECRET = b"root:$6$not-for-your-eyes:19000:0:99999:7:::\n"


def bad_records(secret_file: Path) -> dict[str, bytes | Path]:
    """What a tester wrote by hand beside good records: each bad in its own way. A Path is a
    symbolic link's target."""
    good = orjson.loads(small_record(7).model_dump_json())
    newer = {**good, "trajectory": {**good["trajectory"], "format_version": 99}}
    text_version = {**good, "trajectory": {**good["trajectory"], "format_version": "2"}}
    return {
        "cut": small_record(6).model_dump_json().encode()[:150],
        "newer": orjson.dumps(newer),
        "text-version": orjson.dumps(text_version),
        "no-group": orjson.dumps({k: v for k, v in good.items() if k != "group_id"}),
        "a-list": orjson.dumps([good]),
        "shadow": secret_file,
    }


REASONS = {
    "cut": "Invalid JSON",
    "newer": "trajectory format 99 is newer",
    "text-version": "format_version must be an integer",
    "no-group": "group_id: Field required",
    "a-list": "Input should be an object",
}


def test_bad_records_are_listed_unreadable_and_the_rest_is_served(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path, "exp")
    for i in range(1, 4):
        store.write(small_record(i))
    secret = tmp_path / "shadow"
    secret.write_bytes(SECRET)
    for key, bad in bad_records(secret).items():  # none of them in index.jsonl
        path = store.path / "trajectories" / f"{key}.json"
        path.symlink_to(bad) if isinstance(bad, Path) else path.write_bytes(bad)
    (store.path / "trajectories" / "a-folder.json").mkdir()
    os.mkfifo(store.path / "trajectories" / "a-fifo.json")  # read, it would never answer
    with TestClient(create_viewer_app(open_run(str(store.path)))) as client:
        run = client.get("/api/run")
        listing = client.get("/api/rollouts")
        answers = [run, listing, client.get("/api/groups")]
        good = listing.json()["rows"][0]["key"]
        answers += [client.get(f"/api/rollouts/{good}"), client.get(f"/api/rollouts/{good}/tokens")]
        assert [a.status_code for a in answers] == [200] * 5
        assert listing.json()["total"] == 3 and run.json()["totals"]["unreadable"] == 8
        reasons = {row["key"]: row["reason"] for row in run.json()["unreadable"]}
        assert set(reasons) == {*REASONS, "shadow", "a-folder", "a-fifo"}
        for key, fragment in REASONS.items():
            assert fragment in reasons[key], reasons[key]
        assert reasons["shadow"] == "a symbolic link, which rollway does not follow"
        assert (reasons["a-folder"], reasons["a-fifo"]) == ("a folder", "not a regular file")
        for key in reasons:  # each one's own page says it does not read, and why
            page = client.get(f"/api/rollouts/{key}")
            assert page.status_code == 200
            assert page.json() == {"unreadable": {"key": key, "reason": reasons[key]}}
            tokens = client.get(f"/api/rollouts/{key}/tokens")
            assert tokens.status_code == 404 and "does not read" in tokens.text
            answers += [page, tokens]
    seen = b"".join(a.content for a in answers) + caplog.text.encode()
    assert b"not-for-your-eyes" not in seen and b"Traceback" not in seen


def changed_since_written(trajectories: Path, secret: Path) -> dict[str, str]:
    """Records of a group of 8 (t00000.*) changed by another hand after their index lines
    were written, each in its own way; the reason each then gets."""
    path = {i: trajectories / f"t00000.{i}.json" for i in range(8)}
    path[1].write_bytes(path[1].read_bytes()[:150])  # cut short
    newer = path[2].read_bytes().replace(b'"format_version":2', b'"format_version":99')
    path[2].write_bytes(newer)
    same_size = path[3].read_bytes().replace(b'"format_version":2', b'"format_version":9')
    written = path[3].stat().st_mtime_ns
    path[3].write_bytes(same_size)  # as long as it was: only its time tells (a second later)
    os.utime(path[3], ns=(written, written + 10**9))
    for i, making in ((4, lambda p: p.symlink_to(secret)), (5, Path.mkdir), (6, os.mkfifo)):
        path[i].unlink()
        making(path[i])
    return {
        "t00000.1": "Invalid JSON",
        "t00000.2": "trajectory format 99 is newer",
        "t00000.3": "trajectory format 9 is newer",
        "t00000.4": "a symbolic link, which rollway does not follow",
        "t00000.5": "a folder",
        "t00000.6": "not a regular file",
    }


def test_indexed_records_changed_since_written_are_unreadable_and_in_no_statistic(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileStore(tmp_path, "exp")
    for i in range(8):
        store.write(small_record(i))
    secret = tmp_path / "shadow"
    secret.write_bytes(SECRET)
    location = open_run(str(store.path))
    index = RunIndex(location, recheck_s=0.0)
    assert index.totals()["rollouts"] == 8 and index.records_read == 0  # listed, then changed
    expected = changed_since_written(store.path / "trajectories", secret)
    # t00000.0 (an agent error) stands; t00000.7 is rewritten as a good record by hand.
    store.path.joinpath("trajectories", "t00000.7.json").write_bytes(
        small_record(7).model_copy(update={"reward": 0.25}).stored()
    )
    with TestClient(create_viewer_app(location, index=index)) as client:
        answers = [client.get("/api/run"), client.get("/api/rollouts"), client.get("/api/groups")]
        answers.append(client.get("/api/rollouts/t00000.0"))  # with its group
        answers += [client.get(f"/api/rollouts/{key}") for key in expected]
    assert [a.status_code for a in answers] == [200] * (4 + len(expected))
    run, listing, groups, page = (a.json() for a in answers[:4])
    reasons = {row["key"]: row["reason"] for row in run["unreadable"]}
    assert set(reasons) == set(expected)
    assert all(fragment in reasons[key] for key, fragment in expected.items()), reasons
    rows = {row["key"]: (row["status"], row["reward"]) for row in listing["rows"]}
    assert rows == {"t00000.0": ("error", None), "t00000.7": ("completed", 0.25)}
    totals = run["totals"]
    assert totals["rollouts"] == 2 and totals["unreadable"] == len(expected)
    assert totals["by_status"] == {"error": 1, "completed": 1} and totals["mean_reward"] == 0.25
    assert groups["rows"][0]["n"] == 2 and groups["rows"][0]["mean_reward"] == 0.25
    assert [r["key"] for r in page["group"]["rollouts"]] == ["t00000.0", "t00000.7"]
    assert index.records_read == len(expected) + 1  # the changed records only
    seen = b"".join(a.content for a in answers) + caplog.text.encode()
    assert b"not-for-your-eyes" not in seen and b"Traceback" not in seen


def test_an_older_index_line_stands_for_its_record_unless_the_record_is_newer(
    tmp_path: Path,
) -> None:
    """Lines written before they carried the record file's size and time: a record file no
    newer than the index stands on its line; one changed later (or not a file) is read."""
    store = FileStore(tmp_path, "exp")
    for i in range(4):
        store.write(small_record(i))
    index_file = store.path / "index.jsonl"
    older = [
        {k: v for k, v in orjson.loads(line).items() if k not in ("bytes", "mtime_ns")}
        for line in index_file.read_bytes().splitlines()
    ]
    index_file.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in older))
    cut = store.path / "trajectories" / "t00000.1.json"
    cut.write_bytes(cut.read_bytes()[:150])
    later = index_file.stat().st_mtime_ns + 10**9  # a second after the index's last line
    os.utime(cut, ns=(later, later))
    (store.path / "trajectories" / "t00000.2.json").unlink()
    (store.path / "trajectories" / "t00000.2.json").mkdir()
    index = RunIndex(open_run(str(store.path)), recheck_s=0.0)
    keys = [r["key"] for r in index.rollouts(Query(), 0, 10)["rows"]]
    assert keys == ["t00000.0", "t00000.3"] and index.records_read == 2
    assert [u.key for u in index.unreadable()] == ["t00000.1", "t00000.2"]


def test_a_linked_index_config_or_debug_file_is_not_followed(tmp_path: Path) -> None:
    store = FileStore(tmp_path, "exp")
    store.write(small_record(1))
    secret = tmp_path / "elsewhere.json"
    secret.write_bytes(orjson.dumps({"model": "not-for-your-eyes"}))
    (store.path / "config.json").symlink_to(secret)
    index = store.path / "index.jsonl"
    foreign = orjson.loads(index.read_bytes()) | {"key": "t00000.1", "reason": "not-for-your-eyes"}
    secret_index = tmp_path / "elsewhere.jsonl"
    secret_index.write_bytes(orjson.dumps(foreign) + b"\n")
    index.unlink()
    index.symlink_to(secret_index)
    (store.path / "debug").mkdir()
    (store.path / "debug" / "exp.t00000.1.1.jsonl").symlink_to(secret)
    with TestClient(create_viewer_app(open_run(str(store.path)))) as client:
        answers = [client.get("/api/run"), client.get("/api/rollouts")]
        answers.append(client.get("/api/rollouts/t00000.1"))
    assert [a.status_code for a in answers] == [200] * 3
    assert answers[1].json()["rows"][0]["reason"] is None  # read from the record itself
    assert answers[2].json()["debug"] == []
    assert all(b"not-for-your-eyes" not in a.content for a in answers)


def test_an_index_line_without_the_listing_fields_types_is_passed_over(tmp_path: Path) -> None:
    store = FileStore(tmp_path, "exp")
    store.write(small_record(1))
    with (store.path / "index.jsonl").open("ab") as lines:  # a hand edit, the last line wins
        lines.write(orjson.dumps({**index_row(small_record(1)), "task_index": "one"}) + b"\n")
    index = RunIndex(open_run(str(store.path)), recheck_s=0.0)
    assert index.rollouts(Query(sort="task_index"), 0, 10)["rows"][0]["task_index"] == 0
    assert index.records_read == 1


def test_a_bad_object_of_an_object_store_run_is_listed_unreadable(s3_env: str) -> None:
    store = store_from_uri(s3_env, "exp")
    store.write(small_record(1))
    bucket, _, prefix = s3_env.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
    bad = bad_records(Path("unused"))
    for key in REASONS:
        s3.put_object(Bucket=bucket, Key=f"{prefix}/exp/trajectories/{key}.json", Body=bad[key])
    with TestClient(create_viewer_app(open_run(f"{s3_env}/exp"))) as client:
        run = client.get("/api/run").json()
        rows = client.get("/api/rollouts").json()["rows"]
        page = client.get("/api/rollouts/newer").json()
    assert [r["key"] for r in rows] == [small_record(1).rollout_key]
    reasons = {row["key"]: row["reason"] for row in run["unreadable"]}
    assert set(reasons) == set(REASONS)
    assert all(fragment in reasons[key] for key, fragment in REASONS.items()), reasons
    assert page == {"unreadable": {"key": "newer", "reason": reasons["newer"]}}


def test_a_record_whose_token_lists_do_not_line_up_shows_as_unreadable(tmp_path: Path) -> None:
    """It reads as a record, but its samples cannot be built: its page says why, never 500."""
    store = FileStore(tmp_path, "exp")
    good = small_record(1)
    assert good.trajectory is not None
    turns = list(good.trajectory.turns)
    turns[0] = turns[0].model_copy(update={"logprobs": turns[0].logprobs[:-1]})
    trajectory = good.trajectory.model_copy(update={"turns": turns})
    store.write(good.model_copy(update={"trajectory": trajectory}))
    with TestClient(create_viewer_app(open_run(str(store.path)))) as client:
        page = client.get(f"/api/rollouts/{good.rollout_key}")
        assert page.status_code == 200
        reason = page.json()["unreadable"]["reason"]
        assert "logprobs for" in reason and "completion ids" in reason
        tokens = client.get(f"/api/rollouts/{good.rollout_key}/tokens")
        assert tokens.status_code == 404 and "does not read" in tokens.text


def test_the_listing_sorts_by_each_reward_component(tmp_path) -> None:
    store = FileStore(tmp_path, "exp")
    for i, correct in enumerate([0.0, 1.0, None], start=1):
        info = {} if correct is None else {"correct": correct, "format": 0.5}
        store.write(small_record(i).model_copy(update={"reward": 1.0, "reward_info": info}))
    location = open_run(str(store.path))
    index = RunIndex(location, recheck_s=0.0)
    listing = index.rollouts(Query(sort="reward/correct", descending=True), 0, 10)
    assert listing["reward_components"] == ["correct", "format"]
    assert [r["reward_components"].get("correct") for r in listing["rows"]] == [1.0, 0.0, None]
    assert index.records_read == 0  # the index line carries the components
    with TestClient(create_viewer_app(location)) as client:
        rows = client.get("/api/rollouts?sort=reward/correct").json()["rows"]
        assert [r["reward_components"].get("correct") for r in rows] == [0.0, 1.0, None]
        assert client.get("/api/rollouts?sort=reward/").status_code == 422


def test_groups_have_each_components_mean_and_sort_by_it(tmp_path: Path) -> None:
    """Over a real HTTP server: a group's row has each component's mean over its scored
    rollouts, ``/api/groups`` names the components and sorts by one as ``reward/<name>``, and
    a group's detail (the rollout page's group) names those its rollouts have."""
    store = FileStore(tmp_path, "exp")
    values = {1: 0.0, 2: 1.0, 8: 1.0, 9: 1.0, 16: None}  # groups t00000, t00001, t00002
    for i, correct in values.items():
        info = {"format": 0.5} if correct is None else {"correct": correct, "format": 0.25}
        store.write(small_record(i).model_copy(update={"reward": 1.0, "reward_info": info}))
    with BackgroundServer(create_viewer_app(open_run(str(store.path)))) as url:
        page = httpx.get(f"{url}/api/groups?sort=reward/correct&order=desc").json()
        ascending = httpx.get(f"{url}/api/groups?sort=reward/correct").json()
        detail = httpx.get(f"{url}/api/rollouts/{small_record(16).rollout_key}").json()
        assert httpx.get(f"{url}/api/groups?sort=reward/").status_code == 422
    assert page["reward_components"] == ["correct", "format"]
    means = [(g["group_id"], g["reward_components"]) for g in page["rows"]]
    assert means == [
        ("exp:t00001", {"correct": 1.0, "format": 0.25}),
        ("exp:t00000", {"correct": 0.5, "format": 0.25}),
        ("exp:t00002", {"format": 0.5}),  # no value of it: last either way
    ]
    assert [g["group_id"] for g in ascending["rows"]] == ["exp:t00000", "exp:t00001", "exp:t00002"]
    assert detail["group"]["reward_components"] == ["format"]
    assert detail["group"]["rollouts"][0]["reward_components"] == {"format": 0.5}


def test_the_runs_completed_figure_leaves_truncated_rollouts_out(tmp_path: Path) -> None:
    """5 of 8 rollouts cut by a gateway limit: 37.5% completed, 62.5% truncated, not 100%."""
    store = FileStore(tmp_path, "exp")
    for i in range(1, 9):
        record = small_record(i)
        store.write(record.model_copy(update={"status": "truncated"}) if i <= 5 else record)
    totals = RunIndex(open_run(str(store.path)), recheck_s=0.0).totals()
    assert (totals["completed_rate"], totals["truncated_rate"]) == (3 / 8, 5 / 8)
    assert totals["success_rate"] == 1.0  # ran to the end, whatever cut it
