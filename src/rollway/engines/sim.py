"""The simulated engine: a load generator for benchmarks and for tests of gateway mechanics.

It is not a model. It returns deterministic token ids drawn from a seed (the request's seed,
else a hash of the prompt), well-formed negative logprobs, and waits a configurable latency.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass

from rollway.errors import InvalidFieldsError
from rollway.types import FinishReason, GenerationResult, SamplingParams


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Latency is ``latency_s + per_token_s * output_len``; ids come from ``token_range``."""

    latency_s: float = 0.0
    per_token_s: float = 0.0
    output_len: int = 16
    token_range: tuple[int, int] = (1000, 9000)
    eos_token_id: int | None = 2


class SimEngine:
    """Simulated engine: deterministic ids, zero or configurable latency, abortable."""

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self._waiting: dict[str, asyncio.Event] = {}

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        if not input_ids:
            raise InvalidFieldsError("input_ids is empty", param="input_ids")
        cfg = self.config
        wanted = cfg.output_len if sampling.max_tokens is None else sampling.max_tokens
        length = min(cfg.output_len, wanted)
        reason: FinishReason = "stop" if cfg.output_len <= wanted else "length"
        delay = cfg.latency_s + cfg.per_token_s * length
        if delay > 0 and await self._aborted_while_waiting(request_id, delay):
            return GenerationResult([], [], "abort")
        rng = random.Random(sampling.seed if sampling.seed is not None else _digest(input_ids))
        low, high = cfg.token_range
        ids = [rng.randrange(low, high) for _ in range(length)]
        if reason == "stop" and cfg.eos_token_id is not None and ids:
            ids[-1] = cfg.eos_token_id
        logprobs = [-rng.random() * 4.0 for _ in ids]
        return GenerationResult(ids, logprobs, reason)

    async def abort(self, request_id: str) -> None:
        event = self._waiting.get(request_id)
        if event is not None:
            event.set()

    async def close(self) -> None:
        for event in self._waiting.values():
            event.set()

    async def _aborted_while_waiting(self, request_id: str, delay: float) -> bool:
        event = self._waiting[request_id] = asyncio.Event()
        try:
            await asyncio.wait_for(event.wait(), timeout=delay)
        except TimeoutError:
            return False
        finally:
            self._waiting.pop(request_id, None)
        return True


def _digest(input_ids: list[int]) -> int:
    data = b"".join(i.to_bytes(4, "little", signed=True) for i in input_ids[-64:])
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
