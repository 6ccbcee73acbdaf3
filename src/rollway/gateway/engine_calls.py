"""Every engine call a turn makes: tracked as in flight (so a cancel can abort it), its
failures counted and remembered on the rollout, and its metrics recorded. A turn is sampled
whole (``sample``) or streamed (``sample_stream``)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import NoReturn

import anyio

from rollway import tracing
from rollway.engines.base import Engine
from rollway.engines.streaming import collect, stream_generation
from rollway.errors import EngineError, RequestError
from rollway.gateway.metrics import GatewayMetrics
from rollway.gateway.rollout_state import RolloutState
from rollway.gateway.weight_control import ProtectedTurns
from rollway.generation import GenerationChunk, GenerationResult, SamplingParams


@dataclass(frozen=True, slots=True)
class Sampled:
    """One turn's generation: the result, the time it took (re-issues included), the id of
    the request whose tokens count, and how many times the engine aborted it first."""

    result: GenerationResult
    latency: float
    request_id: str
    reissued: int


class EngineCalls:
    """``protected``: the weight control's count of turns an abort-mode pause must let finish;
    ``max_reissues`` still bounds aborts from elsewhere (a pause made on the server itself)."""

    def __init__(
        self, metrics: GatewayMetrics, max_reissues: int, protected: ProtectedTurns
    ) -> None:
        self.metrics = metrics
        self.max_reissues = max_reissues
        self.protected = protected

    @contextlib.asynccontextmanager
    async def track(self, state: RolloutState, request_id: str) -> AsyncIterator[None]:
        """Mark a request in flight and turn unexpected engine failures into
        ``EngineError``; the caller's bad input stays a ``RequestError``."""
        state.in_flight[request_id] = time.monotonic()
        try:
            yield
        except RequestError:
            raise
        except EngineError as exc:
            self.failed(state, exc)
            raise
        except Exception as exc:
            error = EngineError(f"engine failed: {exc!r}")
            self.failed(state, error)
            raise error from exc
        finally:
            state.in_flight.pop(request_id, None)

    def failed(self, state: RolloutState, error: EngineError) -> None:
        self.metrics.engine_errors.inc()
        state.engine_errors = [*state.engine_errors[-4:], str(error)]

    async def sample(
        self,
        engine: Engine,
        state: RolloutState,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
    ) -> Sampled:
        """Generate, sending the request again when the engine aborted it for someone else
        (a pause in abort mode for a weight update): the agent sees a slower turn."""
        sent_as, spent = request_id, 0.0
        for reissued in range(self.max_reissues + 1):
            with self.protected.hold(reissued):
                result, latency = await self._generate(engine, state, sent_as, prompt_ids, sampling)
            spent += latency
            versions = result.policy_versions
            if versions is not None and len(versions) != len(result.output_ids):
                error = EngineError(
                    f"the engine gave {len(versions)} policy versions for "
                    f"{len(result.output_ids)} tokens"
                )
                self.failed(state, error)
                raise error
            if result.finish_reason != "abort" or state.cancelled:
                return Sampled(result, spent, sent_as, reissued)
            # Not our cancel: the engine dropped it. It runs again once the engine resumes;
            # a new id, because an engine may still hold the old one.
            self.metrics.turns_reissued.inc()
            sent_as = f"{request_id}.{reissued + 1}"
        self._too_many_aborts(state, request_id)

    async def sample_stream(
        self,
        engine: Engine,
        state: RolloutState,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
    ) -> AsyncGenerator[GenerationChunk | Sampled, None]:
        """``sample``, streamed: the engine's chunks as they come, then the ``Sampled`` turn.

        When the engine aborts it for someone else (a pause in abort mode), the tokens it gave
        stay (a client may have been shown them): the generation goes on from the prompt plus
        those tokens, with what is left of ``max_tokens``, and the turn records them all, each
        with the version that sampled it. Closing the stream early aborts the request."""
        sent_as, spent, kept = request_id, 0.0, list[GenerationChunk]()
        for reissued in range(self.max_reissues + 1):
            so_far = [i for c in kept for i in c.output_ids]
            left = None if sampling.max_tokens is None else sampling.max_tokens - len(so_far)
            if left is not None and left <= 0:  # the abort came after the last token
                kept.append(GenerationChunk([], [], "length", None, kept[-1].logprob_kind))
                break
            started, aborted, given = time.perf_counter(), False, 0
            chunks = stream_generation(
                engine, prompt_ids + so_far, sampling.replace(max_tokens=left), sent_as
            )
            async with (
                self._streaming(engine, state, sent_as, reissued),
                contextlib.aclosing(chunks),
            ):
                async for chunk in chunks:
                    given += len(chunk.output_ids)
                    aborted = chunk.finish_reason == "abort" and not state.cancelled
                    if aborted:  # its tokens are kept; the generation goes on below
                        chunk = dataclasses.replace(chunk, finish_reason=None)
                    kept.append(chunk)
                    yield chunk
            latency = time.perf_counter() - started
            spent += latency
            self._observe(latency, len(prompt_ids) + len(so_far), given)
            if not aborted:
                break
            self.metrics.turns_reissued.inc()
            sent_as = f"{request_id}.{reissued + 1}"
        else:
            self._too_many_aborts(state, request_id)
        try:
            result = collect(kept)
        except EngineError as error:
            self.failed(state, error)
            raise
        yield Sampled(result, spent, sent_as, reissued)

    @contextlib.asynccontextmanager
    async def _streaming(
        self, engine: Engine, state: RolloutState, request_id: str, reissued: int
    ) -> AsyncIterator[None]:
        """``track`` (protected after ``reissued`` aborts), and an abort for a stream its reader
        left (a client that went away): shielded, since an HTTP server cancels the reader."""
        finished = False
        try:
            with self.protected.hold(reissued):
                async with self.track(state, request_id):
                    yield
            finished = True
        finally:
            if not finished:
                with anyio.CancelScope(shield=True):
                    await engine.abort(request_id)

    def _too_many_aborts(self, state: RolloutState, request_id: str) -> NoReturn:
        error = EngineError(
            f"the engine aborted turn {request_id} {self.max_reissues + 1} times; "
            "is something pausing it in abort mode over and over?"
        )
        self.failed(state, error)
        raise error

    async def _generate(
        self,
        engine: Engine,
        state: RolloutState,
        request_id: str,
        prompt_ids: list[int],
        sampling: SamplingParams,
    ) -> tuple[GenerationResult, float]:
        started = time.perf_counter()
        async with self.track(state, request_id):
            with tracing.span("rollway.engine.request", _request_attributes(engine, request_id)):
                result = await engine.generate(prompt_ids, sampling, request_id)
        latency = time.perf_counter() - started
        self._observe(latency, len(prompt_ids), len(result.output_ids))
        return result, latency

    def _observe(self, latency: float, prompt_tokens: int, completion_tokens: int) -> None:
        self.metrics.turn_latency.observe(latency)
        self.metrics.prompt_tokens.inc(prompt_tokens)
        self.metrics.completion_tokens.inc(completion_tokens)


def _request_attributes(engine: Engine, request_id: str) -> dict[str, str]:
    return {"rollway.request_id": request_id, "rollway.engine": type(engine).__name__}
