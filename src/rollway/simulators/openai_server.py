"""A simulated OpenAI chat-completions server (a hosted API: messages in, messages out)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from rollway.simulators.common import Simulator, generate_until_disconnect, sampling_from


def routes(sim: Simulator) -> list[Route]:
    async def chat_completions(request: Request) -> Response:
        body = orjson.loads(await request.body())
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not body.get("model"):
            return JSONResponse({"error": "messages and model are required"}, status_code=400)
        rid = uuid.uuid4().hex
        # The simulated "prompt" is a digest of the messages: the same chat gets the same answer.
        prompt = list(orjson.dumps(messages, option=orjson.OPT_SORT_KEYS)[-64:])
        sampling = sampling_from(body, body.get("max_tokens"), body.get("seed"))
        fault = sim.next_fault()
        result = await generate_until_disconnect(request, sim, rid, prompt, sampling, fault)
        words = [f"tok{t}" for t in result.output_ids]
        entries: list[dict[str, Any]] = [
            {"token": w, "logprob": lp, "bytes": None, "top_logprobs": []}
            for w, lp in zip(words, result.logprobs, strict=True)
        ]
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": " ".join(words)},
            "finish_reason": result.finish_reason,
            "logprobs": {"content": entries} if body.get("logprobs") else None,
        }
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(words),
            "total_tokens": len(prompt) + len(words),
        }
        payload = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [choice],
            "usage": usage,
        }
        return sim.respond(payload, fault)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "sim", "object": "model"}]})

    return [
        Route("/health", health, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
    ]


async def health(request: Request) -> Response:
    return Response(status_code=200)
