"""The scripted engine: answers a given list of completions, in order, whatever the prompt.

For deterministic agent tests (a user's as well as ours): a test writes what the model says
turn by turn, and drives a model family through the gateway with its real tokenizer and
template, exactly. Each completion is token ids, or text that the model's tokenizer encodes
(special tokens such as ``<|im_end|>`` written as text become their ids). Every token gets a
distinct logprob (``-0.001`` times its rank among all tokens this engine answered) unless the
script gives them, so a test can check that each logprob landed beside its own token.

From a file, ``scripted://FILE`` (``engines.factory``): a JSON list, or JSON lines, of
completions, each a string, a list of ids, or ``{"text" | "ids": ..., "logprobs": [...]}``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollway.errors import ConfigError, EngineError
from rollway.generation import GenerationChunk, GenerationResult, SamplingParams

#: One scripted completion: text, ids, or either with its logprobs.
Completion = str | Sequence[int] | dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Scripted:
    ids: list[int]
    logprobs: list[float] | None


class ScriptedEngine:
    """Answers ``completions`` in order; ``tokenizer`` (an HF tokenizer) encodes text ones and
    is the gateway's tokenizer too (``engines.base.ModelInfo``). Past the last completion a
    ``generate`` is an ``EngineError``. ``max_tokens`` cuts a completion (finish ``length``);
    otherwise it finishes ``stop``. ``prompts`` keeps each request's prompt ids, in order."""

    model_name: str | None = None  # the gateway names the model folder
    context_length: int | None = None

    def __init__(self, completions: Sequence[Completion], tokenizer: Any | None = None) -> None:
        self.tokenizer = tokenizer
        self._script = [self._read(item, at) for at, item in enumerate(completions)]
        self._next = 0
        self._answered_tokens = 0
        self.prompts: list[list[int]] = []

    @classmethod
    def from_file(cls, path: str | Path, tokenizer: Any | None = None) -> ScriptedEngine:
        """Completions from a JSON list or JSON lines file (see the module's docstring)."""
        file = Path(path).expanduser()
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the script {file}: {exc}", "engine") from None
        try:
            loaded = json.loads(text)
            items = loaded if isinstance(loaded, list) else [loaded]
        except ValueError:
            try:
                items = [json.loads(line) for line in text.splitlines() if line.strip()]
            except ValueError as exc:
                message = f"the script {file} is neither a JSON list nor JSON lines: {exc}"
                raise ConfigError(message, "engine") from None
        return cls(items, tokenizer)

    @property
    def remaining(self) -> int:
        """Completions not answered yet."""
        return len(self._script) - self._next

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        if self._next >= len(self._script):
            raise EngineError(
                f"the scripted engine has answered all its {len(self._script)} completions; "
                f"request {request_id!r} asks for one more: script another"
            )
        scripted = self._script[self._next]
        self._next += 1
        self.prompts.append(list(input_ids))
        ids, finish = scripted.ids, "stop"
        if sampling.max_tokens is not None and len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        if scripted.logprobs is not None:
            logprobs = scripted.logprobs[: len(ids)]
        else:
            first = self._answered_tokens + 1
            logprobs = [-0.001 * rank for rank in range(first, first + len(ids))]
        self._answered_tokens += len(ids)
        return GenerationResult(list(ids), logprobs, finish)  # type: ignore[arg-type]

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncGenerator[GenerationChunk, None]:
        """``generate`` one token a chunk, as a server streams."""
        result = await self.generate(input_ids, sampling, request_id)
        count = len(result.output_ids)
        for at, (token, logprob) in enumerate(zip(result.output_ids, result.logprobs, strict=True)):
            finish = result.finish_reason if at == count - 1 else None
            yield GenerationChunk([token], [logprob], finish)
        if not count:
            yield GenerationChunk([], [], result.finish_reason)

    async def abort(self, request_id: str) -> None:
        """Nothing runs in the background: a scripted answer is whole at once."""

    async def close(self) -> None:
        """Nothing to release."""

    def _read(self, item: Completion, at: int) -> _Scripted:
        where = f"scripted completion {at}"
        logprobs = None
        if isinstance(item, dict):
            logprobs = item.get("logprobs")
            if "text" not in item and "ids" not in item:
                raise ConfigError(f"{where} has neither 'text' nor 'ids'", "engine")
            item = item["text"] if "text" in item else item["ids"]
        if isinstance(item, str):
            if self.tokenizer is None:
                raise ConfigError(f"{where} is text: give the engine a tokenizer", "engine")
            ids = list(self.tokenizer.encode(item, add_special_tokens=False))
        elif all(isinstance(token, int) and not isinstance(token, bool) for token in item):
            ids = list(item)
        else:
            raise ConfigError(f"{where} is neither text nor a list of token ids", "engine")
        if logprobs is not None and (
            len(logprobs) != len(ids) or not all(isinstance(v, int | float) for v in logprobs)
        ):
            raise ConfigError(f"{where} needs one number in 'logprobs' per token", "engine")
        return _Scripted(ids, None if logprobs is None else [float(v) for v in logprobs])
