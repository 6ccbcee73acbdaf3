"""When an experiment's lease is live: a fresh heartbeat from a process that has not been seen
to end. A holder seen gone from its own machine lapses at once; one elsewhere, by its TTL."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rollway.errors import ExperimentInUseError
from rollway.leases import Lease, LeaseHolder, _process_start, check_free


def lease_of(holder: LeaseHolder, age_s: float = 0.0, ttl_s: float = 30.0) -> Lease:
    return Lease(exp_id="exp", holder=holder, renewed_at=time.time() - age_s, ttl_s=ttl_s)


def test_a_fresh_lease_of_a_live_process_is_live_until_its_heartbeat_is_stale() -> None:
    holder = LeaseHolder.this_process()
    assert lease_of(holder).is_live()
    assert not lease_of(holder, age_s=31.0).is_live()


def test_a_holder_killed_on_this_machine_lapses_at_once() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        here = LeaseHolder.this_process()
        start = _process_start(process.pid)
        assert start
        holder = here.model_copy(update={"pid": process.pid, "process_start": start})
        assert lease_of(holder).is_live()
    finally:
        process.kill()
        process.wait(10)
    assert not lease_of(holder).is_live()
    # A pid reused by another process is not the holder either.
    reused = holder.model_copy(update={"pid": here.pid})
    assert not lease_of(reused).is_live()


def test_a_holder_on_another_machine_is_trusted_until_its_ttl() -> None:
    elsewhere = LeaseHolder.this_process().model_copy(update={"machine": "other:1", "pid": 1})
    assert lease_of(elsewhere).is_live()
    assert not lease_of(elsewhere, age_s=31.0).is_live()


def test_another_live_holder_is_named_in_the_refusal() -> None:
    first, second = LeaseHolder.this_process(), LeaseHolder.this_process()
    check_free(lease_of(first), first, "here")  # its own lease: a renewal
    check_free(None, second, "here")
    with pytest.raises(ExperimentInUseError) as refused:
        check_free(lease_of(first), second, "lease at /runs/exp/lease.json")
    message = str(refused.value)
    assert "experiment 'exp' is in use by another client (lease at /runs/exp/lease.json)" in message
    assert f"pid {first.pid} on {first.host}, started " in message
    assert first.id[:8] in message and refused.value.param == "exp_id"


def test_a_heartbeat_dated_ahead_is_live_only_within_its_ttl_ahead() -> None:
    elsewhere = LeaseHolder.this_process().model_copy(update={"machine": "other:1"})
    assert lease_of(elsewhere, age_s=-20.0).is_live()  # a clock 20 s ahead of this one
    assert not lease_of(elsewhere, age_s=-31.0).is_live()
    assert not lease_of(elsewhere, age_s=-1e12).is_live()  # a hand edit: never held for good
