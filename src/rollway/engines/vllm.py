"""vLLM's OpenAI-compatible server with token ids in and out: ``POST /v1/completions`` with
the prompt as token ids, ``return_token_ids`` for the sampled ids and ``logprobs: 0`` for the
sampled tokens' logprobs. vLLM aborts a request when its client disconnects, so ``abort``
cancels the HTTP request."""

from __future__ import annotations

from typing import Any

from rollway.engines.remote import DisconnectAbort, RemoteClient
from rollway.errors import EngineError
from rollway.types import FinishReason, GenerationResult, SamplingParams


class VLLMEngine:
    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        timeout_s: float = 600.0,
        http: RemoteClient | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.http = http or RemoteClient(timeout_s=timeout_s)
        self._calls = DisconnectAbort()

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        payload = vllm_payload(input_ids, sampling, request_id, self.model)
        url = f"{self.base_url}/v1/completions"
        body = await self._calls.send(self.http, url, payload, request_id)
        if body is None:
            return GenerationResult([], [], "abort")
        return parse_completion(body)

    async def abort(self, request_id: str) -> None:
        self._calls.abort(request_id)

    async def health(self) -> bool:
        return await self.http.get_ok(f"{self.base_url}/health")

    async def close(self) -> None:
        await self.http.close()


def vllm_payload(
    input_ids: list[int], sampling: SamplingParams, request_id: str, model: str | None
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "prompt": input_ids,
        "request_id": request_id,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "stop": list(sampling.stop),
        "stop_token_ids": list(sampling.stop_token_ids),
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if model is not None:
        payload["model"] = model
    if sampling.max_tokens is not None:
        payload["max_tokens"] = sampling.max_tokens
    if sampling.seed is not None:
        payload["seed"] = sampling.seed
    return payload


def parse_completion(body: Any) -> GenerationResult:
    """Ids, logprobs and finish reason of a ``/v1/completions`` answer."""
    try:
        choice = body["choices"][0]
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
        finish = choice["finish_reason"]
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise EngineError(f"malformed vLLM completion: missing or bad {exc!r}") from exc
    if len(ids) != len(logprobs):
        raise EngineError("vLLM completion: token_ids and token_logprobs differ in length")
    reason: FinishReason = (
        "length" if finish == "length" else "abort" if finish == "abort" else "stop"
    )
    return GenerationResult(ids, logprobs, reason)
