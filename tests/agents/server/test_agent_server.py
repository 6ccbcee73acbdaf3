"""The agent server over HTTP: auth, init and status, idempotency, the concurrency cap, cancel,
callbacks (retried, refused, receiver down), TTL, validation, and bad input."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from rollway.agents.server import create_app
from rollway.agents.server import service as service_module
from rollway.agents.server.report_sender import deliver_report
from rollway.errors import AgentError
from rollway.results import AgentReport
from rollway.store.file import FileStore
from rollway.web.http_client import new_session
from tests.agents.server.agents import NamelessTools, TaskDrivenAgent
from tests.agents.server.fixtures import AUTH, AgentServer, Receiver

Start = Callable[..., AgentServer]
StartReceiver = Callable[..., Receiver]


def test_health_is_open_and_everything_else_needs_the_key(agent_server: Start) -> None:
    server = agent_server()
    assert server.http.get("/health").json() == {"status": "ok"}
    assert server.http.get("/v1/health").status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert server.http.get("/v1/health", headers=wrong).status_code == 401
    assert server.http.post("/v1/rollout/init", json={}).status_code == 401
    assert server.http.get("/v1/rollout/r1").status_code == 401
    assert server.http.post("/v1/rollout/r1/cancel").status_code == 401
    detail = server.http.get("/v1/health", headers=AUTH).json()
    assert detail["agent"] == "task-driven"
    assert [t["function"]["name"] for t in detail["tools"]] == ["echo", "shout"]
    assert server.service.runs_started == 0


def test_init_answers_202_with_tools_and_the_report_lands_in_the_store(
    agent_server: Start, tmp_path: Path
) -> None:
    server = agent_server()
    answer = server.init("r1", task={"reward": 0.5}, tools=["shout"])
    assert answer.status_code == 202
    body = answer.json()
    assert body["status"] == "running" and body["created"] is True
    assert [t["function"]["name"] for t in body["tools"]] == ["shout"]
    status = server.wait_finished("r1")
    assert status["status"] == "completed"
    assert status["report"]["reward"] == 0.5 and status["report"]["agent"] == "task-driven"
    stored = FileStore(tmp_path / "reports", "exp").get_report(body["run_key"])
    assert stored is not None and stored.status == "completed" and stored.rollout_id == "r1"


def test_a_repeated_init_with_the_same_key_never_starts_a_second_run(agent_server: Start) -> None:
    server = agent_server()
    first = server.init("r1", task={"sleep": 0.3}, idempotency_key="k1").json()
    again = server.http.post(
        "/v1/rollout/init",
        json={"rollout_id": "r1", "exp_id": "exp", "base_url": "http://127.0.0.1:9/x",
              "api_key": "rk", "task": {"sleep": 0.3}},
        headers={**AUTH, "Idempotency-Key": "k1"},
    )  # fmt: skip
    assert again.status_code == 202
    assert again.json()["run_key"] == first["run_key"] == "k1"
    assert again.json()["created"] is False
    server.wait_finished("r1")
    after = server.init("r1", task={}, idempotency_key="k1").json()
    assert after["created"] is False and after["status"] == "completed"
    assert server.service.runs_started == 1 and TaskDrivenAgent.started == ["r1"]
    # Without the key, a second init of a running rollout id is refused, not run twice.
    server.init("r2", task={"sleep": 5})
    assert server.init("r2", task={}).status_code == 409


def test_beyond_the_cap_init_gets_429_with_retry_after(agent_server: Start) -> None:
    server = agent_server(max_concurrent=1, retry_after_s=2.0)
    assert server.init("r1", task={"sleep": 5}, idempotency_key="k1").status_code == 202
    refused = server.init("r2", task={})
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "2"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    # The running rollout's own repeat is still answered.
    assert server.init("r1", task={}, idempotency_key="k1").status_code == 202
    server.http.post("/v1/rollout/r1/cancel", headers=AUTH)
    server.wait_finished("r1")
    assert server.init("r2", task={}).status_code == 202
    assert server.service.runs_started == 2


def test_cancel_stops_a_running_agent_and_it_still_reports(
    agent_server: Start, receiver: StartReceiver
) -> None:
    server = agent_server(stop_grace_s=0.1)
    got = receiver()
    server.init("r1", task={"sleep": 60}, callback_url=got.url, callback_key="cb")
    answer = server.http.post("/v1/rollout/r1/cancel", headers=AUTH)
    assert answer.status_code == 202
    status = server.wait_finished("r1", timeout=5)
    assert status["status"] == "cancelled"
    assert got.accepted.wait(5) and got.bodies[0]["status"] == "cancelled"
    assert got.keys == ["Bearer cb"]
    assert server.http.post("/v1/rollout/r1/cancel", headers=AUTH).status_code == 200
    assert server.http.post("/v1/rollout/nope/cancel", headers=AUTH).status_code == 404


def test_agent_failures_and_timeouts_are_reported_with_reasons(agent_server: Start) -> None:
    server = agent_server(stop_grace_s=0.1)
    server.init("raise", task={"end": "raise"})
    server.init("error", task={"end": "error"})
    server.init("slow", task={"sleep": 60}, limits={"timeout_s": 0.2})
    raised = server.wait_finished("raise")["report"]
    assert raised["status"] == "error" and raised["error_kind"] == "agent"
    assert "ValueError: agent bug" in raised["reason"]
    assert server.wait_finished("error")["report"]["reason"] == "gave up"
    slow = server.wait_finished("slow")["report"]
    assert slow["status"] == "timeout" and "0.2" in slow["reason"]


def test_callbacks_are_retried_past_5xx_and_not_past_4xx(
    agent_server: Start, receiver: StartReceiver
) -> None:
    server = agent_server()
    flaky = receiver([503, 500])
    server.init("r1", task={}, callback_url=flaky.url)
    assert server.wait_finished("r1")["callback"] == "delivered"
    assert len(flaky.bodies) == 3 and flaky.accepted.is_set()
    refusing = receiver([404])
    server.init("r2", task={}, callback_url=refusing.url)
    assert server.wait_finished("r2")["callback"] == "refused"
    assert len(refusing.bodies) == 1


def test_a_receiver_that_is_down_loses_nothing(agent_server: Start, tmp_path: Path) -> None:
    server = agent_server(callback_attempts=3)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    key = server.init("r1", task={"reward": 1.0}, callback_url=dead).json()["run_key"]
    status = server.wait_finished("r1")
    assert status["callback"] == "failed"
    stored = FileStore(tmp_path / "reports", "exp").get_report(key)
    assert stored is not None and stored.reward == 1.0


async def test_a_callback_url_that_cannot_be_sent_to_is_a_failed_delivery() -> None:
    # Its host passes a URL parser but not IDNA (the resolver): no ClientError, a UnicodeError.
    report = AgentReport(run_key="k", rollout_id="r1", agent="a", status="completed",
                         started_at=0.0)  # fmt: skip
    async with new_session() as session:
        delivery = await deliver_report(session, "http://a..b", None, report, wait_s=0.01)
    assert delivery == "failed"


def test_a_run_that_fails_past_its_own_handling_still_ends_recorded(
    agent_server: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: object, **kwargs: object) -> str:
        raise RuntimeError("delivery bug")

    monkeypatch.setattr(service_module, "deliver_report", broken)
    server = agent_server()
    server.init("r1", task={"reward": 1.0}, callback_url="http://127.0.0.1:9")
    status = server.wait_finished("r1", timeout=5.0)
    assert status["callback"] == "failed"
    assert status["report"]["status"] == "completed" and status["report"]["reward"] == 1.0


def test_finished_rollouts_expire_but_their_key_still_finds_the_stored_report(
    agent_server: Start,
) -> None:
    server = agent_server(ttl_s=0.0)
    server.init("r1", task={}, idempotency_key="k1")
    server.wait_finished("r1")
    server.init("other", task={})  # sweeps expired rollouts
    assert server.http.get("/v1/rollout/r1", headers=AUTH).status_code == 404
    again = server.init("r1", task={}, idempotency_key="k1").json()
    assert again["created"] is False and again["status"] == "completed"
    assert TaskDrivenAgent.started.count("r1") == 1


def test_an_invalid_agent_is_refused_at_start_up() -> None:
    with pytest.raises(AgentError, match=r"BAD_TOOL_SCHEMA \(tools\[0\]\.function\.name\)"):
        create_app(NamelessTools, api_key="k")
    with pytest.raises(AgentError, match="NOT_AN_AGENT"):
        create_app(dict, api_key="k")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("body", "status", "names"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 422, "JSON object"),
        (b'{"exp_id": "exp"}', 422, "rollout_id"),
        (b'{"rollout_id": "a/b", "exp_id": "e", "base_url": "http://h", "api_key": "k",'
         b' "task": {}}', 422, "rollout_id"),
        (b'{"rollout_id": "r", "exp_id": "e", "base_url": "ftp://h", "api_key": "k",'
         b' "task": {}}', 422, "base_url"),
        (b'{"rollout_id": "r", "exp_id": "e", "base_url": "http://h", "api_key": "k",'
         b' "task": {}, "tools": ["nope"]}', 422, "nope"),
        (b'{"rollout_id": "r", "exp_id": "e", "base_url": "http://h", "api_key": "k",'
         b' "task": {}, "surprise": 1}', 422, "surprise"),
        (b'{"rollout_id": "r", "exp_id": "e", "base_url": "http://h", "api_key": "k",'
         b' "task": {}, "limits": {"timeout_s": -1}}', 422, "limits.timeout_s"),
    ],
)  # fmt: skip
def test_malformed_init_bodies_get_4xx_and_the_server_keeps_serving(
    agent_server: Start, body: bytes, status: int, names: str
) -> None:
    server = agent_server()
    answer = server.http.post(
        "/v1/rollout/init", content=body, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert answer.status_code == status
    assert names in answer.json()["error"]["message"]
    assert server.service.runs_started == 0
    assert server.init("ok", task={}).status_code == 202
