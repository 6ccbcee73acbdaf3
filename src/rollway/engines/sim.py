"""The simulated engine: a load generator for benchmarks and for tests of gateway mechanics.

It is not a model. It returns deterministic token ids drawn from a seed (the request's seed,
else a hash of the prompt), well-formed negative logprobs, and waits a configurable latency.
It follows the weight-sync seam (``WeightSync``) so that pause, update and resume can be load-
and fault-tested: an "update" only moves the version its tokens are stamped with. It streams
(``StreamingEngine``) paced like a server: ``latency_s`` before the first token, then
``per_token_s`` per token.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from rollway.engines.base import PauseMode, WeightSource
from rollway.errors import ConfigError, InvalidFieldsError
from rollway.generation import FinishReason, GenerationChunk, GenerationResult, SamplingParams


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Latency is ``latency_s + per_token_s * output_len``; ids come from ``token_range``."""

    latency_s: float = 0.0
    per_token_s: float = 0.0
    output_len: int = 16
    token_range: tuple[int, int] = (1000, 9000)
    eos_token_id: int | None = 2


@dataclass(eq=False)
class _Running:
    """A generation in its latency wait: ``wake`` ends the wait early (abort)."""

    delay: float
    started: float = field(default_factory=time.monotonic)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Under a ``keep`` pause: the version and the share of the wait done when it froze.
    frozen_at: tuple[int, float] | None = None


class SimEngine:
    """Simulated engine: deterministic ids, zero or configurable latency, abortable, and
    pausable and versioned like a real engine (``pause_modes``)."""

    # Declared for the gateway (engines.base.ModelInfo): None, it does not know.
    model_name: str | None = None
    tokenizer: Any = None
    context_length: int | None = None

    pause_modes: frozenset[PauseMode] = frozenset({"abort", "drain", "keep"})

    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.policy_version = 0
        #: Weight sources it was given, in order (what a test asserts on).
        self.updates: list[tuple[WeightSource, int]] = []
        self._running: dict[str, _Running] = {}
        #: Requests waiting for ``resume``: an abort must reach them too.
        self._queued: dict[str, asyncio.Event] = {}
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._idle = asyncio.Event()
        self._idle.set()

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        if not input_ids:
            raise InvalidFieldsError("input_ids is empty", param="input_ids")
        if await self._aborted_while_paused(request_id):
            return GenerationResult([], [], "abort", [])
        ids, logprobs, reason = self._sample(input_ids, sampling)
        delay = self.config.latency_s + self.config.per_token_s * len(ids)
        running = self._running[request_id] = _Running(delay)
        self._idle.clear()
        try:
            aborted = await self._wait(running)
        finally:
            self._finished(request_id)
        if aborted:
            return GenerationResult([], [], "abort", [])
        # Paused with ``keep``: it goes on under the new weights, unless aborted meanwhile.
        if running.frozen_at is not None and await self._aborted_while_paused(request_id):
            return GenerationResult([], [], "abort", [])
        return GenerationResult(ids, logprobs, reason, self._versions(running, len(ids)))

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncGenerator[GenerationChunk, None]:
        """``generate``'s tokens one chunk each, the first after ``latency_s + per_token_s``,
        each next ``per_token_s`` later; each stamped with the version sampling it."""
        if not input_ids:
            raise InvalidFieldsError("input_ids is empty", param="input_ids")
        if await self._aborted_while_paused(request_id):
            yield GenerationChunk([], [], "abort", [])
            return
        ids, logprobs, reason = self._sample(input_ids, sampling)
        cfg = self.config
        running = self._running[request_id] = _Running(cfg.latency_s + cfg.per_token_s)
        self._idle.clear()
        try:
            for index in range(max(len(ids), 1)):
                # An abort (or a pause in abort mode) ends the wait; under a ``keep`` pause the
                # next token waits for ``resume``.
                if await self._wait(running) or (
                    running.frozen_at is not None and await self._aborted_while_paused(request_id)
                ):
                    yield GenerationChunk([], [], "abort", [])
                    return
                running.frozen_at, running.started = None, time.monotonic()
                running.delay = cfg.per_token_s
                last = index >= len(ids) - 1
                piece = slice(index, index + 1)
                yield GenerationChunk(
                    ids[piece],
                    logprobs[piece],
                    reason if last else None,
                    [self.policy_version] * len(ids[piece]),
                )
        finally:
            self._finished(request_id)

    async def abort(self, request_id: str) -> None:
        running = self._running.get(request_id)
        if running is not None:
            running.wake.set()
        queued = self._queued.get(request_id)
        if queued is not None:
            queued.set()

    async def pause(self, mode: PauseMode = "abort") -> None:
        self._resumed.clear()
        if mode == "abort":
            for running in self._running.values():
                running.wake.set()
        elif mode == "keep":
            now = time.monotonic()
            for running in self._running.values():
                done = (now - running.started) / running.delay if running.delay > 0 else 1.0
                running.frozen_at = (self.policy_version, min(done, 1.0))
        if mode != "keep":
            await self._idle.wait()

    async def resume(self) -> None:
        self._resumed.set()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        if version <= self.policy_version:
            raise ConfigError(
                f"weights version {version} does not follow {self.policy_version}", "version"
            )
        paused = not self._resumed.is_set()
        if not paused:
            await self.pause("drain")
        self.updates.append((source, version))
        self.policy_version = version
        if not paused:
            await self.resume()

    async def close(self) -> None:
        for running in self._running.values():
            running.wake.set()
        for queued in self._queued.values():
            queued.set()
        self._resumed.set()

    def _sample(
        self, input_ids: list[int], sampling: SamplingParams
    ) -> tuple[list[int], list[float], FinishReason]:
        cfg = self.config
        wanted = cfg.output_len if sampling.max_tokens is None else sampling.max_tokens
        length = min(cfg.output_len, wanted)
        reason: FinishReason = "stop" if cfg.output_len <= wanted else "length"
        rng = random.Random(sampling.seed if sampling.seed is not None else _digest(input_ids))
        low, high = cfg.token_range
        ids = [rng.randrange(low, high) for _ in range(length)]
        if reason == "stop" and cfg.eos_token_id is not None and ids:
            ids[-1] = cfg.eos_token_id
        logprobs = [-rng.random() * 4.0 for _ in ids]
        return ids, logprobs, reason

    def _finished(self, request_id: str) -> None:
        del self._running[request_id]
        if not self._running:
            self._idle.set()

    async def _aborted_while_paused(self, request_id: str) -> bool:
        """Wait for ``resume`` (if paused); True when aborted first."""
        if self._resumed.is_set():
            return False
        aborted = self._queued[request_id] = asyncio.Event()
        waits = [asyncio.ensure_future(aborted.wait()), asyncio.ensure_future(self._resumed.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            del self._queued[request_id]
        return aborted.is_set()

    async def _wait(self, running: _Running) -> bool:
        """Wait out the latency; True when aborted first."""
        if running.delay <= 0:
            return False
        try:
            await asyncio.wait_for(running.wake.wait(), timeout=running.delay)
        except TimeoutError:
            return False
        return True

    def _versions(self, running: _Running, length: int) -> list[int]:
        if running.frozen_at is None:
            return [self.policy_version] * length
        old, share = running.frozen_at
        before = int(length * share)
        return [old] * before + [self.policy_version] * (length - before)


def _digest(input_ids: list[int]) -> int:
    data = b"".join(i.to_bytes(4, "little", signed=True) for i in input_ids[-64:])
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
