"""A simulated vLLM server: token-in/token-out ``/v1/completions``, aborted by disconnect."""

from __future__ import annotations

import time
import uuid

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollway.simulators.common import Simulator, generate_until_disconnect, sampling_from


def routes(sim: Simulator) -> list[Route]:
    async def completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not prompt or not body.get("return_token_ids"):
            error = "prompt must be token ids and return_token_ids true"
            return JSONResponse({"error": error}, status_code=400)
        rid = body.get("request_id") or uuid.uuid4().hex
        sampling = sampling_from(body, body.get("max_tokens"), body.get("seed"))
        fault = sim.next_fault()
        result = await generate_until_disconnect(request, sim, rid, prompt, sampling, fault)
        logprobs = {
            "tokens": [f"token_id:{t}" for t in result.output_ids],
            "token_logprobs": result.logprobs,
            "top_logprobs": None,
            "text_offset": [0] * len(result.output_ids),
        }
        choice = {
            "index": 0,
            "text": "",
            "logprobs": logprobs,
            "finish_reason": result.finish_reason,
            "token_ids": result.output_ids,
            "prompt_token_ids": prompt,
        }
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(result.output_ids)}
        payload = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": body.get("model") or "sim",
            "choices": [choice],
            "usage": usage,
        }
        return sim.respond(payload, fault)

    return [Route("/v1/completions", completions, methods=["POST"])]


async def health(request: Request) -> Response:
    return Response(status_code=200)
