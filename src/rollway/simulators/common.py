"""What every simulated server shares: fault injection, per-request counting, generation on
the simulated engine, the test routes (``/rollway/stats``, long polls) and the response helpers;
streamed generation (``StreamedGeneration``: tokens paced out as the simulated engine's per-token
latency makes them due, as server-sent events in an ``EventStreamResponse``); and what a server
with weight sync shares: a pause gate (``Simulator.pause``/``resume``: calls
made while paused wait, as in SGLang's tokenizer manager and vLLM's engine), weight loads that
move a version label (``Simulator.load_weights``), per-token version labels, server versions
(``ServerVersion``, for version-dependent behaviour) and a bearer-key check
(``RequireBearer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rollway.engines.base import PauseMode
from rollway.engines.sim import SimConfig, SimEngine
from rollway.generation import GenerationResult, SamplingParams

#: The last event of every SGLang and vLLM stream.
DONE_EVENT = b"data: [DONE]\n\n"

Fault = Literal["none", "drop", "5xx", "hang"]


@dataclass
class SimServerState:
    """What the server did, for tests: generations started per rid, aborts, what runs now."""

    generations: Counter[str] = field(default_factory=Counter)
    aborted: list[str] = field(default_factory=list)
    in_flight: set[str] = field(default_factory=set)
    faults_left: int = 0
    #: Set whenever a generation starts / while none runs (for tests that wait on either).
    started: asyncio.Event = field(default_factory=asyncio.Event)
    idle: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, order=True)
class ServerVersion:
    """A server's release, compared by its leading numbers (``0.5.4.post1`` is 0.5.4);
    ``latest`` is newer than any number."""

    parts: tuple[int, ...]
    text: str = field(compare=False, default="")

    @classmethod
    def parse(cls, text: str) -> ServerVersion:
        if text == "latest":
            return cls((1 << 30,), text)
        numbers = re.findall(r"\d+", text.split("+")[0].split("post")[0].split("rc")[0])
        if not numbers:
            raise ValueError(f"not a version: {text!r}")
        return cls(tuple(int(n) for n in numbers[:3]), text)

    @property
    def latest(self) -> bool:
        return self.text == "latest"

    def at_least(self, *parts: int) -> bool:
        return self.parts >= parts


class Simulator:
    """The shared part: fault choice, counting, generation, abort; and the weight-sync state
    (pause gate, version labels) that a server with pause and weight loads exposes."""

    def __init__(self, config: SimConfig, fault: Fault, fault_count: int) -> None:
        self.engine = SimEngine(config)
        self.hanging = SimEngine(SimConfig(latency_s=24 * 3600.0))
        self.fault = fault
        self.state = SimServerState(faults_left=fault_count if fault != "none" else 0)
        #: The pause mode in force (None: serving); ``resumed`` is set while serving.
        self.paused: PauseMode | None = None
        self.resumed = asyncio.Event()
        self.resumed.set()
        #: The label of each loaded weights version (the engine counts versions 0, 1, ...).
        self.labels: list[str] = ["default"]
        self.loads: list[str] = []

    def next_fault(self) -> Fault:
        if self.state.faults_left <= 0:
            return "none"
        self.state.faults_left -= 1
        return self.fault

    async def generate(
        self, rid: str, input_ids: list[int], sampling: SamplingParams, fault: Fault
    ) -> GenerationResult:
        state = self.state
        state.generations[rid] += 1
        state.in_flight.add(rid)
        state.started.set()
        state.idle.clear()
        try:
            chosen = self.hanging if fault == "hang" else self.engine
            return await chosen.generate(input_ids, sampling, rid)
        finally:
            state.in_flight.discard(rid)
            if not state.in_flight:
                state.idle.set()

    async def abort(self, rid: str) -> None:
        """Record an abort by ``rid`` and stop that generation (if it runs)."""
        self.state.aborted.append(rid)
        await self.stop(rid)

    async def stop(self, rid: str) -> None:
        """End the running generation ``rid`` (finish ``abort``), recording nothing."""
        await self.engine.abort(rid)
        await self.hanging.abort(rid)

    async def pause(self, mode: PauseMode) -> None:
        """Stop serving: new generations wait at the gate until ``resume``; ``abort`` ends
        those running (finish ``abort``) and returns when none runs, ``drain`` waits for them,
        ``keep`` freezes them until ``resume``."""
        self.paused = mode
        self.resumed.clear()
        if mode == "abort":
            for rid in sorted(self.state.in_flight):
                await self.hanging.abort(rid)
        await self.engine.pause(mode)

    async def resume(self) -> None:
        self.paused = None
        self.resumed.set()
        await self.engine.resume()

    async def load_weights(self, path: str, label: str | None) -> None:
        """Load weights from ``path`` (it must exist, as a server reads it from its own disk):
        the next version, labelled ``label`` (the current label when None). Not paused, it
        waits for running generations first; while paused it only loads."""
        if not await asyncio.to_thread(os.path.exists, path):
            raise FileNotFoundError(f"no such checkpoint: {path}")
        await self.engine.update_weights(path, len(self.labels))
        self.labels.append(self.labels[-1] if label is None else label)
        self.loads.append(path)

    @property
    def label(self) -> str:
        """The label of the weights sampling now."""
        return self.labels[self.engine.policy_version]

    def token_labels(self, result: GenerationResult) -> list[str]:
        """The label of the weights that sampled each output token."""
        versions = result.policy_versions or [self.engine.policy_version] * len(result.output_ids)
        return [self.labels[v] for v in versions]

    def respond(self, payload: dict[str, Any], fault: Fault) -> Response:
        if fault == "5xx":
            return JSONResponse({"error": "simulated overload"}, status_code=503)
        body = orjson.dumps(payload)
        return Dropped(body) if fault == "drop" else Response(body, media_type="application/json")


def test_routes(sim: Simulator) -> list[Route]:
    """Routes for tests, on every simulated server: what ran, and long polls to wait on it."""

    async def stats(request: Request) -> Response:
        state = sim.state
        return JSONResponse(
            {
                "generations": dict(state.generations),
                "aborted": state.aborted,
                "in_flight": sorted(state.in_flight),
            }
        )

    async def wait_in_flight(request: Request) -> Response:
        """Answers once ``?count=`` generations (default 1) are running (or after 30 s)."""
        count = int(request.query_params.get("count", "1"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30.0):
                while len(sim.state.in_flight) < count:
                    sim.state.started.clear()
                    await sim.state.started.wait()
        return await stats(request)

    async def wait_idle(request: Request) -> Response:
        """Answers once no generation runs (or after 30 s)."""
        if sim.state.in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(sim.state.idle.wait(), 30.0)
        return await stats(request)

    return [
        Route("/rollway/stats", stats, methods=["GET"]),
        Route("/rollway/wait_in_flight", wait_in_flight, methods=["GET"]),
        Route("/rollway/wait_idle", wait_idle, methods=["GET"]),
    ]


async def generate_until_disconnect(
    request: Request,
    sim: Simulator,
    rid: str,
    prompt: list[int],
    sampling: SamplingParams,
    fault: Fault,
) -> GenerationResult:
    """Generate, aborting if the client disconnects first (as vLLM and hosted APIs do)."""
    generation = asyncio.create_task(sim.generate(rid, prompt, sampling, fault))
    watcher = asyncio.create_task(_abort_on_disconnect(request, sim, rid))
    try:
        return await generation
    finally:
        watcher.cancel()


async def _abort_on_disconnect(request: Request, sim: Simulator, rid: str) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    if rid in sim.state.in_flight:
        await sim.abort(rid)


def sampling_from(params: dict[str, Any], max_tokens: Any, seed: Any) -> SamplingParams:
    return SamplingParams(
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        top_k=max(int(params.get("top_k", -1)), 0),
        max_tokens=int(max_tokens) if max_tokens is not None else 128,
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        seed=seed,
    )


class RequireBearer:
    """ASGI middleware: HTTP requests without ``Authorization: Bearer <api_key>`` get 401
    ``{"error": "Unauthorized"}``, except under ``open_prefixes`` (health probes, test routes)
    and ``OPTIONS`` (the check SGLang's ``add_api_key_middleware`` makes)."""

    def __init__(self, app: ASGIApp, api_key: str, open_prefixes: tuple[str, ...]) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.open_prefixes = open_prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._open(scope):
            headers = dict(scope["headers"])
            if headers.get(b"authorization") != self.expected:
                response = JSONResponse({"error": "Unauthorized"}, status_code=401)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _open(self, scope: Scope) -> bool:
        path: str = scope["path"]
        return scope["method"] == "OPTIONS" or path.startswith(self.open_prefixes)


class Dropped(Response):
    """Promises more bytes than it sends, then ends: the client sees a cut connection."""

    def __init__(self, payload: bytes) -> None:
        super().__init__(payload, media_type="application/json")
        self._payload = payload

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self._payload) * 2).encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": self._payload[:10], "more_body": True})
        # Returning with the body unfinished makes the server close the connection.


