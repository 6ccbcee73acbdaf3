"""A routed stream: the endpoint ``generate`` would choose (sticky, least-loaded), counted in
its load while it runs, its chunks passed through, aborted there when closed early."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from rollway.engines.base import StreamingEngine
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.remote.router import RoutedEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.engines.streaming import collect
from rollway.errors import EngineConnectError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.turn_stream import ContentDelta
from rollway.generation import ChatResult, GenerationChunk, GenerationResult, SamplingParams
from tests.engines.embedded.test_embedded import prompt

SAMPLING = SamplingParams(temperature=0, max_tokens=6)
#: No health check during a test: an ejected endpoint stays out.
HOURS = 3600.0


class _Refusing:
    """An endpoint whose server cannot be reached."""

    async def generate(self, input_ids, sampling, request_id) -> GenerationResult:
        raise EngineConnectError("connection refused")

    async def abort(self, request_id: str) -> None:
        pass

    async def close(self) -> None:
        pass


def endpoint_engine(engine: EmbeddedEngine) -> EmbeddedEngine:
    """An engine over the session's model, without a prefix cache (runs repeat exactly)."""
    return EmbeddedEngine(
        engine.model, engine.tokenizer, device=engine.device, prefix_cache_tokens=0
    )


@pytest.fixture
async def fleet(engine: EmbeddedEngine) -> AsyncIterator[RoutedEngine]:
    endpoints = [endpoint_engine(engine), endpoint_engine(engine)]
    router = RoutedEngine(endpoints, ["a", "b"], health_interval_s=HOURS)
    yield router
    await router.close()


def served(router: RoutedEngine) -> dict[str, int]:
    return {e.name: e.served for e in router.endpoints}


async def read(stream: AsyncIterator[GenerationChunk]) -> list[GenerationChunk]:
    return [chunk async for chunk in stream]


async def test_streams_go_where_generate_would_and_count_in_the_load(
    fleet: RoutedEngine,
) -> None:
    assert isinstance(fleet, StreamingEngine)
    a, b = fleet.endpoints
    ids = prompt(a.engine, "Write a very long essay about the sea.")
    first = fleet.generate_stream(ids, SAMPLING, "r1-0")
    head = [await anext(first)]
    assert (a.in_flight, b.in_flight) == (1, 0) and a.in_flight_tokens == len(ids)
    # A new rollout goes to the least-loaded endpoint.
    second = await read(fleet.generate_stream(ids, SAMPLING, "r2-0"))
    head += await read(first)
    assert (a.in_flight, b.in_flight) == (0, 0) and a.in_flight_tokens == 0
    assert served(fleet) == {"a": 1, "b": 1}
    assert len(head) > 1 and collect(head) == collect(second)
    # Both idle now: r2's next turn still goes to b, and streams what generate returns.
    again = await read(fleet.generate_stream(ids, SAMPLING, "r2-1"))
    assert served(fleet) == {"a": 1, "b": 2}
    assert collect(again) == await fleet.generate(ids, SAMPLING, "r2-2")
    assert served(fleet) == {"a": 1, "b": 3} and fleet.sticky_hits == 2


async def test_closing_or_aborting_a_routed_stream_aborts_it_on_its_endpoint(
    fleet: RoutedEngine,
) -> None:
    a = fleet.endpoints[0]
    engine = a.engine
    assert isinstance(engine, EmbeddedEngine)
    ids = prompt(engine, "Write a very long essay about the sea.")
    long = SamplingParams(max_tokens=400)
    stream = fleet.generate_stream(ids, long, "c1-0")
    await anext(stream)
    await stream.aclose()
    assert not engine._active and engine.aborted_total == 1
    assert a.in_flight == 0 and a.served == 0

    stream = fleet.generate_stream(ids, long, "c1-1")
    chunks = [await anext(stream)]
    await fleet.abort("c1-1")
    chunks += await read(stream)
    assert chunks[-1].finish_reason == "abort" and engine.aborted_total == 2
    assert 0 < len(collect(chunks).output_ids) < 400


