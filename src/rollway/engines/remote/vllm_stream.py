"""Reading vLLM's streamed ``/v1/completions`` (``"stream": true``) into the new tokens of each
chunk. Source: vllm-project/vllm ``entrypoints/openai/completion/serving.py``
``completion_stream_generator``:

- one ``data: <CompletionStreamResponse>`` per engine step, then ``data: [DONE]``; each choice
  has only the new ``token_ids`` (with ``return_token_ids``) and their ``logprobs``
  (``token_logprobs``); ``prompt_token_ids`` rides on the first chunk only; the finish reason
  comes with the last tokens; with ``stream_options.include_usage`` a last chunk has no choices;
- ``weight_versions`` (0.33, with ``return_weight_versions``) only on the last chunk, as spans
  over the whole output (``docs/training/async_rl.md``: "collect the tokens before slicing");
- an abort's last chunk has no tokens, and before 0.33 one that sampled nothing is not sent at
  all ("Chunked prefill case, don't return empty chunks"): its stream is just ``[DONE]``;
- errors met while streaming are ``{"error": {"message", "type", "code"}}`` events in the 200
  answer (``_raise_if_error`` turns a finish ``error`` into one; the request reaches the engine
  only as the stream is read, so a paused server's refusal is one too), then ``[DONE]``; older
  releases sent ``{"object": "error", ...}`` bare.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollway.engines.remote.vllm_wire import top_logprobs_of
from rollway.errors import EngineError


@dataclass(frozen=True, slots=True)
class CompletionDelta:
    """What one chunk added: ``ids`` and ``logprobs`` from output position ``start``, vLLM's
    finish reason (None before the last chunk) and its ``weight_versions`` spans if given."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    spans: Any
    start: int
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


class CompletionStream:
    """The reader of one stream; ``seen`` counts the tokens it handed out. ``missing_ids`` is
    the error for a server that sends no ``token_ids``."""

    def __init__(self, missing_ids: str, top: int = 0) -> None:
        self.missing_ids = missing_ids
        self.top = top
        self.seen = 0

    def read(self, event: Any) -> CompletionDelta | None:
        """The chunk's new tokens; None for a chunk without choices (usage)."""
        error = _error_of(event)
        if error is not None:
            raise EngineError(
                f"vLLM failed the request mid-stream: HTTP {error.get('code')} "
                f"{error.get('type')}: {error.get('message')}"
            )
        try:
            choices = event.get("choices")
            if not choices:
                return None
            choice = choices[0]
            if choice.get("token_ids") is None:
                raise EngineError(self.missing_ids)
            ids = [int(t) for t in choice["token_ids"]]
            block = choice.get("logprobs")
            logprobs = [float(lp) for lp in block["token_logprobs"]] if ids or block else []
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise EngineError(f"malformed vLLM stream chunk: missing or bad {exc!r}") from exc
        if len(ids) != len(logprobs):
            raise EngineError("vLLM stream chunk: token_ids and token_logprobs differ in length")
        tops = top_logprobs_of(block, len(ids), self.top) if self.top and ids else ([], [])
        start, self.seen = self.seen, self.seen + len(ids)
        finish = choice.get("finish_reason")
        spans = choice.get("weight_versions")
        if not self.top:
            return CompletionDelta(ids, logprobs, finish, spans, start)
        return CompletionDelta(ids, logprobs, finish, spans, start, *tops)


def _error_of(event: Any) -> dict[str, Any] | None:
    if not isinstance(event, dict):
        return None
    error = event.get("error")
    if isinstance(error, dict):
        return error
    return event if event.get("object") == "error" else None
