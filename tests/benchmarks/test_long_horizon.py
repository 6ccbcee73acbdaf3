"""The short version of benchmarks/long_horizon.py: a record grows linearly with its turns (its
size set against its sample's ids stays flat from 5 to 40 turns, where format 1 grew with the
turns), and what the gateway holds for rollouts in flight: their ids and logprobs as arrays
within 2.7x the ids as int32, the whole within 1.3x the ids as Python lists."""

from __future__ import annotations

from benchmarks.long_horizon import in_flight_growth, measure


async def test_a_records_size_stays_flat_against_its_ids_as_turns_grow() -> None:
    short, long = await measure(5, 200, 16), await measure(40, 200, 16)
    assert long.context > 6 * short.context
    # Flat (format 1 grew 8x from 5 to 40 turns), and a few times its ids: how many bytes an id
    # takes in JSON moves with the ids sampled, so the bound is on each ratio, not their product.
    assert long.record_ratio < 1.15 * short.record_ratio
    assert short.record_ratio < 4 and long.record_ratio < 4
    assert long.token_ratio < 1.1 * short.token_ratio


async def test_rollouts_in_flight_hold_their_context_about_once() -> None:
    flight = await in_flight_growth(rollouts=8, turns=30, observation_tokens=200,
                                    answer_tokens=16)  # fmt: skip
    # Ids and logprobs as arrays: 2.5x the contexts' ids as int32 (the tip and the turns each
    # hold the context once; lists took 10x), the whole gateway 1.04x them as lists (was 1.95x).
    assert 0 < flight.id_bytes < 2.7 * 4 * flight.ids
    assert 0 < flight.held < 1.3 * flight.list_bytes
