"""A routed stream: the endpoint ``generate`` would choose (sticky, least-loaded), counted in
its load while it runs, its chunks passed through, aborted there when closed early."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rollway.engines.base import StreamingEngine
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.router import RoutedEngine
from rollway.engines.streaming import collect
from rollway.errors import EngineConnectError
from rollway.types import GenerationChunk, GenerationResult, SamplingParams
from tests.engines.test_embedded import prompt

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
