"""One live client per experiment: while a client runs a batch, another client's batch on the
same experiment (same store, or the same shared gateway) is refused before it starts anything,
with an error naming the first (host, pid, start time); once the first's batch ends, or the
first is killed, a new client goes on."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollway.client import RolloutClient
from rollway.client.lease_keeper import LeaseKeeper
from rollway.engines.sim import SimEngine
from rollway.errors import ExperimentInUseError
from rollway.gateway import Gateway, create_app
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.leases import Lease
from rollway.loop_thread import LoopThread
from rollway.store.file import FileStore
from rollway.web.background_server import BackgroundServer
from tests.agents.server.fixtures import wait_until
from tests.client.conftest import ScriptedAgent
from tests.conftest import Served

TASKS = [{"task_id": "t", "chats": 1, "reward": 1.0}]

#: A client's lease (store and gateway) held by another process until it is killed.
HOLD_LEASE = """
import sys
from rollway.client.lease_keeper import LeaseKeeper
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.loop_thread import LoopThread
from rollway.store import store_from_uri
store, url, key = sys.argv[1:]
keeper = LeaseKeeper("held", store_from_uri(store, "held"), RemoteGateway(url, admin_key=key))
with keeper.held(LoopThread()):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def served(renderer: ChatRenderer) -> Iterator[Served]:
    """A shared gateway over the sim engine, on loopback."""
    gateway = Gateway(SimEngine(), renderer, model_name="sim")
    admin_key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin_key)) as url:
        yield Served(url, admin_key, gateway)


def test_a_second_client_on_the_same_store_is_refused_naming_the_first(
    make_client: Callable[..., RolloutClient], tmp_path: Path
) -> None:
    first, second = make_client(exp_id="twice"), make_client(exp_id="twice")
    running = first.run_batch(TASKS)
    assert next(running).result.status == "completed"  # the batch holds the experiment
    with pytest.raises(ExperimentInUseError) as refused:
        next(second.run_batch(TASKS))
    message = str(refused.value)
    assert "experiment 'twice' is in use by another client" in message
    assert f"pid {os.getpid()} on {socket.gethostname()}, started " in message
    assert str(tmp_path / "runs" / "twice" / "lease.json") in message
    assert len(ScriptedAgent.starts) == 1  # the second started nothing
    assert list(running) == []  # the first batch ends: its lease is given back
    (item,) = second.run_batch(TASKS, resume=False)
    assert item.result.status == "completed"


def test_a_second_client_on_a_shared_gateway_is_refused_even_with_its_own_store(
    served: Served, tmp_path: Path
) -> None:
    def client(folder: str) -> RolloutClient:
        gateway = RemoteGateway(served.url, admin_key=served.admin_key)
        return RolloutClient(ScriptedAgent, gateway, store=str(tmp_path / folder), exp_id="gw")

    with client("a") as first, client("b") as second:
        running = first.run_batch(TASKS)
        assert next(running).result.status == "completed"
        with pytest.raises(ExperimentInUseError, match=f"at the gateway\\): pid {os.getpid()} "):
            next(second.run_batch(TASKS))
        assert not (tmp_path / "b" / "gw" / "lease.json").exists()  # given back
        assert list(running) == []
        (item,) = second.run_batch(TASKS)
        assert item.result.status == "completed"
        # A client whose batch ended holds nothing: the first may run again.
        assert [i.result.status for i in first.run_batch(TASKS, resume=False)] == ["completed"]


def test_a_killed_client_s_lease_is_taken_over_at_once(served: Served, tmp_path: Path) -> None:
    store = str(tmp_path / "runs")
    gateway = RemoteGateway(served.url, admin_key=served.admin_key)
    with subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, store, served.url, served.admin_key],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "held\n"
            with (
                RolloutClient(ScriptedAgent, gateway, store=store, exp_id="held") as client,
                pytest.raises(ExperimentInUseError, match=f"pid {holder.pid} "),
            ):
                next(client.run_batch(TASKS))
        finally:
            holder.kill()  # closing the block reaps it
    # Killed without giving anything back: its heartbeats are fresh, but its process is gone,
    # so both its leases (store and gateway) are taken over at once.
    with RolloutClient(ScriptedAgent, gateway, store=store, exp_id="held") as client:
        (item,) = client.run_batch(TASKS)
    assert item.result.status == "completed"


def test_a_held_lease_is_renewed_by_its_heartbeat_and_given_back(tmp_path: Path) -> None:
    store = FileStore(tmp_path, "beat")
    keeper, loop = LeaseKeeper("beat", store, None, ttl_s=0.3), LoopThread()
    lease_file = tmp_path / "beat" / "lease.json"

    def renewed_at() -> float:
        return Lease.model_validate_json(lease_file.read_bytes()).renewed_at

    try:
        with keeper.held(loop):
            first = renewed_at()
            wait_until(lambda: renewed_at() > first, timeout=10)  # a beat every ttl_s / 6
            assert Lease.model_validate_json(lease_file.read_bytes()).holder == keeper.holder
        assert not lease_file.exists()
    finally:
        loop.close()
