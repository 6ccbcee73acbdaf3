"""Rollout events: what a batch says as it runs, to listeners, callbacks and nobody."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import Callable
from typing import Any

from rollway.agents import AgentLoop, RolloutContext, execute_tool_calls, tool
from rollway.client import RolloutClient
from rollway.client.event_stream import EventListener
from rollway.events import (
    EventBus,
    EventsDropped,
    RewardScored,
    RolloutEvent,
    RolloutFinished,
    RolloutStarted,
    ToolCalled,
    TurnFinished,
    TurnStarted,
)
from rollway.results import AgentResult
from rollway.trajectory import Trajectory
from tests.outcomes import ENDED

MakeClient = Callable[..., RolloutClient]

ORDER = {"rollout_started": 0, "turn_started": 1, "turn_finished": 1, "reward": 2}


def test_a_batch_tells_each_rollout_in_order_and_turns_match_trajectories(
    make_client: MakeClient,
) -> None:
    heard: list[RolloutEvent] = []
    client = make_client(on_event=heard.append)
    tasks = [{"task_id": f"e{i}", "chats": i + 1, "reward": 0.25 * i} for i in range(3)]
    records = [item.result for item in client.run_batch(tasks, group_size=2)]
    assert len(records) == 6
    for record in records:
        mine = [e for e in heard if e.rollout_id == record.rollout_id]
        kinds = [e.kind for e in mine]
        assert kinds[0] == "rollout_started" and kinds[-2:] == ["reward", "rollout_finished"]
        assert [ORDER[k] for k in kinds[:-1]] == sorted(ORDER[k] for k in kinds[:-1])
        turns = [e for e in mine if isinstance(e, TurnFinished)]
        starts = [e for e in mine if isinstance(e, TurnStarted)]
        assert kinds[1:-2] == ["turn_started", "turn_finished"] * len(turns)
        assert record.trajectory is not None
        assert len(turns) == len(starts) == len(record.trajectory.turns) == record.task["chats"]
        assert [t.turn for t in turns] == list(range(len(turns)))
        recorded = record.trajectory.turns
        assert [t.completion_tokens for t in turns] == [len(t.completion_ids) for t in recorded]
        assert [t.prompt_tokens for t in turns] == [t.prompt_len for t in recorded]
        assert all(t.latency_s * 1000 >= r.latency_ms for t, r in zip(turns, recorded, strict=True))
        assert [t.finish_reason for t in turns] == [t.finish_reason for t in recorded]
        started = mine[0]
        assert isinstance(started, RolloutStarted)
        assert (started.task_key, started.group, started.attempt) == (
            record.rollout_key, record.group_id, 1,
        )  # fmt: skip
        reward, finished = mine[-2:]
        assert isinstance(reward, RewardScored) and reward.reward == record.reward
        assert isinstance(finished, RolloutFinished)
        assert (finished.status, finished.elapsed_s) == (record.status, record.elapsed_s)
    assert all(e.to_dict()["kind"] == e.kind for e in heard)


def test_the_finished_event_carries_the_reward_components(make_client: MakeClient) -> None:
    def checks(task: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
        return {"reward": 1.5, "format": 1.0, "correct": 0.5, "note": "kept, no component"}

    heard: list[RolloutEvent] = []
    (item,) = make_client(on_event=heard.append, reward=checks).run_batch([{"task_id": "c"}])
    finished = heard[-1]
    assert isinstance(finished, RolloutFinished) and finished.reward == 1.5
    assert finished.reward_components == {"format": 1.0, "correct": 0.5}
    assert finished.to_dict()["reward_components"] == item.result.reward_components


def test_a_retried_rollout_starts_twice_and_finishes_once(make_client: MakeClient) -> None:
    heard: list[RolloutEvent] = []
    client = make_client(on_event=heard.append)
    [item] = list(client.run_batch([{"task_id": "f", "end": "flaky"}]))
    started = [e for e in heard if isinstance(e, RolloutStarted)]
    assert [e.attempt for e in started] == [1, 2] == [1, item.result.attempts]
    assert started[1].rollout_id == item.result.rollout_id != started[0].rollout_id
    assert [e.kind for e in heard].count("rollout_finished") == 1
    assert heard[-1].kind == "rollout_finished"  # no reward: the task gives none


def test_several_listeners_each_hear_everything(make_client: MakeClient) -> None:
    client = make_client()

    async def listen_while_running() -> tuple[list[str], list[str]]:
        first, second = client.events(), client.events()
        items = [item async for item in client.run_batch_async([{"task_id": "a", "chats": 2}])]
        assert len(items) == 1
        first.close()
        second.close()
        return [e.kind async for e in first], [e.kind async for e in second]

    a, b = asyncio.run(listen_while_running())
    assert a == b and a.count("turn_finished") == 2 and a[-1] == "rollout_finished"


def test_a_slow_listener_loses_events_counted_and_never_blocks(make_client: MakeClient) -> None:
    heard: list[RolloutEvent] = []
    client = make_client(on_event=heard.append)
    slow = client.events(max_queued=3)
    tasks = [{"task_id": f"s{i}", "chats": 3} for i in range(4)]
    assert len(list(client.run_batch(tasks))) == 4  # nobody read: the batch still finished
    slow.close()

    async def read() -> list[RolloutEvent]:
        return [e async for e in slow]

    events = asyncio.run(read())
    # 4 rollouts x (start + 3 x 2 turn events + finish) = 32 events, the first 3 kept, then
    # the notice where the rest would have been.
    assert len(heard) == 32
    assert events[:3] == heard[:3]
    assert events[3:] == [EventsDropped(at=events[3].at, dropped=32 - 3)]


def test_a_drop_notice_comes_where_the_gap_is() -> None:
    bus = EventBus()
    listener = EventListener(bus, max_queued=2)
    sent = [TurnStarted(rollout_id="r", turn=turn) for turn in range(6)]
    bus(sent[0]), bus(sent[1]), bus(sent[2])  # the third finds the queue full

    async def read(count: int) -> list[RolloutEvent]:
        return [await anext(listener) for _ in range(count)]

    async def read_rest() -> list[RolloutEvent]:
        return [e async for e in listener]

    first = asyncio.run(read(1))  # room for one more
    bus(sent[3]), bus(sent[4]), bus(sent[5])  # 3 is queued, 4 and 5 dropped
    listener.close()
    rest = asyncio.run(read_rest())
    assert first == [sent[0]]
    kinds = [(e.kind, getattr(e, "turn", None), getattr(e, "dropped", None)) for e in rest]
    assert kinds == [
        ("turn_started", 1, None),
        ("dropped", None, 1),  # sent[2], lost between 1 and 3
        ("turn_started", 3, None),
        ("dropped", None, 2),  # sent[4] and sent[5]
    ]
    assert listener.queued == 0


def test_nobody_listening_queues_nothing_and_builds_no_events(make_client: MakeClient) -> None:
    client = make_client()
    listener = client.events()
    listener.close()  # subscribed once, gone now
    assert not client.gateway.gateway.events  # type: ignore[attr-defined]
    list(client.run_batch([{"task_id": "q", "chats": 2}]))
    assert listener.queued == 0


def test_a_listener_wakes_across_threads(make_client: MakeClient) -> None:
    client = make_client()

    async def first_event(listener: EventListener) -> RolloutEvent:
        return await asyncio.wait_for(anext(listener), 10)

    async def run() -> RolloutEvent:
        listener = client.events()
        waiting = asyncio.ensure_future(first_event(listener))
        await asyncio.sleep(0.05)  # the reader waits before anything happened
        client.invoke({"task_id": "x"})
        event = await waiting
        listener.close()
        return event

    assert asyncio.run(run()).kind == "rollout_started"


def test_a_bus_pickles_empty_and_a_failing_listener_is_skipped() -> None:
    bus, heard = EventBus(), []

    def broken(event: RolloutEvent) -> None:
        raise RuntimeError("listener bug")

    bus.subscribe(broken)
    bus.subscribe(heard.append)
    event = TurnStarted(rollout_id="r", turn=0)
    bus(event)
    assert heard == [event]
    assert not pickle.loads(pickle.dumps(bus))
    inner = EventBus()
    bus.unsubscribe(broken)
    bus.unsubscribe(heard.append)
    bus.subscribe(inner)
    assert not bus  # a bus whose only sink is an empty bus: nobody listens
    inner.subscribe(heard.append)
    assert bus


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class ToolUsingAgent(AgentLoop):
    name = "tool-using"
    tools = (add,)

    async def run(self, ctx: RolloutContext) -> AgentResult:
        reply = await ctx.chat([{"role": "user", "content": "add 2 and 3"}], max_tokens=4)
        call = {"id": "c1", "type": "function",
                "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}  # fmt: skip
        await execute_tool_calls({**reply.message, "tool_calls": [call]}, self.tools,
                                 ctx.record_tool_call)  # fmt: skip
        return ctx.complete([reply.message])


def test_an_agents_tool_calls_are_told(make_client: MakeClient) -> None:
    heard: list[RolloutEvent] = []
    record = make_client(agent=ToolUsingAgent, on_event=heard.append).invoke({}).result(60)
    assert record.status in ENDED, record.reason
    (called,) = [e for e in heard if isinstance(e, ToolCalled)]
    assert called.name == "add" and called.rollout_id == record.rollout_id
    assert record.metrics.tool_calls == 1
    assert called.latency_s * 1000 == record.metrics.tool_latency_ms
