"""Any OpenAI-compatible chat-completions API as a chat-level engine (evaluation with hosted
models): messages in, message out, usage and logprobs where the API gives them, no token ids.
Aborting cancels the HTTP request (servers stop work for a disconnected client)."""

from __future__ import annotations

import os
from typing import Any

from rollway.engines.remote.connection import DisconnectAbort, RemoteClient
from rollway.errors import EngineError
from rollway.generation import ChatGeneration, SamplingParams


class OpenAIChatEngine:
    # Declared for the gateway (engines.base.ModelInfo): None, it does not know.
    tokenizer: Any = None
    context_length: int | None = None
    model_name: str | None

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.model_name = model
        key = (
            api_key or os.environ.get("ROLLWAY_OPENAI_API_KEY") or os.environ.get("OPENAI_API_KEY")
        )
        self.http = RemoteClient(timeout_s=timeout_s, bearer=key)
        self._calls = DisconnectAbort()

    async def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        sampling: SamplingParams,
        request_id: str,
    ) -> ChatGeneration:
        payload = chat_payload(self.model, messages, tools, sampling)
        url = f"{self.base_url}/chat/completions"
        body = await self._calls.send(self.http, url, payload, request_id)
        if body is None:
            return ChatGeneration({"role": "assistant", "content": ""}, "abort", 0, 0)
        return parse_chat_completion(body)

    async def abort(self, request_id: str) -> None:
        self._calls.abort(request_id)

    async def health(self) -> bool:
        return await self.http.get_ok(f"{self.base_url}/models")

    async def close(self) -> None:
        await self.http.close()


def chat_payload(
    model: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sampling: SamplingParams,
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "logprobs": True,
    }
    if tools:
        payload["tools"] = tools
    if sampling.max_tokens is not None:
        payload["max_tokens"] = sampling.max_tokens
    if sampling.stop:
        payload["stop"] = list(sampling.stop)
    if sampling.seed is not None:
        payload["seed"] = sampling.seed
    return payload


def parse_chat_completion(body: Any) -> ChatGeneration:
    try:
        choice = body["choices"][0]
        message = dict(choice["message"])
        finish = choice.get("finish_reason") or "stop"
        usage = body.get("usage") or {}
        entries = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(e["logprob"]) for e in entries] or None
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise EngineError(f"malformed chat completion: missing or bad {exc!r}") from exc
    message = {k: v for k, v in message.items() if v is not None}
    message.setdefault("content", None)
    return ChatGeneration(
        message,
        finish,
        int(usage.get("prompt_tokens", 0)),
        int(usage.get("completion_tokens", 0)),
        logprobs,
    )
