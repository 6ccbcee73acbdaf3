"""The gateway's two ways of reading a request's messages must agree on everything they record.

A body read off the wire (``ChatCompletionAsSent``) is checked only past the messages the
rollout's previous request sent; a request built in Python is checked whole. Random sessions of
requests (appending, editing, retyping tool-call arguments, writing a number as 1, 1.0 or true,
adding ignored keys, dropping, resending, sending bad messages) go to one gateway each way; the
answers, the errors and the recorded turns (prompt ids, completions, segments, prompt hashes)
must be identical.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import hypothesis.strategies as st
import orjson
from hypothesis import HealthCheck, given, settings

from rollway.errors import RollwayError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.request_messages import ChatCompletionAsSent
from rollway.trajectory_format import whole_prompts
from tests.conftest import ADD_TOOL, sim_gateway

TEXTS = st.sampled_from(["Go on.", "  spaced  ", "émoji ✓", "", "42", '{"a": 1}', "<b>x</b>"])
ARGUMENTS = st.sampled_from(['{"a": 1}', '{"a":1}', {"a": 1}, {"a": 1.0}, {"a": True}, "bad"])


def start() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
    return [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "Add."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
    ]


@st.composite
def actions(draw: st.DrawFn) -> list[tuple[str, Any]]:
    kinds = ["append", "edit", "retype", "renumber", "extra", "drop", "resend", "invalid"]
    steps = []
    for _ in range(draw(st.integers(3, 7))):
        kind = draw(st.sampled_from(kinds))
        steps.append((kind, (draw(st.integers(0, 50)), draw(TEXTS), draw(ARGUMENTS))))
    return steps


def apply(kind: str, args: Any, messages: list[dict[str, Any]], reply: dict | None) -> None:
    """Change ``messages`` in place as the action says (the last answer is ``reply``)."""
    at, text, arguments = args
    where = at % len(messages)
    if kind == "append" and reply is not None:
        messages += [reply, {"role": "user", "content": text}]
    elif kind == "edit":
        messages[where] = {**messages[where], "content": text}
    elif kind == "retype":
        calls = [i for i, m in enumerate(messages) if m.get("tool_calls")]
        if calls:
            index = calls[at % len(calls)]
            call = copy.deepcopy(messages[index]["tool_calls"][0])
            call["function"]["arguments"] = arguments
            messages[index] = {**messages[index], "tool_calls": [call]}
    elif kind == "renumber":  # 1 -> 1.0 -> true -> 1: equal in Python, not in the prompt
        following = {int: 1.0, float: True, bool: 1}
        for index, message in enumerate(messages):
            if message.get("tool_calls"):
                calls = copy.deepcopy(message["tool_calls"])
                for call in calls:
                    value = call["function"]["arguments"]
                    if isinstance(value, dict) and "a" in value:
                        value["a"] = following.get(type(value["a"]), value["a"])
                messages[index] = {**message, "tool_calls": calls}
    elif kind == "extra":
        messages[where] = {**messages[where], "refusal": None, "annotations": []}
    elif kind == "drop" and len(messages) > 1:
        del messages[-1]
    elif kind == "invalid":
        messages.insert(where, {"role": "wizard", "content": text})


async def send(gateway: Gateway, body: dict[str, Any], wire: bool) -> Any:
    try:
        if wire:  # as the HTTP handler reads it: fresh objects from the body's bytes
            request = ChatCompletionAsSent.model_validate(orjson.loads(orjson.dumps(body)))
            return (await gateway.chat("r", request)).message
        return (await gateway.chat("r", copy.deepcopy(body))).message
    except RollwayError as error:
        return ("error", type(error).__name__, error.message, error.param)


async def run(renderer: ChatRenderer, steps: list[tuple[str, Any]]) -> None:
    wire, whole = sim_gateway(renderer, output_len=6), sim_gateway(renderer, output_len=6)
    for gateway in (wire, whole):
        gateway.register("r", {"max_tokens": 6})
    messages, reply = start(), None
    for kind, args in [("resend", (0, "", "")), *steps]:
        apply(kind, args, messages, reply)
        body = {"messages": messages, "tools": [ADD_TOOL]}
        answers = [await send(wire, body, True), await send(whole, body, False)]
        assert answers[0] == answers[1], (kind, args)
        if isinstance(answers[0], dict):
            reply = answers[0]
        else:  # a bad message: take it out again, as an agent would
            messages = [m for m in messages if m["role"] != "wizard"]
    recorded = [await gateway.trajectory("r") for gateway in (wire, whole)]
    assert recorded[0].segment_count == recorded[1].segment_count
    pairs = zip(whole_prompts(recorded[0].turns), whole_prompts(recorded[1].turns), strict=True)
    for (ours, our_prompt), (theirs, their_prompt) in pairs:
        assert our_prompt == their_prompt
        assert ours.completion_ids == theirs.completion_ids
        assert (ours.segment, ours.prompt_hash) == (theirs.segment, theirs.prompt_hash)
    assert recorded[0].messages == recorded[1].messages


@settings(
    max_examples=60,
    deadline=None,  # a loaded machine is slow; the count bounds the run
    derandomize=True,  # the same sessions on every run
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=actions())
def test_wire_and_whole_checks_record_the_same_turns(
    renderer: ChatRenderer, steps: list[tuple[str, Any]]
) -> None:
    asyncio.run(run(renderer, steps))
