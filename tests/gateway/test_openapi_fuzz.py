"""The gateway publishes an OpenAPI document generated from its wire models, and a bounded
fuzzer driven by that document finds no server error and no non-JSON error body."""

from __future__ import annotations

import uuid

import httpx
import pytest
from schemathesis import Case
from starlette.routing import Route

from rollway.gateway import create_app
from tests.conftest import Served
from tests.gateway.fuzzing import fuzz


def register(admin: httpx.Client) -> tuple[str, str]:
    rollout_id = f"fz-{uuid.uuid4().hex[:10]}"
    reg = admin.post(f"/v1/rollouts/{rollout_id}/register", json={}).json()
    return rollout_id, reg["api_key"]


def test_the_document_lists_every_route_with_its_body_schema(sim_served: Served) -> None:
    document = httpx.get(f"{sim_served.url}/openapi.json").json()
    app = create_app(sim_served.gateway, admin_key="k", close_engine=False)
    served_routes = {
        (method.lower(), route.path)
        for route in app.routes
        if isinstance(route, Route) and route.path != "/openapi.json"
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {(m, p) for p, ops in document["paths"].items() for m in ops}
    assert documented == served_routes
    chat = document["paths"]["/v1/rollouts/{rollout_id}/chat/completions"]["post"]
    body = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][body.rsplit("/", 1)[1]]
    assert "messages" in schema["required"] and schema["additionalProperties"] is False
    assert chat["security"] == [{"rolloutKey": []}] and "422" in chat["responses"]


def test_the_document_types_the_metrics_text_and_the_stream_events(sim_served: Served) -> None:
    document = httpx.get(f"{sim_served.url}/openapi.json").json()
    metrics = httpx.get(f"{sim_served.url}/metrics", headers=sim_served.admin_headers)
    documented = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(documented) == [metrics.headers["content-type"]]
    assert documented[metrics.headers["content-type"]]["schema"] == {"type": "string"}
    chat = document["paths"]["/v1/rollouts/{rollout_id}/chat/completions"]["post"]
    events = chat["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert events["type"] == "array"
    event = document["components"]["schemas"][events["items"]["$ref"].rsplit("/", 1)[1]]
    assert set(event["properties"]) == {"event", "data"} and event["required"] == ["data"]


@pytest.mark.timeout(240)
def test_fuzzing_the_gateway_finds_no_server_error(sim_served: Served) -> None:
    def prepare(case: Case, coin: bool) -> None:
        security = case.operation.definition.raw.get("security", [{}])[0]
        if "rolloutKey" in security:
            rollout_id, key = register(admin)
            case.path_parameters = {"rollout_id": rollout_id}
            case.headers = {**(case.headers or {}), "Authorization": f"Bearer {key}"}
        elif "adminKey" in security:
            if coin and "rollout_id" in (case.path_parameters or {}):  # a rollout that exists
                case.path_parameters = {"rollout_id": register(admin)[0]}
            case.headers = {**(case.headers or {}), **sim_served.admin_headers}

    with httpx.Client(base_url=sim_served.url, headers=sim_served.admin_headers) as admin:
        report = fuzz(sim_served.url, prepare, max_examples=8)
        assert report.calls >= 150, report
        # The keys were right: the fuzzer got past authentication, to success and validation.
        chat = report.statuses["POST /v1/rollouts/{rollout_id}/chat/completions"]
        assert 200 in chat and 422 in chat, report.statuses
        # Still serving.
        assert admin.get("/health").json()["status"] == "ok"
        rollout_id, key = register(admin)
        answer = admin.post(
            f"/v1/rollouts/{rollout_id}/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={"messages": [{"role": "user", "content": "still there?"}]},
        )
        assert answer.status_code == 200
