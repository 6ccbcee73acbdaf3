"""The experiment's lease in a store, folder and object storage alike: one holder at a time,
renewals by the holder, the holder named to anyone refused, and a lease whose holder is gone
(or whose heartbeat is stale) taken over."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollway.errors import ExperimentInUseError
from rollway.leases import Lease, LeaseHolder
from rollway.store import store_from_uri
from rollway.store.base import Store

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
