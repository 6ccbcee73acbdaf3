"""The files a FileStore leaves: an index read last-line-per-key, no temporary file after a
killed write, record files readable like any other file the user writes."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollway.store import FileStore, index_row, read_index
from rollway.store.file import FILE_FIELDS, INDEX_REASON_CHARS
from tests.store.test_file_store import record
from tests.viewer.test_listing_scale import small_record


def tmp_files(exp: Path) -> list[str]:
    return sorted(p.name for p in exp.rglob("*.tmp"))


def test_the_index_gains_a_line_per_write_and_read_index_takes_the_last_per_key(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path, "exp")
    store.write(record("t.0", reward=None, status="cancelled"))
    store.write(record("t.1", reward=0.0))
    store.write(record("t.0", reward=1.0))  # a rerun of a cancelled rollout
    with (store.path / "index.jsonl").open("ab") as index:
        index.write(b'{"key": "t.2", "sta')  # a writer died mid-line
    store = FileStore(tmp_path, "exp")  # the next run
    store.write(record("t.3", reward=0.5))
    assert len((store.path / "index.jsonl").read_bytes().splitlines()) == 5
    entries = read_index(store.path)
    assert list(entries) == ["t.0", "t.1", "t.3"]
    assert entries["t.0"].status == "completed" and entries["t.0"].reward == 1.0
    assert entries["t.3"].reward == 0.5
    assert read_index(tmp_path / "nothing-here") == {}


CHILD = """
import os, signal, sys
from rollway.store import FileStore
from tests.store.test_file_store import record
from tests.viewer.test_listing_scale import small_record

store = FileStore(sys.argv[1], "exp")
store.write(record("t.0", reward=1.0))
os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)  # killed in the middle of a write
store.write(record("t.0", reward=0.0))
"""


def test_a_write_killed_midway_leaves_no_tmp_file_after_the_next_open(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)], cwd=Path(__file__).parents[2],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert child.returncode == -9, child.stderr
    assert len(tmp_files(tmp_path / "exp")) == 1  # what the killed write left
    store = FileStore(tmp_path, "exp")
    assert tmp_files(tmp_path / "exp") == []
    assert store.get("t.0").reward == 1.0 and store.keys() == {"t.0"}


@pytest.fixture
def blocked_fsync(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[threading.Event, threading.Event]]:
    entered, release = threading.Event(), threading.Event()
    real = os.fsync

    def slow(fd: int) -> None:
        entered.set()
        assert release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fsync", slow)
    yield entered, release
    release.set()


def test_a_live_writers_tmp_file_is_left_alone_by_another_store(
    tmp_path: Path, blocked_fsync: tuple[threading.Event, threading.Event]
) -> None:
    entered, release = blocked_fsync
    writer = FileStore(tmp_path, "exp")
    thread = threading.Thread(target=writer.write, args=(record("t.0"),))
    thread.start()
    assert entered.wait(10)
    FileStore(tmp_path, "exp")  # another worker opens the same experiment
    assert len(tmp_files(tmp_path / "exp")) == 1
    release.set()
    thread.join(10)
    assert writer.get("t.0") is not None and tmp_files(tmp_path / "exp") == []


def test_files_get_the_permissions_the_umask_gives(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = FileStore(tmp_path, "exp")
        store.write(record("t.0"))
        store.write_summary("summary", {"total": 1})
    finally:
        os.umask(old)
    for path in (store.path / "trajectories" / "t.0.json", store.path / "summary.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_an_index_line_carries_what_a_listing_shows(tmp_path: Path) -> None:
    store = FileStore(tmp_path, "exp")
    full = small_record(1)  # two turns: 4 and 2 sampled tokens
    failed = record("t.1", reward=None, status="error").model_copy(
        update={"error_kind": "agent", "reason": "x" * 1000, "trajectory": None}
    )
    store.write(full)
    store.write(failed)
    rows = {k: e.row for k, e in read_index(store.path).items()}
    written = (store.path / "trajectories" / f"{full.rollout_key}.json").lstat()
    assert rows[full.rollout_key] == {
        "key": full.rollout_key, "status": "completed", "reward": 0.5,
        "rollout_id": full.rollout_id, "group_id": full.group_id, "task_index": 0,
        "sample_index": 1, "error_kind": None, "reason": None, "attempts": 1,
        "started_at": full.started_at, "elapsed_s": full.elapsed_s, "turns": 2,
        "sampled_tokens": 6, "policy_version": None, "reward_components": {},
        # The record file as written: a reader tells a file changed since by these.
        "bytes": len(full.stored()), "mtime_ns": written.st_mtime_ns,
    }  # fmt: skip
    assert rows["t.1"]["turns"] is None and rows["t.1"]["error_kind"] == "agent"
    assert len(rows["t.1"]["reason"]) == INDEX_REASON_CHARS
    assert rows["t.1"]["reason"].startswith("xxx") and rows["t.1"]["reason"].endswith("\u2026")
    light = full.light()  # a Ray worker's copy: the figures travel without the trajectory
    assert index_row(light) == {
        k: v for k, v in rows[full.rollout_key].items() if k not in FILE_FIELDS
    }
