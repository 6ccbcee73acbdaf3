"""vLLM's wire: which release does what, what the engine learned of its server, the
``/v1/completions`` body and how its answer reads (ids, logprobs, finish, weight versions).
Sources are named in ``rollway.engines.remote.vllm``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, get_args

from rollway.engines.base import PauseMode
from rollway.engines.remote.connection import most_likely
from rollway.errors import ConfigError, EngineError
from rollway.generation import FinishReason, GenerationResult, LogprobKind, SamplingParams

#: First vLLM releases with what this engine relies on.
TOKEN_IDS_SINCE = (0, 10, 2)  # return_token_ids
WEIGHT_SYNC_SINCE = (0, 16, 0)  # /pause?mode=..., reload_weights(weights_path=...)
WEIGHT_INFO_SINCE = (0, 27, 0)  # /update_weight_version, /weight_info ("default" at start)
WEIGHT_LABELS_SINCE = (0, 33, 0)  # return_weight_versions; paused servers refuse new requests
#: rollway's pause modes as vLLM names them (vLLM's ``wait`` is rollway's ``drain``).
VLLM_PAUSE_MODES: dict[PauseMode, str] = {"abort": "abort", "drain": "wait", "keep": "keep"}
#: What vLLM answers a request that reaches it during an abort or wait pause (HTTP 503).
PAUSED_REFUSAL = "Generation is paused"
_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "repetition": "stop",  # vLLM >= 0.17 stops a repetitive pattern when asked to
}
_LOGIT_MODES = ("raw_logits", "processed_logits")
_ERROR_FINISH = (
    "vLLM ended the request with finish_reason 'error' (a request-level engine failure, such "
    "as a lost KV-cache transfer)"
)


def release_of(version: str | None) -> tuple[int, ...] | None:
    """``(0, 10, 1)`` for ``"0.10.1.1"`` or ``"0.10.1rc2.dev3+gabc"``; None when unparsable."""
    found = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return tuple(int(part or 0) for part in found.groups()) if found else None


def named(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


@dataclass(frozen=True, slots=True)
class VLLMServer:
    """What the engine learned of its server: ``GET /version`` and ``GET /v1/models`` (the
    served model's ``root``: the folder it was started on)."""

    version: str | None = None
    max_model_len: int | None = None
    root: str | None = None

    def since(self, release: tuple[int, ...]) -> bool:
        """True when the server is known to be ``release`` or newer."""
        known = release_of(self.version)
        return known is not None and known >= release

    def before(self, release: tuple[int, ...]) -> bool:
        """True when the server is known to be older than ``release``."""
        known = release_of(self.version)
        return known is not None and known < release


def logprob_kind_of(mode: str) -> LogprobKind:
    """The ``LogprobKind`` of a vLLM ``--logprobs-mode``; ``ConfigError`` for logit modes."""
    if mode in get_args(LogprobKind):
        return mode  # type: ignore[return-value]  # a get_args test does not narrow to the Literal
    if mode in _LOGIT_MODES:
        raise ConfigError(
            f"vLLM --logprobs-mode {mode} returns logits, not logprobs: run the server with "
            "raw_logprobs (vLLM's default) or processed_logprobs",
            "logprobs_mode",
        )
    raise ConfigError(
        f"unknown vLLM logprobs mode {mode!r}: expected raw_logprobs or processed_logprobs",
        "logprobs_mode",
    )


def vllm_payload(
    input_ids: list[int],
    sampling: SamplingParams,
    request_id: str,
    model: str | None,
    max_tokens: int,
) -> dict[str, Any]:
    """The ``/v1/completions`` body. ``seed`` goes only when asked: vLLM then samples from a
    generator of its own for this request, so the same request on the same server, vLLM
    version and hardware gives the same tokens if its batch does not change the logits (vLLM
    promises that only with batch invariance on); without a seed every call samples afresh."""
    payload: dict[str, Any] = {
        "prompt": input_ids,
        "request_id": request_id,
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "stop": list(sampling.stop),
        "stop_token_ids": list(sampling.stop_token_ids),
        # The sampled token's logprob always comes; N asks for the N most likely beside it,
        # keyed "token_id:<id>" with return_tokens_as_token_ids (else by text, ambiguous).
        "logprobs": sampling.top_logprobs,
        "return_tokens_as_token_ids": True,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
    }
    if model is not None:
        payload["model"] = model
    if sampling.seed is not None:
        payload["seed"] = sampling.seed
    return payload


def parse_completion(
    body: Any,
    *,
    server_version: str | None = None,
    logprob_kind: LogprobKind = "raw_logprobs",
    stamp: int | None = None,
    top: int = 0,
) -> GenerationResult:
    """Ids, logprobs, finish reason and weight versions of a ``/v1/completions`` answer: from
    the server's ``weight_versions`` spans when given, else ``stamp`` on every token; and the
    ``top`` most likely ids and logprobs of each token, where asked."""
    try:
        choice = body["choices"][0]
    except (KeyError, TypeError, IndexError) as exc:
        raise EngineError(f"malformed vLLM completion: missing or bad {exc!r}") from exc
    finish = choice.get("finish_reason")
    if finish == "error":
        raise EngineError(_ERROR_FINISH)
    if choice.get("token_ids") is None:
        raise EngineError(no_token_ids(server_version))
    try:
        ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(lp) for lp in choice["logprobs"]["token_logprobs"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(f"malformed vLLM completion: missing or bad {exc!r}") from exc
    if len(ids) != len(logprobs):
        raise EngineError("vLLM completion: token_ids and token_logprobs differ in length")
    tops = top_logprobs_of(choice["logprobs"], len(ids), top) if top else (None, None)
    versions: list[int] | None = None
    if choice.get("weight_versions") is not None:
        versions = versions_of(choice["weight_versions"], len(ids))
    elif stamp is not None:
        versions = [stamp] * len(ids)
    return GenerationResult(
        ids,
        logprobs,
        finish_of(finish),
        versions,
        logprob_kind,
        top_ids=tops[0],
        top_logprobs=tops[1],
    )


def top_logprobs_of(block: Any, tokens: int, top: int) -> tuple[list[list[int]], list[list[float]]]:
    """The ``top`` most likely ids and logprobs of each token from vLLM's ``top_logprobs``: one
    ``{"token_id:<id>": logprob}`` per token (``return_tokens_as_token_ids``), holding the top
    ones and the sampled token, which makes ``top + 1`` where it is not among them."""
    try:
        steps = [
            [(float(lp), _token_id(key)) for key, lp in step.items()]
            for step in block["top_logprobs"]
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EngineError(f"malformed vLLM top_logprobs: {exc!r}") from exc
    if len(steps) != tokens:
        raise EngineError(f"vLLM gave top_logprobs for {len(steps)} of {tokens} tokens")
    return most_likely(steps, top)


def _token_id(key: str) -> int:
    prefix, _, number = key.partition(":")
    if prefix != "token_id":
        raise ValueError(f"a top logprob keyed {key!r}, not token_id:<id>")
    return int(number)


def no_token_ids(server_version: str | None) -> str:
    return (
        f"vLLM answered without token_ids: return_token_ids needs vLLM >= "
        f"{named(TOKEN_IDS_SINCE)} (this server: {server_version or 'unknown version'})"
    )


def finish_of(finish: str) -> FinishReason:
    if finish == "error":
        raise EngineError(_ERROR_FINISH)
    if finish not in _FINISH:
        raise EngineError(f"vLLM completion: unknown finish_reason {finish!r}")
    return _FINISH[finish]


def versions_of(spans: Any, length: int) -> list[int]:
    """Per-token versions from vLLM's ``[{"version", "start", "end"}]`` label spans; the label
    is the version rollway set (``"default"``, before any update, is version 0)."""
    versions: list[int] = []
    try:
        for span in sorted(spans, key=lambda s: s["start"]):
            label = span["version"]
            if span["start"] != len(versions):
                raise ValueError("spans leave a gap")
            versions += [0 if label == "default" else int(label)] * (span["end"] - span["start"])
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineError(
            f"vLLM weight_versions {spans!r} are not rollway's versions: {exc!r}"
        ) from exc
    if len(versions) != length:
        raise EngineError(f"vLLM weight_versions {spans!r} do not cover {length} tokens")
    return versions


def max_model_len_of(models: Any, model: str | None) -> int | None:
    """``max_model_len`` of the served model's card in a ``/v1/models`` answer."""
    length = _card_field(models, model, "max_model_len")
    return length if isinstance(length, int) else None


def root_of(models: Any, model: str | None) -> str | None:
    """``root`` of the served model's card: the model folder the server was started on."""
    root = _card_field(models, model, "root")
    return root if isinstance(root, str) else None


def _card_field(models: Any, model: str | None, name: str) -> Any:
    cards = models.get("data") if isinstance(models, dict) else None
    for card in cards if isinstance(cards, list) else []:
        mine = isinstance(card, dict) and (model is None or card.get("id") == model)
        if mine and card.get(name) is not None:
            return card[name]
    return None


def pause_modes_of(server: VLLMServer) -> frozenset[PauseMode]:
    if server.before(WEIGHT_SYNC_SINCE):
        return frozenset()
    if server.since(WEIGHT_LABELS_SINCE):
        return frozenset({"abort", "drain", "keep"})
    return frozenset({"abort", "drain"})
