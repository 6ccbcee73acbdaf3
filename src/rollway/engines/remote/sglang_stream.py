"""Reading SGLang's ``/generate`` stream (``"stream": true``) into the new tokens of each event.

SGLang sends by default the whole output so far in every event (``output_ids`` and
``meta_info.output_token_logprobs``); with ``--incremental-streaming-output`` only the new
tokens. ``meta_info.completion_tokens`` counts all tokens so far in both modes, which tells them
apart: an event holding as many logprobs as that count is the whole output (on the first event
the two readings agree). Sources, sgl-project/sglang:
``managers/tokenizer_manager_components/output_processor.py`` ``handle_batch_output``
(cumulative unless incremental), ``managers/logprob_ops.py`` (``fill_meta_info`` gives the
accumulated logprobs, ``slice_streaming_output_meta_info`` cuts them for incremental streams),
``utils/weight_versions.py`` (``weight_versions`` spans always cover the whole output).

Errors met while streaming arrive inside the 200 stream (``entrypoints/http_server.py``
``generate_request``: a ``ValueError`` becomes ``{"error": {"message"}}``, then ``[DONE]``), and
a scheduler failure is a finish ``abort`` carrying a ``status_code`` (``tokenizer_manager.py``
``_handle_abort_finish_reason`` yields it to a stream where a plain call gets an HTTP error); a
user's abort has none. SGLang before 0.5.6 sends no logprobs with an abort.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from rollway.engines.remote.sglang_wire import top_logprobs_of
from rollway.errors import EngineError
from rollway.generation import FinishReason


@dataclass(frozen=True, slots=True)
class NewTokens:
    """What one event added: ``ids`` and ``logprobs`` from output position ``start``, the
    finish reason (None before the last event) and the event's ``meta_info``."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason | None
    start: int
    meta: dict[str, Any]
    top_ids: list[list[int]] | None = None
    top_logprobs: list[list[float]] | None = None


class SGLangStream:
    """The reader of one stream; ``seen`` counts the tokens it handed out."""

    def __init__(self, top: int = 0) -> None:
        self.top = top
        self.seen = 0

    def read(self, event: Any) -> NewTokens:
        if isinstance(event, dict) and "error" in event:
            raise EngineError(f"SGLang failed the request mid-stream: {event['error']}")
        try:
            meta = event["meta_info"]
            finish = meta.get("finish_reason")
            reason = None if finish is None else _finish_reason(finish["type"])
            pairs = meta.get("output_token_logprobs")
            if pairs is None and reason != "abort":
                raise KeyError("output_token_logprobs")
            new = self._new(pairs or [], meta.get("completion_tokens"), reason)
            ids = [int(p[1]) for p in new]
            logprobs = [float(p[0]) for p in new]
            tops = self._new_tops(meta, len(pairs or []), len(new)) if self.top else (None, None)
        except (KeyError, TypeError, IndexError, ValueError) as exc:
            raise EngineError(f"malformed SGLang stream event: missing or bad {exc!r}") from exc
        if reason == "abort" and finish.get("status_code") is not None:
            raise EngineError(
                f"SGLang ended the request mid-stream with an error (HTTP "
                f"{finish['status_code']}): {finish.get('message')}"
            )
        output_ids = event.get("output_ids")  # as whole or as new as the logprobs
        same_length = isinstance(output_ids, list) and len(output_ids) == len(pairs or [])
        if same_length and output_ids[len(output_ids) - len(ids) :] != ids:
            raise EngineError("SGLang stream: output_ids and output_token_logprobs disagree")
        start, self.seen = self.seen, self.seen + len(ids)
        return NewTokens(ids, logprobs, reason, start, meta, *tops)

    def _new_tops(
        self, meta: dict[str, Any], given: int, new: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The new tokens' top logprobs, cut from the event as its logprobs were."""
        steps = meta.get("output_top_logprobs") or []
        return top_logprobs_of(steps[given - new :] if new else [], new, self.top)

    def _new(self, pairs: list[Any], total: Any, reason: FinishReason | None) -> list[Any]:
        if not isinstance(total, int) or len(pairs) == total:  # the whole output so far
            return pairs[self.seen :]
        if self.seen + len(pairs) == total:  # incremental: only the new tokens
            return pairs
        if reason == "abort" and not pairs:
            return []
        raise EngineError(
            f"SGLang stream out of step: {len(pairs)} logprobs after {self.seen} tokens, "
            f"{total} in all"
        )


def _finish_reason(kind: Any) -> FinishReason:
    if kind not in get_args(FinishReason):
        raise ValueError(f"finish_reason type {kind!r}")
    return kind  # type: ignore[no-any-return]  # a get_args test does not narrow to the Literal
