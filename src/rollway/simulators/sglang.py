"""A simulated SGLang server: the native ``/generate`` and ``/abort_request`` routes."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollway.simulators.common import Simulator, sampling_from


def routes(sim: Simulator) -> list[Route]:
    async def generate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        input_ids = body.get("input_ids")
        if not isinstance(input_ids, list) or not input_ids:
            return JSONResponse({"error": "input_ids must be a non-empty list"}, status_code=400)
        rid = body.get("rid") or uuid.uuid4().hex
        params = body.get("sampling_params") or {}
        sampling = sampling_from(params, params.get("max_new_tokens"), params.get("sampling_seed"))
        fault = sim.next_fault()
        result = await sim.generate(rid, input_ids, sampling, fault)
        finish: dict[str, Any] = {"type": result.finish_reason}
        pairs = [[lp, t, None] for lp, t in zip(result.logprobs, result.output_ids, strict=True)]
        meta = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(result.output_ids),
            "output_token_logprobs": pairs,
        }
        return sim.respond({"text": "", "output_ids": result.output_ids, "meta_info": meta}, fault)

    async def abort_request(request: Request) -> Response:
        await sim.abort(orjson.loads(await request.body()).get("rid", ""))
        return JSONResponse({"success": True})

    return [
        Route("/health", health, methods=["GET"]),
        Route("/generate", generate, methods=["POST"]),
        Route("/abort_request", abort_request, methods=["POST"]),
    ]


async def health(request: Request) -> Response:
    return Response(status_code=200)
