"""A rollout asking for degenerate sampling (``top_p: 1e-300``) gets an answer, and the
rollouts batched with it keep theirs: none of them fails or loses its turn."""

from __future__ import annotations

import asyncio

from rollway.engines.embedded import EmbeddedEngine
from rollway.gateway import Gateway


async def test_innocent_rollouts_batched_with_a_hostile_one_record_their_turns(
    gateway: Gateway, engine: EmbeddedEngine
) -> None:
    asks = [{"temperature": 1.0, "seed": 3}, {"top_p": 1e-300}, {"temperature": 1e-300}, {}]
    for index, ask in enumerate(asks):
        gateway.register(f"hostile-{index}", {"max_tokens": 4, **ask})
    before = engine.batches_run
    messages = [{"role": "user", "content": "Name a colour."}]
    answers = await asyncio.gather(
        *[gateway.chat(f"hostile-{i}", {"messages": messages}) for i in range(len(asks))]
    )
    # Queued in this order; in two batches at most, each hostile row shares one with others.
    assert engine.batches_run - before <= 2
    assert all(a.completion_tokens > 0 for a in answers)
    for index in range(len(asks)):
        assert len((await gateway.trajectory(f"hostile-{index}")).turns) == 1
    # Vanishing top_p and temperature both sample the top token.
    assert answers[1].completion_ids == answers[2].completion_ids
