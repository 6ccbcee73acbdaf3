"""Every engine call a turn makes: tracked as in flight (so a cancel can abort it), its
failures counted and remembered on the rollout, and its metrics recorded."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from rollway import tracing
from rollway.engines.base import Engine
from rollway.errors import EngineError, RequestError
from rollway.gateway.metrics import GatewayMetrics
from rollway.gateway.rollout_state import RolloutState
from rollway.types import GenerationResult, SamplingParams


@dataclass(frozen=True, slots=True)
class Sampled:
    """One turn's generation: the result, the time it took (re-issues included), the id of
    the request whose tokens count, and how many times the engine aborted it first."""

    result: GenerationResult
    latency: float
    request_id: str
    reissued: int


class EngineCalls:
    def __init__(self, metrics: GatewayMetrics, max_reissues: int) -> None:
        self.metrics = metrics
        self.max_reissues = max_reissues

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
            result, latency = await self._generate(engine, state, sent_as, prompt_ids, sampling)
            spent += latency
            versions = result.policy_versions
            if versions is not None and len(versions) != len(result.output_ids):
                error = EngineError(f"the engine gave {len(versions)} policy versions for "
                                    f"{len(result.output_ids)} tokens")  # fmt: skip
                self.failed(state, error)
                raise error
            if result.finish_reason != "abort" or state.cancelled:
                return Sampled(result, spent, sent_as, reissued)
            # Not our cancel: the engine dropped it. It runs again once the engine resumes;
            # a new id, because an engine may still hold the old one.
            self.metrics.turns_reissued.inc()
            sent_as = f"{request_id}.{reissued + 1}"
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
        self.metrics.turn_latency.observe(latency)
        self.metrics.tokens.labels("prompt").inc(len(prompt_ids))
        self.metrics.tokens.labels("completion").inc(len(result.output_ids))
        return result, latency


def _request_attributes(engine: Engine, request_id: str) -> dict[str, str]:
    return {"rollway.request_id": request_id, "rollway.engine": type(engine).__name__}
