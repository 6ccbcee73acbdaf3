"""HTTP handlers of one rollout's life: register, its model list, its trajectory, cancel,
unregister."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response

from rollway import json_text
from rollway.gateway.http.app_state import gateway_of, query_flag, read_body, require_admin
from rollway.gateway.http.rollout_lookup import authorized_rollout
from rollway.gateway.request_schema import RegisterRequest
from rollway.trajectory import Trajectory
from rollway.trajectory_format import whole_prompts as whole_prompts_of
from rollway.validation import parse_model
from rollway.web.handlers import JSONResponse


async def register(request: Request) -> Response:
    require_admin(request)
    rollout_id = request.path_params["rollout_id"]
    body = parse_model(RegisterRequest, await read_body(request))
    reuse = query_flag(request, "reuse")
    client = request.query_params.get("client")
    registration = gateway_of(request).register(rollout_id, body, reuse=reuse, client=client)
    base_url = f"{str(request.base_url).rstrip('/')}/v1/rollouts/{rollout_id}"
    return JSONResponse(
        {"rollout_id": rollout_id, "base_url": base_url, "api_key": registration.api_key}
    )


async def models(request: Request) -> Response:
    _, gateway = authorized_rollout(request)
    name = gateway.model_name
    # OpenAI's fields and Anthropic's (type, display_name, created_at, the page's ids).
    model = {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "rollway",
        "type": "model",
        "display_name": name,
        "created_at": "1970-01-01T00:00:00Z",
    }
    page = {"has_more": False, "first_id": name, "last_id": name}
    return JSONResponse({"object": "list", "data": [model]} | page)


async def trajectory(request: Request) -> Response:
    require_admin(request)
    samples = query_flag(request, "samples")
    prompts = query_flag(request, "whole_prompts")
    found = await gateway_of(request).trajectory(request.path_params["rollout_id"])
    body = await asyncio.to_thread(trajectory_body, found, samples, prompts)  # grows with it
    return Response(body, media_type="application/json")


async def cancel(request: Request) -> Response:
    require_admin(request)
    await gateway_of(request).cancel(request.path_params["rollout_id"])
    return JSONResponse({"cancelled": True})


async def unregister(request: Request) -> Response:
    require_admin(request)
    await gateway_of(request).unregister(request.path_params["rollout_id"])
    return JSONResponse({"unregistered": True})


def trajectory_body(trajectory: Trajectory, samples: bool, whole_prompts: bool) -> bytes:
    """The trajectory as JSON; for tools that read it without rollway, optionally with its
    samples and each turn's whole prompt (which grow with the square of the conversation)."""
    if not samples and not whole_prompts:
        return trajectory.model_dump_json().encode()
    body = trajectory.model_dump(mode="json")
    if samples:
        body["samples"] = [sample.model_dump(mode="json") for sample in trajectory.samples]
    if whole_prompts and trajectory.has_token_ids:
        prompts = whole_prompts_of(trajectory.turns)
        for turn, (_, prompt) in zip(body["turns"], prompts, strict=True):
            turn["prompt_ids"] = prompt
    return json_text.dumps(body)