async def test_a_stream_refused_before_its_first_chunk_goes_to_another_endpoint(
    engine: EmbeddedEngine,
) -> None:
    endpoints = [_Refusing(), endpoint_engine(engine)]
    router = RoutedEngine(endpoints, ["down", "up"], health_interval_s=HOURS)
    try:
        ids = prompt(engine, "Name a fruit.")
        chunks = await read(router.generate_stream(ids, SAMPLING, "f1-0"))
    finally:
        await router.close()
    assert collect(chunks).finish_reason in ("stop", "length")
    stats = router.stats()
    assert stats["endpoints"]["down"]["healthy"] is False
    assert stats["endpoints"]["down"]["refused"] == 1
    assert stats["endpoints"]["up"]["served"] == 1 and stats["moves"] == 1


class _Stopping:
    """A simulated server that stops answering after ``stop_after`` streamed tokens, as a
    process stopped with SIGSTOP does: no more tokens, and its health checks fail from then."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.engine = SimEngine(SimConfig(output_len=6))
        self.stop_after = stop_after
        self.stopped = False
        self.calls: list[tuple[list[int], SamplingParams, str]] = []
        self.given: list[GenerationChunk] = []

    async def generate(self, input_ids, sampling, request_id) -> GenerationResult:
        return collect([c async for c in self.generate_stream(input_ids, sampling, request_id)])

    async def generate_stream(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> AsyncIterator[GenerationChunk]:
        self.calls.append((input_ids, sampling, request_id))
        chunks = self.engine.generate_stream(input_ids, sampling, request_id)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                if len(self.given) == self.stop_after:
                    self.stopped = True
                    await asyncio.Event().wait()  # until the router gives up on it
                self.given.append(chunk)
                yield chunk

    async def health(self) -> bool:
        return not self.stopped

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def close(self) -> None:
        pass


async def test_a_stream_whose_server_stops_goes_on_elsewhere_from_the_tokens_it_gave(
    renderer: ChatRenderer,
) -> None:
    """Router defaults (ejected after 3 failed health checks), checks quickened. The tokens
    streamed before the server stopped were seen: the turn keeps them and another server
    samples the rest after them, so every recorded token was sampled in its exact context."""
    stopping, live = _Stopping(stop_after=2), _Stopping()
    router = RoutedEngine([stopping, live], ["stopping", "live"], health_interval_s=0.01)
    gateway = Gateway(router, renderer, model_name="sim")
    gateway.register("s", {"max_tokens": 6})
    request = {"messages": [{"role": "user", "content": "hi"}], "stream": True}

    async def turn() -> list[object]:
        return [piece async for piece in gateway.chat_stream("s", request)]

    try:
        pieces = await asyncio.wait_for(turn(), 10)
        trajectory = await gateway.trajectory("s")
    finally:
        await router.close()
    ((prompt, _, first_id),) = stopping.calls
    ((go_on_from, sampling, second_id),) = live.calls
    kept = collect([*stopping.given, GenerationChunk([], [], "abort")])
    rest = collect(live.given)
    assert (first_id, second_id) == ("s-1", "s-1.1") and len(kept.output_ids) == 2
    assert go_on_from == prompt + kept.output_ids and sampling.max_tokens == 4
    (recorded,) = trajectory.turns
    assert trajectory.prompt_ids(0) == prompt and recorded.reissued == 1
    assert recorded.completion_ids == kept.output_ids + rest.output_ids
    assert recorded.logprobs == kept.logprobs + rest.logprobs
    (sample,) = trajectory.samples
    assert sample.response_ids[: len(recorded.completion_ids)] == recorded.completion_ids
    assert set(sample.loss_mask[: len(recorded.completion_ids)]) == {1}
    result = pieces[-1]
    assert isinstance(result, ChatResult) and result.completion_ids == recorded.completion_ids
    streamed = "".join(p.text for p in pieces if isinstance(p, ContentDelta))
    assert streamed == result.message["content"]
    assert router.stats()["endpoints"]["stopping"]["healthy"] is False
