"""Rollouts sent to a Ray worker in chunks: the rollouts dispatched to one worker within
``GATHER_S`` go in one Ray call (at most ``MAX_CHUNK``), whose results stream back as each
finishes. Ray's state per call (the task's spec, its references, gRPC buffers) dominated
the driver's memory per rollout in flight and its time to dispatch one; a chunk shares it.

A chunk whose worker is lost fails every rollout of it not yet back with ``CallLost``, which
the executor dispatches again; one that the worker raised for fails with an
``InfrastructureError``."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from rollway.errors import InfrastructureError
from rollway.executors.ray_workers import ray_cause
from rollway.results import RolloutRecord
from rollway.rollouts import RolloutConfig, RolloutSpec

#: Rollouts in one Ray call at most: a chunk's arguments stay some hundreds of KB.
MAX_CHUNK = 256
#: Rollouts settled in one pass of the loop at most: each wakes its whole chain of awaits,
#: and a worker's stream can bring back a chunk's worth at once.
SETTLE_SLICE = 16
#: How long a rollout waits for others to share its call: starts come from the caller's
#: thread a few at a time, so one pass of the loop would see only those.
GATHER_S = 0.02

_tokens = itertools.count()


class CallLost(Exception):
    """The worker running a rollout's chunk was lost (died, its node gone)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ChunkedCalls:
    """One worker's rollouts in flight, by token; ``errors``: Ray's ``ray.exceptions``."""

    def __init__(self, actor: Any, errors: Any) -> None:
        self._actor = actor
        self._errors = errors
        self._pending: list[tuple[int, RolloutSpec, RolloutConfig]] = []
        self._waiting: dict[int, asyncio.Future[RolloutRecord]] = {}
        self._flushing = False
        self._streams: set[asyncio.Task[None]] = set()
        #: Ray calls made: chunks sent.
        self.sent = 0

    def start(self, spec: RolloutSpec, settings: RolloutConfig) -> tuple[int, Any]:
        """Queue ``spec`` for the next chunk: its token (to cancel it on the worker) and the
        future of its record."""
        token = next(_tokens)
        result: asyncio.Future[RolloutRecord] = asyncio.get_running_loop().create_future()
        self._waiting[token] = result
        self._pending.append((token, spec, settings))
        if len(self._pending) >= MAX_CHUNK:
            self._flush()
        elif not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().call_later(GATHER_S, self._flush)
        return token, result

    def _flush(self) -> None:
        self._flushing = False
        chunk, self._pending = self._pending, []
        if not chunk:
            return
        self.sent += 1
        stream = self._actor.run_chunk.options(num_returns="streaming").remote(chunk)
        tokens = [token for token, _, _ in chunk]
        task = asyncio.ensure_future(self._drain(stream, tokens))
        self._streams.add(task)
        task.add_done_callback(self._streams.discard)

    async def _drain(self, stream: Any, tokens: list[int]) -> None:
        left = set(tokens)
        del tokens
        failure: BaseException | None = None
        try:
            async for ref in stream:
                for settled, (token, outcome) in enumerate(await ref, 1):
                    left.discard(token)
                    self._settle(token, outcome)
                    if settled % SETTLE_SLICE == 0:  # let what they woke run first
                        await asyncio.sleep(0)
        except self._errors.RayTaskError as exc:  # the worker's chunk raised: a bug
            failure = InfrastructureError(f"Ray worker failed: {ray_cause(exc)}")
        except self._errors.RayError as exc:
            failure = CallLost(ray_cause(exc))
        except asyncio.CancelledError:
            failure = InfrastructureError("the Ray executor closed")
            raise
        finally:
            for token in left:
                self._fail(token, failure or CallLost("the worker's chunk ended early"))

    def _settle(self, token: int, outcome: RolloutRecord | str) -> None:
        result = self._waiting.pop(token, None)
        if result is None or result.done():
            return
        if isinstance(outcome, str):
            result.set_exception(InfrastructureError(f"Ray worker failed: {outcome}"))
        else:
            result.set_result(outcome)

    def _fail(self, token: int, failure: BaseException) -> None:
        result = self._waiting.pop(token, None)
        if result is not None and not result.done():
            # Each its own exception: one raised in many places would collect their frames.
            error = (
                CallLost(failure.reason)
                if isinstance(failure, CallLost)
                else InfrastructureError(str(failure))
            )
            result.set_exception(error)
