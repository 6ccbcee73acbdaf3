"""The agent server publishes an OpenAPI document generated from its wire models, and a bounded
fuzzer driven by that document finds no server error and no non-JSON error body."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from schemathesis import Case

from rollway.agents import AgentLoop, RolloutContext
from rollway.results import AgentResult
from tests.agents.server.fixtures import AUTH, AgentServer
from tests.gateway.fuzzing import fuzz


class DoneAgent(AgentLoop):
    """Finishes at once without calling anything: fuzzed inits name random gateways."""

    name = "done"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        return ctx.complete([{"role": "user", "content": str(ctx.task)[:100]}], reward=1.0)


def test_the_document_describes_init_from_its_wire_model(
    agent_server: Callable[..., AgentServer],
) -> None:
    server = agent_server(DoneAgent)
    document = httpx.get(f"{server.url}/openapi.json").json()
    assert set(document["paths"]) == {
        "/v1/rollout/init", "/v1/rollout/{rollout_id}", "/v1/rollout/{rollout_id}/cancel",
        "/v1/health", "/health",
    }  # fmt: skip
    init = document["paths"]["/v1/rollout/init"]["post"]
    schema = document["components"]["schemas"]["InitRequest"]
    assert {"rollout_id", "exp_id", "base_url", "api_key", "task"} <= set(schema["required"])
    assert schema["properties"]["exp_id"]["pattern"].startswith("^[A-Za-z0-9_-]")
    assert {"202", "401", "409", "422", "429"} <= set(init["responses"])
    assert init["parameters"][0]["name"] == "Idempotency-Key"


@pytest.mark.timeout(240)
def test_fuzzing_the_agent_server_finds_no_server_error(
    agent_server: Callable[..., AgentServer], tmp_path: Path
) -> None:
    server = agent_server(DoneAgent, store=str(tmp_path / "reports"))
    assert server.init("known").status_code == 202

    def prepare(case: Case, coin: bool) -> None:
        if case.operation.definition.raw.get("security"):
            case.headers = {**(case.headers or {}), **AUTH}
        if isinstance(case.body, dict):
            case.body.pop("callback_url", None)  # no report goes out to random addresses
            if coin and "base_url" in case.body:
                # Half the inits name a URL a client could call: random ones that fit the
                # schema's pattern mostly name no host, and the fuzz must reach a 202 too.
                case.body["base_url"] = "http://127.0.0.1:9/v1"
        if coin and case.path_parameters:
            case.path_parameters = {"rollout_id": "known"}

    report = fuzz(server.url, prepare, max_examples=8)
    assert report.calls >= 60, report
    init = report.statuses["POST /v1/rollout/init"]
    assert 202 in init and 422 in init, report.statuses
    assert 200 in report.statuses["GET /v1/rollout/{rollout_id}"]
    # Still serving, and the store holds only experiment folders that follow the id rule.
    assert server.http.get("/health").json() == {"status": "ok"}
    assert server.init("after", idempotency_key="after-1").status_code == 202
    assert server.wait_finished("after")["status"] == "completed"
    assert all(not p.name.startswith(".") for p in (tmp_path / "reports").iterdir())
