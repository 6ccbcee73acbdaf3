"""SGLang's native API: ``POST /generate`` with ``input_ids`` and ``rid``, logprobs from
``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` per output token), and
``POST /abort_request`` by rid."""

from __future__ import annotations

from typing import Any

from rollway.engines.remote import RemoteClient
from rollway.errors import EngineError
from rollway.types import FinishReason, GenerationResult, SamplingParams

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


class SGLangEngine:
    def __init__(
        self, base_url: str, *, timeout_s: float = 600.0, http: RemoteClient | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = http or RemoteClient(timeout_s=timeout_s)

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        payload = {
            "input_ids": input_ids,
            "rid": request_id,
            "sampling_params": sglang_sampling(sampling),
            "return_logprob": True,
            "logprob_start_len": -1,
            "stream": False,
        }
        body = await self.http.send(
            f"{self.base_url}/generate", payload, lambda: self.abort(request_id)
        )
        return parse_generate_response(body)

    async def abort(self, request_id: str) -> None:
        await self.http.post_quietly(f"{self.base_url}/abort_request", {"rid": request_id})

    async def health(self) -> bool:
        return await self.http.get_ok(f"{self.base_url}/health")

    async def close(self) -> None:
        await self.http.close()


def sglang_sampling(sampling: SamplingParams) -> dict[str, Any]:
    params: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "stop": list(sampling.stop),
        "stop_token_ids": list(sampling.stop_token_ids),
        "no_stop_trim": True,
    }
    if sampling.max_tokens is not None:
        params["max_new_tokens"] = sampling.max_tokens
    if sampling.seed is not None:
        params["sampling_seed"] = sampling.seed
    return params


def parse_generate_response(body: Any) -> GenerationResult:
    """Output ids and logprobs from a ``/generate`` answer; ``EngineError`` if malformed."""
    try:
        meta = body["meta_info"]
        pairs = meta["output_token_logprobs"]
        ids = [int(p[1]) for p in pairs]
        logprobs = [float(p[0]) for p in pairs]
        reason = _FINISH[meta["finish_reason"]["type"]]
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise EngineError(f"malformed SGLang /generate answer: missing or bad {exc!r}") from exc
    if "output_ids" in body and list(body["output_ids"]) != ids:
        raise EngineError("SGLang answer: output_ids and output_token_logprobs disagree")
    return GenerationResult(ids, logprobs, reason)
