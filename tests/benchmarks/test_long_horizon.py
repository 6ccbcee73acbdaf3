"""The short version of benchmarks/long_horizon.py: a record grows linearly with its turns (its
size set against its sample's ids stays flat from 5 to 40 turns, where format 1 grew with the
turns), and what the gateway holds for rollouts in flight: their ids and logprobs within 1.3x
the ids as int32 (each id held once), the whole within 0.7x the ids as Python lists."""

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


async def test_rollouts_in_flight_hold_each_id_once_in_int32() -> None:
    flight = await in_flight_growth(rollouts=8, turns=30, observation_tokens=540,
                                    answer_tokens=32)  # fmt: skip
    # Each id once, in the turn that added it, as int32; float64 logprobs and the arrays'
    # headers add the rest: 1.24x the contexts' ids as int32 (issue 40's goal 1.3x; 2.27x when
    # a sequence tip held the context a second time, 10x as lists). The whole gateway, the
    # conversations' text included, 0.51x the ids as lists (0.62x with the tip, 1.95x lists).
    assert 0 < flight.id_bytes <= 1.3 * 4 * flight.ids
    assert 0 < flight.held < 0.7 * flight.list_bytes
