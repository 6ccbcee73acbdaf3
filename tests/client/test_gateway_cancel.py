"""A cancel made at the gateway, not by the client (its admin route; the in-process core's
``cancel``), is a cancel: the rollout is recorded ``cancelled``, never as the agent's error, and
resume runs it again."""

from __future__ import annotations

import asyncio
import concurrent.futures
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rollway.client import RolloutClient
from rollway.engines.sim import SimEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import GenerationResult, SamplingParams
from rollway.results import RolloutRecord
from rollway.web.background_server import BackgroundServer
from tests.client.conftest import ScriptedAgent
from tests.conftest import Served

TASKS = [{"task_id": "t", "chats": 1, "reward": 1.0}]


class FirstTurnHangs(SimEngine):
    """The first generation waits until it is aborted (by the cancel under test); the rest
    answer at once."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.first: str | None = None
        self._woken: asyncio.Event | None = None

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        if self.first is not None:
            return await super().generate(input_ids, sampling, request_id)
        self.first, self._woken = request_id, asyncio.Event()
        self.started.set()
        await asyncio.wait_for(self._woken.wait(), 20)
        return GenerationResult([], [], "abort", [])

    async def abort(self, request_id: str) -> None:
        if request_id == self.first and self._woken is not None:
            self._woken.set()
        await super().abort(request_id)

    @property
    def first_rollout(self) -> str:
        assert self.first is not None
        return self.first.rsplit("-", 1)[0]  # request ids are <rollout id>-<turn>


@pytest.fixture
def hanging() -> FirstTurnHangs:
    return FirstTurnHangs()


@pytest.fixture
def served_hanging(hanging: FirstTurnHangs, renderer: ChatRenderer) -> Iterator[Served]:
    gateway = Gateway(hanging, renderer, model_name="sim")
    admin_key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin_key)) as url:
        yield Served(url, admin_key, gateway)


def run_cancelled_at_gateway(
    client: RolloutClient, engine: FirstTurnHangs, cancel: Callable[[str], None]
) -> RolloutRecord:
    """Run TASKS; once the first turn is generating, cancel its rollout at the gateway."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        batch = pool.submit(lambda: [item.result for item in client.run_batch(TASKS)])
        assert engine.started.wait(20), "the first turn never started"
        cancel(engine.first_rollout)
        (record,) = batch.result(timeout=20)
    return record


def assert_cancelled_then_resumed(client: RolloutClient, record: RolloutRecord) -> None:
    assert record.status == "cancelled", (record.status, record.error_kind, record.reason)
    assert record.error_kind is None and record.reward is None
    assert "cancelled at the gateway" in (record.reason or "")
    assert client.store.get("t.0").status == "cancelled"
    (again,) = [item.result for item in client.run_batch(TASKS)]  # resume runs it again
    assert again.status == "completed" and again.reward == 1.0
    assert client.store.get("t.0").status == "completed"


def test_a_cancel_through_the_gateway_admin_route_is_recorded_cancelled_and_rerun(
    hanging: FirstTurnHangs, served_hanging: Served, tmp_path: Path
) -> None:
    remote = RemoteGateway(served_hanging.url, admin_key=served_hanging.admin_key)

    def cancel(rollout_id: str) -> None:
        url = f"{served_hanging.url}/v1/rollouts/{rollout_id}/cancel"
        assert httpx.post(url, headers=served_hanging.admin_headers).status_code == 200

    with RolloutClient(ScriptedAgent, remote, store=str(tmp_path), exp_id="gw-cancel") as client:
        record = run_cancelled_at_gateway(client, hanging, cancel)
        assert_cancelled_then_resumed(client, record)


def test_a_cancel_through_the_in_process_gateway_core_is_recorded_cancelled_and_rerun(
    hanging: FirstTurnHangs, renderer: ChatRenderer, tmp_path: Path
) -> None:
    gateway = Gateway(hanging, renderer, model_name="sim")
    with RolloutClient(ScriptedAgent, gateway, store=str(tmp_path), exp_id="core-cancel") as client:

        def cancel(rollout_id: str) -> None:
            done = asyncio.run_coroutine_threadsafe(gateway.cancel(rollout_id), client._loop.loop)
            done.result(10)

        record = run_cancelled_at_gateway(client, hanging, cancel)
        assert_cancelled_then_resumed(client, record)
