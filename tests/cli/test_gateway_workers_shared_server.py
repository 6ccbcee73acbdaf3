"""`rollway gateway --workers 2` on one vLLM server (simulated, as vLLM 0.32 in dev mode) that
both workers share: a weight update reaches the server once, not once per worker, and a worker
started again adopts the version without the server loading anything; tokens on both workers
carry the version. The real server's leg: tests/engines/remote/test_vllm_gateway_workers.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollway.engines.sim import SimConfig
from rollway.gateway import RemoteGateway
from rollway.gateway.weight_control import NewWeights
from rollway.simulators.vllm_server import VLLMSim, VLLMSimConfig, create_vllm_sim_app
from rollway.web.background_server import BackgroundServer
from tests.cli.test_gateway_command import free_port
from tests.cli.test_gateway_rollout_ttl import wait_until_serving
from tests.cli.test_gateway_workers import ADMIN_KEY, converse, kill_worker_and_wait, on_worker
from tests.engines.remote.checkpoints import write_checkpoint


@pytest.fixture
def shared_server() -> Iterator[tuple[str, VLLMSim]]:
    options = VLLMSimConfig(version="0.32.0", dev_mode=True, model="smollm2")
    app = create_vllm_sim_app(SimConfig(output_len=6), options)
    with BackgroundServer(app) as url:  # type: ignore[arg-type]
        yield url, app.state.vllm


@pytest.fixture
def front(shared_server: tuple[str, VLLMSim]) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "ROLLWAY_ADMIN_KEY": ADMIN_KEY}
    engine = "vllm://" + shared_server[0].removeprefix("http://")
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", engine, "--port", str(port),
           "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url) as client:
            wait_until_serving(proc, client)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def versions_on(gateway: RemoteGateway, rollout_id: str) -> set[int]:
    await converse(gateway, rollout_id, 2)
    trajectory = await gateway.trajectory(rollout_id)
    return {v for turn in trajectory.turns for v in turn.policy_versions or []}


@pytest.mark.timeout(240)
def test_an_update_through_the_front_loads_the_shared_server_once(
    shared_server: tuple[str, VLLMSim], front: str, tmp_path: Path
) -> None:
    _, vllm = shared_server
    folder = str(write_checkpoint(tmp_path / "v1"))

    async def update_then_sample() -> None:
        gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
        update = await gateway.update_weights(NewWeights(folder, mode="abort"))
        assert update.version == 1
        assert vllm.loaded == [folder]  # once, by one worker; the other adopted the version
        assert vllm.paused is None  # every worker's pause was resumed
        for index in (0, 1):
            assert await versions_on(gateway, on_worker(index, f"after-{index}-")) == {1}
        await gateway.close()

    asyncio.run(update_then_sample())
    kill_worker_and_wait(front, 1)
    assert vllm.loaded == [folder]  # the restarted worker adopted it: nothing loaded again

    async def on_the_restarted_worker() -> None:
        gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
        assert await versions_on(gateway, on_worker(1, "fresh-")) == {1}
        await gateway.close()

    asyncio.run(on_the_restarted_worker())
