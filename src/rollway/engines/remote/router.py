"""Several engine endpoints behind one engine: rollout-sticky, least-loaded, health-checked.

All turns of a rollout go to the endpoint that served its last turn while that endpoint is
healthy and not overloaded (its prefix cache holds the conversation). A new rollout goes to the
endpoint with the fewest in-flight requests, then tokens.

A request that could not be sent (no connection: ``EngineConnectError``) ejects its endpoint at
once and goes, with the same request id, to the least-loaded healthy endpoint it has not tried;
it fails only when none is left (``generate_stream`` does the same until its first chunk, and
streams the endpoint's answer). Endpoints should not retry connects themselves
(``RemoteClient(connect_attempts=1)``, as ``engine_from_spec`` builds them). A request that may
have reached its server (any other error) is never sent elsewhere. An endpoint is also ejected
after ``eject_after`` failed health checks in a row (a round every ``health_interval_s``, however
long the last one took: a hung server's checks wait out their timeout); an ejected one is
re-admitted after ``readmit_after`` good checks. Ejections and re-admissions are logged and
counted.

A request still running on an endpoint that its health checks eject (a hung or stopped server
answers nothing, and would hold the turn until the rollout's timeout) is cancelled there, which
aborts it on that server by its id, and ends with finish ``abort``, as when a pause in abort mode
drops it: the caller re-issues it under a new id (the gateway does, ``gateway.engine_calls``),
and the router sends that to a healthy endpoint. That is exact for the trajectory: a whole
answer that never came was seen by nobody, and a stream keeps the tokens it gave (the abort
chunk carries none) and goes on from them elsewhere. Other ejections leave running requests be:
a refused connect or a restart cuts their connections, which is their answer.

The rollout a request belongs to is read from its id: the gateway names requests
``<rollout_id>-<turn>`` (``.<n>`` after it when a turn is re-issued).

Weight sync (``WeightSync``) goes to every endpoint at once: ``pause``, ``update_weights`` and
``resume`` fan out, and the fleet's ``policy_version`` is the last update every healthy endpoint
took. An endpoint that fails to pause or load is ejected and stays out until it has loaded the
fleet's current weights: a re-admission first replays the last update on it, so no endpoint
ever serves stale weights next to fresh ones. A server that restarts between health checks
comes back with the weights it was started with: where its engine reports the version it
serves (SGLang's ``weight_version``), the next health check takes it out and replays the
update on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollway.engines.base import (
    Engine,
    HealthChecked,
    PauseMode,
    SharedWeights,
    WeightSource,
    WeightSync,
)
from rollway.engines.streaming import stream_generation
from rollway.errors import ConfigError, EngineConnectError, EngineError
from rollway.generation import GenerationChunk, GenerationResult, LogprobKind, SamplingParams

log = logging.getLogger(__name__)


def rollout_of(request_id: str) -> str:
    return request_id.rsplit("-", 1)[0]


class _CutOff(Exception):
    """The endpoint a request was waiting on failed its health checks meanwhile."""


@dataclass
class Endpoint:
    name: str
    engine: Engine
    healthy: bool = True
    failures: int = 0
    successes: int = 0
    in_flight: int = 0
    in_flight_tokens: int = 0
    served: int = 0
    refused: int = 0
    ejections: int = 0
    readmissions: int = 0
    #: Missed the fleet's last weight update: replay it before re-admission.
    stale: bool = False
    #: The waits of the requests running here, cut short when health checks eject it.
    waits: set[asyncio.Timeout] = field(default_factory=set)
    #: How many times that happened (a stream checks it between its chunks).
    cuts: int = 0

    @property
    def load(self) -> tuple[int, int]:
        return (self.in_flight, self.in_flight_tokens)


class RoutedEngine:
    # Declared for the gateway (engines.base.ModelInfo): None, it does not know.
    model_name: str | None = None
    tokenizer: Any = None
    context_length: int | None = None

    def __init__(
        self,
        engines: Sequence[Engine],
        names: Sequence[str] | None = None,
        *,
        health_interval_s: float = 5.0,
        eject_after: int = 3,
        readmit_after: int = 2,
        overload_margin: int = 64,
        affinity: Callable[[str], str] = rollout_of,
    ) -> None:
        if not engines:
            raise EngineError("a routed engine needs at least one endpoint")
        labels = names or [f"endpoint-{i}" for i in range(len(engines))]
        self.endpoints = [Endpoint(n, e) for n, e in zip(labels, engines, strict=True)]
        self.health_interval_s = health_interval_s
        self.eject_after, self.readmit_after = eject_after, readmit_after
        self.overload_margin = overload_margin
        self._affinity = affinity
        self._sticky: dict[str, Endpoint] = {}
        self._running: dict[str, Endpoint] = {}
        self._checker: asyncio.Task[None] | None = None
        self.sticky_hits = 0
        self.moves = 0
        self.policy_version = 0
        #: The last update the fleet took, replayed on an endpoint that missed it.
        self._last_update: tuple[WeightSource, int] | None = None
        self._paused: PauseMode | None = None

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        self._start_health_checks()
        rollout = self._affinity(request_id)
        endpoint = self._choose(rollout)
        tried: list[Endpoint] = []
        while True:
            try:
                with self._serving(endpoint, input_ids, request_id):
                    async with self._unless_cut_off(endpoint, endpoint.cuts):
                        return await endpoint.engine.generate(input_ids, sampling, request_id)
            except EngineConnectError as exc:
                endpoint = self._after_refusal(endpoint, rollout, request_id, tried, exc)
            except _CutOff:
                return GenerationResult([], [], "abort")

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncGenerator[GenerationChunk, None]:
        """``generate``'s endpoint, accounting and fail-over, its answer streamed
        (``engines.streaming.stream_generation``: an endpoint that cannot stream gives one
        chunk). Only a request refused before its first chunk goes to another endpoint; one
        whose endpoint health checks eject while it runs ends with an empty ``abort`` chunk."""
        self._start_health_checks()
        rollout = self._affinity(request_id)
        endpoint = self._choose(rollout)
        tried: list[Endpoint] = []
        while True:
            kind: LogprobKind | None = None  # of the chunks sent, once one is
            cuts = endpoint.cuts
            try:
                with self._serving(endpoint, input_ids, request_id):
                    stream = stream_generation(endpoint.engine, input_ids, sampling, request_id)
                    async with contextlib.aclosing(stream):
                        while (chunk := await self._next_chunk(endpoint, cuts, stream)) is not None:
                            kind = chunk.logprob_kind
                            yield chunk
                return
            except EngineConnectError as exc:
                if kind is not None:
                    raise
                endpoint = self._after_refusal(endpoint, rollout, request_id, tried, exc)
            except _CutOff:
                # The same kind as the tokens sent: the caller's record of the turn takes it.
                yield GenerationChunk([], [], "abort", None, kind or "raw_logprobs")
                return

    async def _next_chunk(
        self, endpoint: Endpoint, cuts: int, stream: AsyncIterator[GenerationChunk]
    ) -> GenerationChunk | None:
        """The stream's next chunk (None at its end) unless ``endpoint`` is cut off first.
        Watched one chunk at a time: the caller's work between chunks is not the engine's."""
        async with self._unless_cut_off(endpoint, cuts):
            return await anext(stream, None)

    @contextlib.asynccontextmanager
    async def _unless_cut_off(self, endpoint: Endpoint, cuts: int) -> AsyncIterator[None]:
        """Run the block unless health checks eject ``endpoint`` (or did, since it had
        ``cuts``): that cancels the block (a remote engine aborts a cancelled request on its
        server) and raises ``_CutOff``. A timeout that ``_cut_off`` sets to now: it tells its
        cancel from any other, as ``asyncio.timeout`` does."""
        if endpoint.cuts != cuts:
            raise _CutOff
        wait = asyncio.timeout(None)
        try:
            async with wait:
                endpoint.waits.add(wait)
                try:
                    yield
                finally:
                    endpoint.waits.discard(wait)
        except Exception as exc:
            # A TimeoutError, or what the engine made of its cancel.
            if wait.expired():
                raise _CutOff from exc
            raise

    @contextlib.contextmanager
    def _serving(self, endpoint: Endpoint, input_ids: list[int], request_id: str) -> Iterator[None]:
        """Count a request in ``endpoint``'s load while it runs there (``abort`` finds it)."""
        endpoint.in_flight += 1
        endpoint.in_flight_tokens += len(input_ids)
        self._running[request_id] = endpoint
        try:
            yield
        finally:
            endpoint.in_flight -= 1
            endpoint.in_flight_tokens -= len(input_ids)
            self._running.pop(request_id, None)
        endpoint.served += 1

    def _after_refusal(
        self,
        endpoint: Endpoint,
        rollout: str,
        request_id: str,
        tried: list[Endpoint],
        cause: EngineConnectError,
    ) -> Endpoint:
        """Nothing reached the server: eject it and pick where to send the same id next (it
        cannot run twice)."""
        self._eject(endpoint, cause)
        tried.append(endpoint)
        return self._fail_over(rollout, request_id, tried, cause)

    async def abort(self, request_id: str) -> None:
        endpoint = self._running.get(request_id)
        if endpoint is not None:
            await endpoint.engine.abort(request_id)

    async def close(self) -> None:
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        for endpoint in self.endpoints:
            await endpoint.engine.close()

    @property
    def pause_modes(self) -> frozenset[PauseMode]:
        """What every endpoint supports (none, when one has no weight sync)."""
        modes: frozenset[PauseMode] = frozenset({"abort", "drain", "keep"})
        for endpoint in self.endpoints:
            engine = endpoint.engine
            modes &= engine.pause_modes if isinstance(engine, WeightSync) else frozenset()
        return modes

    async def pause(self, mode: PauseMode = "abort") -> None:
        self._paused = mode
        await self._fan_out("pause", lambda engine: engine.pause(mode))

    async def resume(self) -> None:
        self._paused = None
        await self._fan_out("resume", lambda engine: engine.resume(), eject=False)

    async def update_weights(self, source: WeightSource, version: int) -> None:
        self._check_follows(version)
        paused = self._paused is not None
        if not paused:
            await self.pause("drain")
        try:
            await self._fan_out("load", lambda engine: engine.update_weights(source, version))
        finally:
            if not paused:
                await self.resume()
        self._last_update = (source, version)
        self.policy_version = version

    async def adopt_weights(self, source: WeightSource, version: int) -> None:
        """Another client of these servers (a sibling gateway worker) loaded ``source`` as
        ``version`` on each healthy one: they take the version; one out loads it on return."""
        self._check_follows(version)
        for endpoint in self.endpoints:
            if not isinstance(endpoint.engine, SharedWeights):
                raise ConfigError(f"engine endpoint {endpoint.name} loads its own weights")
            if endpoint.healthy:
                await endpoint.engine.adopt_weights(source, version)
            endpoint.stale = endpoint.stale or not endpoint.healthy
        self._last_update, self.policy_version = (source, version), version

    def _check_follows(self, version: int) -> None:
        if version <= self.policy_version:
            message = f"weights version {version} does not follow {self.policy_version}"
            raise ConfigError(message, "version")

    async def _fan_out(
        self, what: str, call: Callable[[WeightSync], Any], *, eject: bool = True
    ) -> None:
        """Run ``call`` on every healthy endpoint at once. One that fails is ejected and marked
        stale; when every one fails, the first error is raised (a bad source fails them all)."""
        targets = [e for e in self.endpoints if e.healthy]
        if not targets and what != "resume":
            raise EngineConnectError(f"cannot {what}: no healthy engine endpoint")
        engines: list[WeightSync] = []
        for endpoint in targets:
            if not isinstance(endpoint.engine, WeightSync):
                raise ConfigError(f"engine endpoint {endpoint.name} cannot take new weights")
            engines.append(endpoint.engine)
        results = await asyncio.gather(
            *[call(engine) for engine in engines], return_exceptions=True
        )
        failed = [(e, r) for e, r in zip(targets, results, strict=True) if isinstance(r, Exception)]
        if failed and len(failed) == len(targets):
            raise failed[0][1]
        for endpoint, error in failed:
            endpoint.stale = True
            if eject and endpoint.healthy:
                self._take_out(endpoint, f"{what} failed: {error}")
        for endpoint in self.endpoints:
            if not endpoint.healthy and what == "load":
                endpoint.stale = True

    def _take_out_stale(self) -> None:
        """An endpoint whose engine reports other weights than the fleet's (a server that
        restarted between health checks serves its start-up weights) goes out at once and
        catches up before it returns."""
        if self._last_update is None:
            return
        for endpoint in self.endpoints:
            engine = endpoint.engine
            if isinstance(engine, WeightSync) and engine.policy_version != self.policy_version:
                endpoint.stale = True
                # Only when it goes out: one already out counts its good checks towards the
                # catch-up, which alone can end the mismatch.
                if endpoint.healthy:
                    endpoint.successes = 0
                    self._take_out(
                        endpoint,
                        f"it serves weights version {engine.policy_version}, "
                        f"not the fleet's {self.policy_version}",
                    )

    async def _catch_up(self, endpoint: Endpoint) -> bool:
        """Bring a returning endpoint to the fleet's weights and pause state; False if it
        cannot (it stays out)."""
        engine = endpoint.engine
        try:
            if self._last_update is not None and isinstance(engine, WeightSync):
                source, version = self._last_update
                if engine.policy_version < version:
                    await engine.update_weights(source, version)
            if self._paused is not None and isinstance(engine, WeightSync):
                await engine.pause(self._paused)
        except Exception as exc:
            log.warning("engine endpoint %s cannot catch up: %r", endpoint.name, exc)
            return False
        endpoint.stale = False
        return True

    async def check_health(self) -> None:
        """One round of health checks on every endpoint (the loop calls this periodically)."""
        results = await asyncio.gather(*[_healthy(e.engine) for e in self.endpoints])
        self._take_out_stale()
        for endpoint, ok in zip(self.endpoints, results, strict=True):
            returning = ok and not endpoint.healthy
            if returning and endpoint.successes + 1 >= self.readmit_after and endpoint.stale:
                ok = await self._catch_up(endpoint)
            self._record_check(endpoint, ok)

    async def health(self) -> bool:
        """Whether the fleet serves: some endpoint is in rotation. Rollouts wait while none is
        (``rollouts.availability``); the router's own checks bring endpoints back."""
        self._start_health_checks()
        return any(endpoint.healthy for endpoint in self.endpoints)

    def stats(self) -> dict[str, Any]:
        return {
            "sticky_hits": self.sticky_hits,
            "moves": self.moves,
            "endpoints": {
                e.name: {
                    "healthy": e.healthy,
                    "in_flight": e.in_flight,
                    "served": e.served,
                    "refused": e.refused,
                    "ejections": e.ejections,
                    "readmissions": e.readmissions,
                    "stale": e.stale,
                }
                for e in self.endpoints
            },
        }

    def _choose(self, rollout: str) -> Endpoint:
        healthy = [e for e in self.endpoints if e.healthy]
        if not healthy:
            names = ", ".join(e.name for e in self.endpoints)
            raise EngineConnectError(
                f"no healthy engine endpoint: {names} ejected (re-admitted after "
                f"{self.readmit_after} good health checks, one every {self.health_interval_s:g} s)"
            )
        least = min(healthy, key=lambda e: e.load)
        current = self._sticky.get(rollout)
        overloaded = current is not None and (
            current.in_flight >= least.in_flight + self.overload_margin
        )
        if current is not None and current.healthy and not overloaded:
            self.sticky_hits += 1
            return current
        if current is not None:
            self._move(rollout, current, least)
        self._sticky[rollout] = least
        return least

    def _fail_over(
        self, rollout: str, request_id: str, tried: list[Endpoint], cause: EngineConnectError
    ) -> Endpoint:
        """The endpoint to send a refused request to next; the rollout's turns follow it."""
        left = [e for e in self.endpoints if e.healthy and e not in tried]
        if not left:
            names = ", ".join(e.name for e in tried)
            ejected = [e.name for e in self.endpoints if e not in tried]
            also = f"; ejected before: {', '.join(ejected)}" if ejected else ""
            raise EngineConnectError(
                f"request {request_id} not sent: cannot connect to {names}{also} (last: {cause})"
            ) from cause
        target = min(left, key=lambda e: e.load)
        self._move(rollout, tried[-1], target)
        self._sticky[rollout] = target
        return target

    def _move(self, rollout: str, source: Endpoint, target: Endpoint) -> None:
        self.moves += 1
        log.info("rollout %s moved from %s to %s", rollout, source.name, target.name)

    def _eject(self, endpoint: Endpoint, reason: Exception) -> None:
        """A refused connect: the server is down or gone, so take it out now."""
        endpoint.refused += 1
        endpoint.successes = 0
        if endpoint.healthy:
            self._take_out(endpoint, str(reason))

    def _record_check(self, endpoint: Endpoint, ok: bool) -> None:
        if ok:
            endpoint.failures = 0
            endpoint.successes += 1
            if not endpoint.healthy and endpoint.successes >= self.readmit_after:
                endpoint.healthy = True
                endpoint.readmissions += 1
                log.warning("engine endpoint %s re-admitted", endpoint.name)
            return
        endpoint.successes = 0
        endpoint.failures += 1
        if endpoint.healthy and endpoint.failures >= self.eject_after:
            self._take_out(endpoint, f"{endpoint.failures} failed health checks")
            self._cut_off(endpoint)

    @staticmethod
    def _take_out(endpoint: Endpoint, why: str) -> None:
        endpoint.healthy = False
        endpoint.ejections += 1
        log.warning("engine endpoint %s ejected: %s", endpoint.name, why)

    @staticmethod
    def _cut_off(endpoint: Endpoint) -> None:
        """End the waits of the requests running on ``endpoint``: they are re-issued elsewhere
        rather than held until their rollout's timeout."""
        endpoint.cuts += 1
        waits, endpoint.waits = endpoint.waits, set()
        if waits:
            log.warning("aborting %d requests running on %s", len(waits), endpoint.name)
            now = asyncio.get_running_loop().time()
            for wait in waits:
                if not wait.expired():
                    wait.reschedule(now)

    def _start_health_checks(self) -> None:
        if self._checker is None or self._checker.done():
            self._checker = asyncio.create_task(self._check_forever())

    async def _check_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_round = loop.time() + self.health_interval_s
        while True:
            await asyncio.sleep(max(0.0, next_round - loop.time()))
            # A round every interval, counted from the start of the last: a hung endpoint's
            # checks take their whole timeout, which must not slow its ejection down.
            next_round = loop.time() + self.health_interval_s
            await self.check_health()


async def _healthy(engine: Engine) -> bool:
    if not isinstance(engine, HealthChecked):
        return True
    try:
        return bool(await engine.health())
    except Exception:
        return False
