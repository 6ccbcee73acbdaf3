"""The experiment's lease in a store, folder and object storage alike: one holder at a time,
renewals by the holder, the holder named to anyone refused, and a lease whose holder is gone
(or whose heartbeat is stale) taken over."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rollway.errors import ExperimentInUseError, StoredDataError
from rollway.leases import Lease, LeaseHolder
from rollway.store import FileStore, store_from_uri
from rollway.store.base import Store
from rollway.store.object_store import ObjectStore

TAKE_AND_WAIT = """
import sys, time
from rollway.leases import Lease, LeaseHolder
from rollway.store import store_from_uri
holder = LeaseHolder.this_process()
store_from_uri(sys.argv[1], "exp").take_lease(
    Lease(exp_id="exp", holder=holder, renewed_at=time.time(), ttl_s=30.0))
print(holder.id, flush=True)
sys.stdin.read()
"""


@pytest.fixture(params=["file", "s3"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return str(tmp_path / "runs") if request.param == "file" else request.getfixturevalue("s3_env")


@pytest.fixture
def store(uri: str) -> Store:
    return store_from_uri(uri, "exp")


def lease(holder: LeaseHolder, age_s: float = 0.0) -> Lease:
    return Lease(exp_id="exp", holder=holder, renewed_at=time.time() - age_s, ttl_s=30.0)


def test_a_second_holder_is_refused_by_name_until_the_first_releases(store: Store) -> None:
    first, second = LeaseHolder.this_process(), LeaseHolder.this_process()
    store.take_lease(lease(first))
    store.take_lease(lease(first))  # a heartbeat
    with pytest.raises(ExperimentInUseError, match=f"pid {first.pid} on {first.host}"):
        store.take_lease(lease(second))
    store.release_lease(second)  # not its lease: nothing happens
    with pytest.raises(ExperimentInUseError, match=first.id[:8]):
        store.take_lease(lease(second))
    store.release_lease(first)
    store.take_lease(lease(second))
    with pytest.raises(ExperimentInUseError, match=second.id[:8]):
        store.take_lease(lease(first))


def test_a_lease_with_a_stale_heartbeat_is_taken_over(store: Store) -> None:
    elsewhere = LeaseHolder.this_process().model_copy(update={"machine": "other:1", "pid": 1})
    store.take_lease(lease(elsewhere, age_s=31.0))
    store.take_lease(lease(LeaseHolder.this_process()))


def test_the_lease_of_a_killed_process_is_taken_over_at_once(store: Store, uri: str) -> None:
    mine = LeaseHolder.this_process()
    with subprocess.Popen(
        [sys.executable, "-c", TAKE_AND_WAIT, uri],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as process:  # fmt: skip
        try:
            assert process.stdout is not None and process.stdout.readline().strip()
            with pytest.raises(ExperimentInUseError, match=f"pid {process.pid} "):
                store.take_lease(lease(mine))
        finally:
            process.kill()  # closing the block reaps it
    store.take_lease(lease(mine))  # its heartbeat is fresh, but its process is gone


def put_lease(store: Store, body: bytes) -> str:
    """Write ``body`` where the store keeps the lease; where that is, as errors name it."""
    if isinstance(store, FileStore):
        (store.path / "lease.json").write_bytes(body)
        return str(store.path / "lease.json")
    assert isinstance(store, ObjectStore)
    store._put("lease.json", body)
    return f"{store.uri}/lease.json"


def lease_body(**changes: object) -> bytes:
    elsewhere = LeaseHolder.this_process().model_copy(update={"machine": "other:1", "pid": 1})
    return lease(elsewhere).model_copy(update=changes).model_dump_json().encode()


BROKEN = {
    "empty": (b"", "Invalid JSON"),
    "garbage": (b"\x00lease?", "Invalid JSON"),
    "endless ttl": (lease_body(ttl_s=1e300), "ttl_s: Input should be less than or equal to 3600"),
    "a list": (b"[]", "Input should be an object"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_lease_is_an_error_naming_the_file_and_the_fix(store: Store, case: str) -> None:
    body, reason = BROKEN[case]
    where = put_lease(store, body)
    with pytest.raises(StoredDataError) as refused:
        store.take_lease(lease(LeaseHolder.this_process()))
    message = str(refused.value)
    assert message.startswith(f"the experiment's lease {where} cannot be read ({reason}")
    assert message.endswith(f"): remove {where} if no run holds the experiment (a running "
                            "client writes it anew at its next heartbeat)")  # fmt: skip
    put_lease(store, lease_body(renewed_at=time.time() - 31.0))  # the fix: a readable lease
    store.take_lease(lease(LeaseHolder.this_process()))


def test_a_lease_renewed_in_the_future_lapses_past_its_ttl_ahead(store: Store) -> None:
    put_lease(store, lease_body(renewed_at=time.time() + 3600 * 24 * 365))  # a hand edit
    store.take_lease(lease(LeaseHolder.this_process()))
    put_lease(store, lease_body(renewed_at=time.time() + 20.0))  # a clock 20 s ahead: live
    with pytest.raises(ExperimentInUseError):
        store.take_lease(lease(LeaseHolder.this_process()))


def test_a_lease_that_is_a_folder_or_a_link_is_named_and_never_followed(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "runs", "exp")
    path = store.path / "lease.json"
    path.mkdir()
    with pytest.raises(StoredDataError, match=rf"lease {path} cannot be read \(a folder\): remove"):
        store.take_lease(lease(LeaseHolder.this_process()))
    path.rmdir()
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(lease_body())  # a live lease: following the link would obey it
    path.symlink_to(outside)
    with pytest.raises(StoredDataError, match="a symbolic link, which rollway does not follow"):
        store.take_lease(lease(LeaseHolder.this_process()))
    assert path.is_symlink()  # left for the user to look at, as the error says


def test_a_fifo_at_the_lease_lock_is_refused_at_once_naming_it(tmp_path: Path) -> None:
    """Opening a FIFO to write waits for a reader: the lock file must not hang a run."""
    store = FileStore(tmp_path / "runs", "exp")
    path = store.path / ".lease.lock"
    os.mkfifo(path)
    refused: list[BaseException] = []

    def take() -> None:
        try:
            store.take_lease(lease(LeaseHolder.this_process()))
        except BaseException as exc:
            refused.append(exc)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    taker.join(timeout=10)
    if taker.is_alive():  # hung in open(): a reader lets it go
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        taker.join(timeout=10)
    assert len(refused) == 1 and isinstance(refused[0], StoredDataError), refused
    assert str(refused[0]).startswith(f"the experiment's lease lock {path} is a FIFO")
    assert "remove it" in str(refused[0])
    path.unlink()  # the fix the message names
    store.take_lease(lease(LeaseHolder.this_process()))
