"""SGLang's wire: the rid it is sent under, what a probe learnt of the server, and how a
``/generate`` answer reads (ids, logprobs, finish, weight versions). Sources are named in
``rollway.engines.remote.sglang``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from rollway.engines.remote.connection import most_likely
from rollway.errors import EngineError
from rollway.generation import FinishReason, GenerationResult, LogprobKind

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


def wire_rid(request_id: str) -> str:
    """The rid SGLang gets: ended by a character ids never hold, so that no rid is a prefix of
    another (SGLang aborts by prefix)."""
    return f"{request_id}~"


@dataclass(frozen=True, slots=True)
class SGLangServer:
    """What ``probe`` learnt: the release (None when the server does not say) and the context
    length (None when unknown)."""

    version: tuple[int, ...] | None
    version_text: str
    context_length: int | None

    def older_than(self, needed: tuple[int, ...]) -> bool:
        return self.version is not None and self.version < needed


def parse_generate_response(
    body: Any,
    *,
    policy_version: int = 0,
    logprob_kind: LogprobKind = "raw_logprobs",
    top: int = 0,
) -> GenerationResult:
    """Output ids, logprobs, finish reason and versions from a ``/generate`` answer;
    ``EngineError`` if malformed. ``policy_version`` stamps tokens the server gives no number
    for. An ``abort`` without logprobs (older SGLang, aborted before its first token) is an
    empty ``abort`` result. ``top``: the top logprobs asked for (``top_logprobs_num``)."""
    try:
        meta = body["meta_info"]
        reason = _FINISH[meta["finish_reason"]["type"]]
        if reason == "abort":
            pairs = meta.get("output_token_logprobs") or []
        else:
            pairs = meta["output_token_logprobs"]
        ids = [int(p[1]) for p in pairs]
        logprobs = [float(p[0]) for p in pairs]
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise EngineError(f"malformed SGLang /generate answer: missing or bad {exc!r}") from exc
    if pairs and "output_ids" in body and list(body["output_ids"]) != ids:
        raise EngineError("SGLang answer: output_ids and output_token_logprobs disagree")
    versions = token_versions(meta, len(ids), policy_version)
    tops = top_logprobs_of(meta.get("output_top_logprobs"), len(ids), top) if top else (None, None)
    return GenerationResult(
        ids, logprobs, reason, versions, logprob_kind, top_ids=tops[0], top_logprobs=tops[1]
    )


def top_logprobs_of(steps: Any, tokens: int, top: int) -> tuple[list[list[int]], list[list[float]]]:
    """The ``top`` most likely ids and logprobs of each token from SGLang's
    ``output_top_logprobs`` (asked with ``top_logprobs_num``): per token, ``[logprob, id,
    text]`` triples, most likely first."""
    try:
        pairs = [[(float(t[0]), int(t[1])) for t in step] for step in steps]
    except (TypeError, IndexError, ValueError) as exc:
        raise EngineError(f"malformed SGLang output_top_logprobs: {exc!r}") from exc
    if len(pairs) != tokens:
        raise EngineError(f"SGLang gave top logprobs for {len(pairs)} of {tokens} tokens")
    return most_likely(pairs, top)


def token_versions(meta: dict[str, Any], length: int, fallback: int, start: int = 0) -> list[int]:
    """One version per output token from ``start`` (a stream's new tokens) to ``length``: from
    the ``weight_versions`` spans when they cover the output, else the one ``weight_version``,
    else ``fallback``."""
    spans = meta.get("weight_versions")
    if isinstance(spans, list) and spans:
        try:
            versions: list[int] = []
            covered = 0
            for span in spans:
                if int(span["start"]) != covered:
                    raise ValueError("spans leave a gap")
                label = version_number(span["version"], fallback)
                versions += [label] * max(min(int(span["end"]), length) - max(covered, start), 0)
                covered = int(span["end"])
            if covered == length:
                return versions
        except (KeyError, TypeError, ValueError):
            pass
    return [version_number(meta.get("weight_version"), fallback)] * (length - start)


def version_number(label: Any, fallback: int) -> int:
    if label == "default":  # SGLang's weight_version before any load with one
        return 0
    if isinstance(label, str) and label.strip().isdigit():
        return int(label)
    return fallback


def parse_version(text: str | None) -> tuple[int, ...] | None:
    numbers = re.findall(r"\d+", (text or "").split("+")[0].split("post")[0].split("rc")[0])
    return tuple(int(n) for n in numbers[:3]) if numbers else None