def sse_event(payload: Any) -> bytes:
    """One server-sent event as both servers write it: ``data: <json>`` and a blank line."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def closing_events(*events: bytes) -> AsyncIterator[bytes]:
    """``events``, then ``[DONE]``: a stream that has no generation to follow."""
    for event in events:
        yield event
    yield DONE_EVENT


@dataclass(frozen=True)
class StreamStep:
    """One step of a streamed generation: the tokens sampled since the last step, the weights
    version of each, and on the last step the generation's result (its finish reason)."""

    ids: list[int]
    logprobs: list[float]
    versions: list[int]
    result: GenerationResult | None = None


class StreamedGeneration:
    """A generation as a server streams it. It runs on the simulated engine (abortable and
    pausable as ever); meanwhile its tokens (known ahead: the simulated engine is
    deterministic) come out every ``interval`` tokens as its per-token latency makes them due,
    none while generation is paused; the rest come when it ends. ``ids``, ``logprobs`` and
    ``versions`` hold everything streamed so far; ``task`` is the generation, which the server
    owns when the stream ends early."""

    def __init__(
        self, sim: Simulator, rid: str, prompt: list[int], sampling: SamplingParams, fault: Fault
    ) -> None:
        self.sim = sim
        self.rid, self.prompt, self.sampling, self.fault = rid, prompt, sampling, fault
        self.task = asyncio.ensure_future(sim.generate(rid, prompt, sampling, fault))
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []

    async def steps(self, interval: int = 1) -> AsyncIterator[StreamStep]:
        config = self.sim.engine.config
        if config.per_token_s > 0 and self.fault != "hang":
            async for step in self._paced(interval, config.latency_s, config.per_token_s):
                yield step
        await asyncio.wait({self.task})  # not ``await``: a closed stream must not cancel it
        result = self.task.result()
        rest = result.output_ids[len(self.ids) :] if result.finish_reason != "abort" else []
        versions = result.policy_versions or [self.sim.engine.policy_version] * len(
            result.output_ids
        )
        start = len(self.ids)
        for at in range(start, start + len(rest), interval):
            end = min(at + interval, start + len(rest))
            last = end == start + len(rest)
            yield self._step(
                result.output_ids, result.logprobs, versions, end, result if last else None
            )
        if not rest:
            yield self._step([], [], [], len(self.ids), result)

    async def _paced(
        self, interval: int, latency_s: float, per_token_s: float
    ) -> AsyncIterator[StreamStep]:
        loop = asyncio.get_running_loop()
        instant = SimEngine(replace(self.sim.engine.config, latency_s=0.0, per_token_s=0.0))
        ahead = await instant.generate(self.prompt, self.sampling, self.rid)
        start = loop.time() + latency_s
        # The last piece comes with the result, which carries the finish reason.
        while len(self.ids) + interval < len(ahead.output_ids):
            due = start + per_token_s * (len(self.ids) + interval)
            await asyncio.wait({self.task}, timeout=max(due - loop.time(), 0.0))
            if self.task.done():
                return
            if not self.sim.resumed.is_set():  # paused: frozen requests sample nothing
                resumed = asyncio.ensure_future(self.sim.resumed.wait())
                try:
                    await asyncio.wait({self.task, resumed}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    resumed.cancel()
                continue
            versions = [self.sim.engine.policy_version] * len(ahead.output_ids)
            yield self._step(ahead.output_ids, ahead.logprobs, versions, len(self.ids) + interval)

    def _step(
        self,
        ids: list[int],
        logprobs: list[float],
        versions: list[int],
        end: int,
        result: GenerationResult | None = None,
    ) -> StreamStep:
        start = len(self.ids)
        step = StreamStep(ids[start:end], logprobs[start:end], versions[start:end], result)
        self.ids += step.ids
        self.logprobs += step.logprobs
        self.versions += step.versions
        return step


class EventStreamResponse(StreamingResponse):
    """Server-sent events (``text/event-stream``). The client's disconnect cancels ``events``
    (whose cleanup does what the server does then); ``cut`` ends the connection after the
    events without finishing the body, as a server that died mid-stream does."""

    def __init__(self, events: AsyncIterator[bytes], *, cut: bool = False) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.cut = cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        await send(start)
        sending = asyncio.ensure_future(self._send_events(send))
        watching = asyncio.ensure_future(_until_disconnect(receive))
        try:
            await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sending, watching):
                task.cancel()
            await asyncio.gather(sending, watching, return_exceptions=True)
        if sending.cancelled():
            return
        sending.result()
        if not self.cut:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _send_events(self, send: Send) -> None:
        async for event in self.body_iterator:
            chunk = event if isinstance(event, bytes) else str(event).encode()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
