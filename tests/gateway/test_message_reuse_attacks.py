"""An outside tester's attacks on message reuse over HTTP (``gateway/request_messages.py``:
a chat body's messages are checked only past the rollout's previous request) and on prompt
hashes computed from the parent turn's sha256 state (``rollout_state.SequenceHashes``).

The oracle for every recorded turn (``check_turns``): its hash is the sha256 of its prompt;
a turn that starts a segment has exactly the prompt its request's messages render to; a turn
that extends its segment's previous turn starts with that turn's prompt + completion, and the
messages its parent's request sent render, as text, exactly as the same messages of its own
request do (else the prompt was built from stale messages)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import secrets
import uuid
from array import array
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest

from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import RollwayError
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.request_schema import ChatCompletionRequest
from rollway.trajectory import Trajectory
from rollway.trajectory_format import whole_prompts
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, sim_gateway

Body = dict[str, Any]


def sha256_prompt_hash(ids: list[int]) -> str:
    return hashlib.sha256(array("i", ids).tobytes()).hexdigest()[:16]


class FlakySim(SimEngine):
    """The simulated engine, failing the calls made while ``failing`` is set."""

    failing = False

    async def generate(self, input_ids, sampling, request_id):  # type: ignore[no-untyped-def,override]
        if self.failing:
            raise RuntimeError("engine fell over")
        return await super().generate(input_ids, sampling, request_id)


@contextmanager
def serving(gateway: Gateway) -> Iterator[tuple[httpx.Client, str]]:
    """The gateway served on loopback: a client of it and its admin key."""
    admin_key = f"ak-{secrets.token_hex(8)}"
    with (
        BackgroundServer(create_app(gateway, admin_key=admin_key)) as url,
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        yield client, admin_key


class Rollout:
    """One registered rollout over real loopback HTTP, remembering what each recorded turn's
    request sent (by the ``rollway.turn_index`` the answer names)."""

    def __init__(self, client: httpx.Client, admin_key: str, **register: Any) -> None:
        self.client, self.admin = client, {"Authorization": f"Bearer {admin_key}"}
        self.id = f"out-{uuid.uuid4().hex[:8]}"
        answer = client.post(f"/v1/rollouts/{self.id}/register", json=register, headers=self.admin)
        assert answer.status_code == 200, answer.text
        self.headers = {"Authorization": f"Bearer {answer.json()['api_key']}"}
        self.url = f"/v1/rollouts/{self.id}/chat/completions"
        self.sent: dict[int, Body] = {}

    def post(self, body: Body | bytes, headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        sent_headers = {**(headers or self.headers), "content-type": "application/json"}
        return self.client.post(self.url, content=content, headers=sent_headers)

    def reply(self, body: Body | bytes) -> dict[str, Any]:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        answer = self.post(_ids(raw))
        assert answer.status_code == 200, answer.text
        self.sent[answer.json()["rollway"]["turn_index"]] = orjson.loads(raw)
        return answer.json()["choices"][0]["message"]

    def trajectory(self, whole_prompts: bool = True) -> dict[str, Any]:
        """As served, with each turn's whole ``prompt_ids`` unless told otherwise."""
        answer = self.client.get(
            f"/v1/rollouts/{self.id}/trajectory",
            params={"whole_prompts": whole_prompts},
            headers=self.admin,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()


def served(trajectory: Trajectory) -> dict[str, Any]:
    """An in-process trajectory as the route serves it with each turn's whole ``prompt_ids``."""
    body = trajectory.model_dump()
    for turn, (_, prompt) in zip(body["turns"], whole_prompts(trajectory.turns), strict=True):
        turn["prompt_ids"] = prompt
    return body


def last_prompt(trajectory: Trajectory) -> list[int]:
    return trajectory.prompt_ids(len(trajectory.turns) - 1)


def _ids(raw: bytes) -> bytes:
    """A raw body (kept byte for byte: duplicate keys, escapes) that also asks for ids."""
    assert raw.endswith(b"}")
    return raw[:-1] + b', "return_token_ids": true}'


@pytest.fixture
def sim_http(renderer: ChatRenderer) -> Iterator[tuple[httpx.Client, str, Gateway]]:
    gateway = sim_gateway(renderer, output_len=8)
    with serving(gateway) as (client, admin_key):
        yield client, admin_key, gateway


def validated(body: Body) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools as the whole-request check reads them (the truth)."""
    request = ChatCompletionRequest.model_validate(copy.deepcopy(body))
    return request.message_dicts(), request.tool_dicts()


def check_turns(renderer: ChatRenderer, turns: list[dict[str, Any]], sent: dict[int, Body]):  # type: ignore[no-untyped-def]
    """The module docstring's oracle over every turn whose request is known."""
    last_in_segment: dict[int, dict[str, Any]] = {}
    for turn in turns:
        assert turn["prompt_hash"] == sha256_prompt_hash(turn["prompt_ids"]), turn["index"]
        parent = last_in_segment.get(turn["segment"])
        last_in_segment[turn["segment"]] = turn
        if turn["index"] not in sent:
            continue
        messages, tools = validated(sent[turn["index"]])
        if parent is None:
            # Rendered and tokenized here, not through the renderer's first-prompt cache.
            fresh = renderer.encode(renderer.render(messages, tools, add_generation_prompt=True))
            assert turn["prompt_ids"] == fresh, turn["index"]
            continue
        sequence = parent["prompt_ids"] + parent["completion_ids"]
        assert turn["prompt_ids"][: len(sequence)] == sequence, turn["index"]
        assert turn["new_prompt_ids"] == turn["prompt_ids"][len(sequence) :], turn["index"]
        if parent["index"] in sent:
            before, before_tools = validated(sent[parent["index"]])
            assert before_tools == tools, turn["index"]
            ours = renderer.render(messages[: len(before)], tools, add_generation_prompt=False)
            theirs = renderer.render(before, tools, add_generation_prompt=False)
            assert ours == theirs, f"turn {turn['index']} extends stale messages"


def call_message(arguments: Any, call_id: str = "c1") -> dict[str, Any]:
    function = {"name": "add", "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def history(arguments: Any) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "Add."},
        call_message(arguments),
        {"role": "tool", "tool_call_id": "c1", "content": "3"},
        {"role": "user", "content": "Again."},
    ]


# --- Claim 1: an edit to a tool call's arguments in an earlier message is rendered. ---------
#
# Message keys now canonicalize arguments with orjson: it writes NaN and +-Infinity as null,
# and reads integers past 64 bits as floats, so distinct arguments get one key. A request that
# edits an earlier call that way is taken as extending the previous turn, and its prompt keeps
# the old arguments. (Before, json.dumps(sort_keys=True) wrote NaN, Infinity and big integers
# as they are.)

COLLIDING = [
    pytest.param('{"a": 18446744073709551616}', '{"a": 18446744073709551617}', id="2**64"),
    pytest.param('{"a": -9223372036854775809}', '{"a": -9223372036854775810}', id="-2**63-1"),
    pytest.param('{"a": null}', '{"a": NaN}', id="null-NaN"),
    pytest.param('{"a": null}', '{"a": Infinity}', id="null-Infinity"),
    pytest.param('{"a": NaN}', '{"a": 1e400}', id="NaN-1e400"),
]


def rendered_arguments(arguments: str) -> str:
    """The arguments as the Hermes tool-call block writes them (``render_tool_calls``)."""
    return json.dumps({"name": "add", "arguments": json.loads(arguments)}, ensure_ascii=False)


@pytest.mark.parametrize(("before", "after"), COLLIDING)
def test_an_edited_earlier_call_argument_is_rendered_over_http(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer, before: str, after: str
) -> None:
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    first = {"messages": history(before), "tools": [ADD_TOOL]}
    reply = rollout.reply(first)
    edited = [*history(after), reply, {"role": "user", "content": "More."}]
    rollout.reply({"messages": edited, "tools": [ADD_TOOL]})
    prompt = renderer.decode(rollout.trajectory()["turns"][-1]["prompt_ids"])
    assert rendered_arguments(after) in prompt


@pytest.mark.parametrize(("before", "after"), COLLIDING[:3])
async def test_an_edited_earlier_call_argument_is_rendered_in_process(
    renderer: ChatRenderer, before: str, after: str
) -> None:
    gateway = sim_gateway(renderer, output_len=8)
    gateway.register("r", {})
    reply = (await gateway.chat("r", {"messages": history(before), "tools": [ADD_TOOL]})).message
    edited = [*history(after), reply, {"role": "user", "content": "More."}]
    await gateway.chat("r", {"messages": edited, "tools": [ADD_TOOL]})
    prompt = renderer.decode(last_prompt(await gateway.trajectory("r")))
    assert rendered_arguments(after) in prompt


async def test_object_arguments_infinity_edit_is_rendered_in_process(
    renderer: ChatRenderer,
) -> None:
    gateway = sim_gateway(renderer, output_len=8)
    gateway.register("r", {})
    first = {"messages": history({"a": None}), "tools": [ADD_TOOL]}
    reply = (await gateway.chat("r", first)).message
    edited = [*history({"a": float("inf")}), reply, {"role": "user", "content": "More."}]
    await gateway.chat("r", {"messages": edited, "tools": [ADD_TOOL]})
    prompt = renderer.decode(last_prompt(await gateway.trajectory("r")))
    assert '"arguments": {"a": Infinity}' in prompt


# Found on the way, older than the change (``ChatRenderer.prompt_ids`` caches first prompts
# under an orjson dump of the messages; message keys fall back to ``json.loads`` unguarded).


async def test_first_prompt_cache_tells_infinity_from_null_in_process(
    renderer: ChatRenderer,
) -> None:
    gateway = sim_gateway(renderer, output_len=8)
    for rollout, value in (("none", None), ("inf", float("inf"))):
        gateway.register(rollout, {})
        await gateway.chat(rollout, {"messages": history({"a": value}), "tools": [ADD_TOOL]})
    prompt = renderer.decode(last_prompt(await gateway.trajectory("inf")))
    assert '"arguments": {"a": Infinity}' in prompt


async def test_object_arguments_past_64_bits_in_process(renderer: ChatRenderer) -> None:
    gateway = sim_gateway(renderer, output_len=8)
    gateway.register("r", {})
    await gateway.chat("r", {"messages": history({"a": 2**70}), "tools": [ADD_TOOL]})
    prompt = renderer.decode(last_prompt(await gateway.trajectory("r")))
    assert str(2**70) in prompt


def test_deeply_nested_string_arguments_do_not_answer_500(
    sim_http: tuple[httpx.Client, str, Gateway],
) -> None:
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    deep = "[" * 1100 + "]" * 1100  # valid JSON; orjson refuses past 1024 levels
    answer = rollout.post({"messages": history(deep), "tools": [ADD_TOOL]})
    assert answer.status_code < 500, answer.text
    # And the rollout still answers afterwards.
    rollout.reply({"messages": history('{"a": 1}'), "tools": [ADD_TOOL]})


def test_an_echoed_big_integer_call_still_extends_the_turn(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer
) -> None:
    """The other side of the key: an echo written the same way must extend (one segment)."""
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    reply = rollout.reply({"messages": history('{"a": 18446744073709551617}'), "tools": [ADD_TOOL]})
    again = [*history('{"a":18446744073709551617}'), reply, {"role": "user", "content": "More."}]
    rollout.reply({"messages": again, "tools": [ADD_TOOL]})
    trajectory = rollout.trajectory()
    assert trajectory["segment_count"] == 1
    check_turns(renderer, trajectory["turns"], rollout.sent)


# --- Claim 1 and 5: wire reuse and the whole check record the same turns. -------------------


def scripted_bodies() -> list[tuple[str, Any]]:
    """Steps of one session: each (name, edit) where edit(messages, reply) returns the new
    messages list or raw body bytes (for duplicate keys and escapes)."""

    def append(messages: list, reply: dict) -> list:  # type: ignore[type-arg]
        return [*messages, reply, {"role": "user", "content": f"Go on {len(messages)}."}]

    def then(change):  # type: ignore[no-untyped-def]
        def step(messages: list, reply: dict) -> Any:  # type: ignore[type-arg]
            return change(append(messages, reply))

        return step

    def setting(index: int, **fields: Any):  # type: ignore[no-untyped-def]
        def change(messages: list) -> list:  # type: ignore[type-arg]
            edited = copy.deepcopy(messages)
            for key, value in fields.items():
                if value is ...:
                    edited[index].pop(key, None)
                else:
                    edited[index][key] = value
            return edited

        return change

    def raw(old: bytes, new: bytes):  # type: ignore[no-untyped-def]
        def change(messages: list) -> bytes:  # type: ignore[type-arg]
            body = orjson.dumps({"messages": messages, "tools": [ADD_TOOL]})
            assert old in body, old
            return body.replace(old, new, 1)

        return change

    def arguments(value: Any):  # type: ignore[no-untyped-def]
        return setting(2, tool_calls=call_message(value)["tool_calls"])

    return [
        ("append", append),
        ("content as text parts", then(setting(1, content=[{"type": "text", "text": "Add."}]))),
        ("content edited in parts", then(setting(1, content=[{"type": "text", "text": "Sum."}]))),
        ("extra ignored keys", then(setting(0, refusal=None, annotations=[], audio=None))),
        ("tool_call_id edited", then(setting(3, tool_call_id="c2"))),
        ("name added", then(setting(1, name="alice"))),
        ("system as developer", then(setting(0, role="developer"))),
        ("role edited", then(setting(4, role="system"))),
        ("object arguments 1", then(arguments({"a": 1}))),
        ("object arguments 1.0", then(arguments({"a": 1.0}))),
        ("object arguments true", then(arguments({"a": True}))),
        ("object arguments 1 again", then(arguments({"a": 1}))),
        ("object arguments nested 1.0", then(arguments({"a": [1.0, {"b": 1}]}))),
        ("object arguments nested true", then(arguments({"a": [True, {"b": 1}]}))),
        ("string arguments", then(arguments('{"a": 1}'))),
        ("string arguments 1.0", then(arguments('{"a": 1.0}'))),
        ("string arguments key order", then(arguments('{"b": 2, "a": 1.0}'))),
        ("string arguments dup key", then(arguments('{"a": 1.0, "a": 2}'))),
        ("null content", then(setting(2, content=None))),
        ("missing content", then(setting(2, content=...))),
        ("empty content", then(setting(2, content=""))),
        ("unicode escape", then(raw(b'"content":"Again."', b'"content":"\\u0041gain."'))),
        ("escape edits", then(raw(b'"content":"Again."', b'"content":"\\u0041gain!"'))),
        ("duplicate key", then(raw(b'"content":"3"', b'"content":"3","content":"7"'))),
        ("duplicate role", then(raw(b'"role":"tool",', b'"role":"user","role":"tool",'))),
        ("resend", lambda messages, reply: messages),
        ("fewer", lambda messages, reply: messages[:5]),
        ("append after fewer", append),
        ("emoji escape", then(raw(b'"content":"7"', b'"content":"\\ud83d\\ude00"'))),
        (
            "emoji escaped again",
            then(raw('"content":"😀"'.encode(), b'"content":"\\ud83d\\ude00"')),
        ),
    ]


async def test_wire_and_in_process_record_the_same_turns_for_edits_anywhere(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer
) -> None:
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    whole = sim_gateway(renderer, output_len=8)
    whole.register("r", {})
    messages, reply, bodies = history('{"a": 1}'), {}, []
    for name, edit in [("start", None), *scripted_bodies()]:
        edited = messages if edit is None else edit(messages, reply)
        raw = (
            edited
            if isinstance(edited, bytes)
            else orjson.dumps({"messages": edited, "tools": [ADD_TOOL]})
        )
        body = orjson.loads(raw)
        reply = rollout.reply(raw)
        theirs = (await whole.chat("r", copy.deepcopy(body))).message
        assert reply == theirs, name
        messages, bodies = body["messages"], [*bodies, name]
    ours, truth = rollout.trajectory(), served(await whole.trajectory("r"))
    assert ours["segment_count"] == truth["segment_count"]
    for mine, theirs, name in zip(ours["turns"], truth["turns"], bodies, strict=True):
        assert mine["prompt_ids"] == theirs["prompt_ids"], name
        assert (mine["segment"], mine["prompt_hash"]) == (theirs["segment"], theirs["prompt_hash"])
    check_turns(renderer, ours["turns"], rollout.sent)
    # The recorded conversation too, written out (1, 1.0 and true told apart).
    assert orjson.dumps(ours["messages"]) == orjson.dumps(truth["messages"])


# --- Claim 2: malformed messages named at their place, new or reused. -----------------------

BAD_MESSAGES = [
    pytest.param({"role": "wizard", "content": "x"}, id="role"),
    pytest.param({"role": "user", "content": 5}, id="content-number"),
    pytest.param({"role": "user", "content": [{"type": "image_url"}]}, id="content-part"),
    pytest.param({"role": "user", "content": [{"type": "text"}]}, id="part-without-text"),
    pytest.param("hello", id="string"),
    pytest.param(None, id="null"),
    pytest.param([], id="list"),
    pytest.param({"content": "no role"}, id="no-role"),
    pytest.param({"role": "tool", "content": "x", "tool_call_id": 7}, id="tool-call-id"),
    pytest.param(call_message([1, 2]), id="arguments-list"),
    pytest.param({"role": "assistant", "tool_calls": [{"function": {}}]}, id="call-no-name"),
    pytest.param({"role": "assistant", "tool_calls": {"a": 1}}, id="tool-calls-object"),
]


def whole_check_param(body: Body) -> str | None:
    """The field the whole-request check names for ``body`` (the behaviour before reuse)."""
    try:
        validated(body)
    except RollwayError as refused:  # past the schema: a content part that is not text
        return refused.param
    except Exception as error:  # pydantic's, named as parse_model names it
        from rollway.validation import parse_model

        try:
            parse_model(ChatCompletionRequest, body)
        except RollwayError as named:
            return named.param
        raise AssertionError("checks disagree") from error
    return None


@pytest.mark.parametrize("bad", BAD_MESSAGES)
@pytest.mark.parametrize("where", ["new", "reused", "echoed-reply"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_malformed_message_is_named_and_the_rollout_goes_on(
    sim_http: tuple[httpx.Client, str, Gateway],
    renderer: ChatRenderer,
    bad: Any,
    where: str,
    stream: bool,
) -> None:
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    messages = history('{"a": 1}')
    reply = rollout.reply({"messages": messages, "tools": [ADD_TOOL]})
    messages = [*messages, reply, {"role": "user", "content": "Next."}]
    reply = rollout.reply({"messages": messages, "tools": [ADD_TOOL]})
    # 8 messages sent before; the bad one goes past them, among them, or replaces the reply.
    at = {"new": 9, "reused": 3, "echoed-reply": 8}[where]
    wrong = [*messages, reply, {"role": "user", "content": "Then."}]
    if where == "new":
        wrong.insert(at, bad)
    else:
        wrong[at] = bad
    body = {"messages": wrong, "tools": [ADD_TOOL], "stream": stream}
    answer = rollout.post(body)
    expected = whole_check_param(body)
    # A content part is named as messages[i].content[j]: one that is not text is refused
    # (400), a text part without text is a 422, as the schema's errors are.
    part = expected is not None and expected.startswith(f"messages[{at}].content[0].")
    refused = part and expected is not None and expected.endswith(".type")
    assert answer.status_code == (400 if refused else 422), answer.text
    assert expected is not None and (part or expected.startswith(f"messages.{at}"))
    assert answer.json()["error"]["param"] == expected
    # The rollout goes on from the last good turn, extending it.
    rollout.reply({"messages": [*messages, reply, {"role": "user", "content": "Fine."}],
                   "tools": [ADD_TOOL]})  # fmt: skip
    trajectory = rollout.trajectory()
    assert trajectory["segment_count"] == 1 and len(trajectory["turns"]) == 3
    check_turns(renderer, trajectory["turns"], rollout.sent)


def test_messages_that_are_not_a_list_are_named(
    sim_http: tuple[httpx.Client, str, Gateway],
) -> None:
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    rollout.reply({"messages": [{"role": "user", "content": "hi"}]})
    for messages in ("hi", {"0": {"role": "user"}}, [], None, 5):
        answer = rollout.post({"messages": messages})
        assert answer.status_code == 422, (messages, answer.text)
        assert answer.json()["error"]["param"] == "messages", messages
    answer = rollout.post({"tools": []})
    assert answer.status_code == 422 and answer.json()["error"]["param"] == "messages"


# --- Claim 3 and 4: hashes and state after branches, retries, failures. --------------------


async def test_concurrent_branches_then_extending_each_branch(renderer: ChatRenderer) -> None:
    gateway = sim_gateway(renderer, output_len=8, latency_s=0.2)
    with serving(gateway) as (client, admin_key):
        rollout = Rollout(client, admin_key)
        start = [{"role": "user", "content": "Start."}]
        first = rollout.reply({"messages": start})
        branches = [[*start, first, {"role": "user", "content": f"Branch {i}."}] for i in range(4)]

        async def send(messages: list[dict[str, Any]]) -> dict[str, Any]:
            return await asyncio.to_thread(rollout.reply, {"messages": messages})

        replies = await asyncio.gather(*[send(b) for b in branches])
        # Each branch goes on twice, oldest first: the state last closed is another's.
        for branch, reply in zip(branches, replies, strict=True):
            follow = [*branch, reply, {"role": "user", "content": "On."}]
            again = rollout.reply({"messages": follow})
            rollout.reply({"messages": [*follow, again, {"role": "user", "content": "Up."}]})
        # Identical requests at once, then one that extends their conversation.
        last = [*start, first, {"role": "user", "content": "Same."}]
        same = await asyncio.gather(*[send(last) for _ in range(3)])
        rollout.reply({"messages": [*last, same[0], {"role": "user", "content": "End."}]})
        trajectory = rollout.trajectory()
    assert len(trajectory["turns"]) == 1 + 4 + 8 + 3 + 1
    check_turns(renderer, trajectory["turns"], rollout.sent)


def test_failed_requests_leave_the_rollout_extendable(renderer: ChatRenderer) -> None:
    """An engine error, a 401 and a 422 between turns: the next good request extends the last
    good turn and its prompt is right."""
    engine = FlakySim(SimConfig(output_len=8))
    gateway = Gateway(engine, renderer, model_name="sim")
    with serving(gateway) as (client, admin_key):
        rollout = Rollout(client, admin_key)
        messages = history('{"a": 1}')
        reply = rollout.reply({"messages": messages, "tools": [ADD_TOOL]})
        follow = [*messages, reply, {"role": "user", "content": "Next."}]
        engine.failing = True
        failed = rollout.post({"messages": follow, "tools": [ADD_TOOL]})
        assert failed.status_code >= 500, failed.text
        engine.failing = False
        stale = [*follow[:1], {"role": "user", "content": "Tampered."}, *follow[2:]]
        wrong_key = {"Authorization": "Bearer nope"}
        assert rollout.post({"messages": stale}, headers=wrong_key).status_code == 401
        assert rollout.post({"messages": [*follow, {"role": 1}]}).status_code == 422
        reply = rollout.reply({"messages": follow, "tools": [ADD_TOOL]})
        # A request sending fewer messages, then one extending that shorter conversation.
        short = [*messages[:2], {"role": "user", "content": "Short."}]
        short_reply = rollout.reply({"messages": short, "tools": [ADD_TOOL]})
        rollout.reply({"messages": [*short, short_reply, {"role": "user", "content": "X"}],
                       "tools": [ADD_TOOL]})  # fmt: skip
        # The earlier long conversation again, edited in a reused message.
        edited = copy.deepcopy([*follow, reply, {"role": "user", "content": "Y"}])
        edited[1]["content"] = "Add, please."
        rollout.reply({"messages": edited, "tools": [ADD_TOOL]})
        trajectory = rollout.trajectory()
    turns = trajectory["turns"]
    assert [t["segment"] for t in turns] == [0, 0, 1, 1, 2]
    check_turns(renderer, turns, rollout.sent)
    assert "Add, please." in renderer.decode(turns[-1]["prompt_ids"])


def test_hashes_hold_past_the_kept_hash_states_with_many_branches(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer
) -> None:
    """More branches than the gateway keeps hash states for (8), each extended later."""
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    start = [{"role": "user", "content": "Start."}]
    first = rollout.reply({"messages": start})
    conversations = []
    for i in range(10):
        branch = [*start, first, {"role": "user", "content": f"Branch {i}."}]
        conversations.append([*branch, rollout.reply({"messages": branch})])
    for i, conversation in enumerate(conversations):
        rollout.reply({"messages": [*conversation, {"role": "user", "content": f"More {i}."}]})
    check_turns(renderer, rollout.trajectory()["turns"], rollout.sent)


def test_hashes_hold_for_truncated_streamed_and_cancelled_turns(renderer: ChatRenderer) -> None:
    gateway = sim_gateway(renderer, output_len=30, latency_s=0.05)
    with serving(gateway) as (client, admin_key):
        # max_seq_len cuts the second turn's answer.
        rollout = Rollout(client, admin_key, max_seq_len=70)
        start = [{"role": "user", "content": "Start."}]
        reply = rollout.reply({"messages": start, "max_tokens": 10})
        cut = rollout.reply({"messages": [*start, reply, {"role": "user", "content": "Go"}]})
        assert cut is not None
        truncated = rollout.trajectory()
        assert truncated["turns"][-1]["finish_reason"] == "length"
        check_turns(renderer, truncated["turns"], rollout.sent)
        # Streamed turns that extend each other.
        streamed = Rollout(client, admin_key)
        messages = list(start)
        for step in range(3):
            body = {"messages": messages, "stream": True}
            with client.stream("POST", streamed.url, json=body, headers=streamed.headers) as answer:
                assert answer.status_code == 200
                text = "".join(
                    json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                    for line in answer.iter_lines()
                    if line.startswith("data: {") and '"choices":[{' in line
                )
            messages = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"S{step}"},
            ]
        turns = streamed.trajectory()["turns"]
        assert [t["segment"] for t in turns] == [0, 0, 0]
        check_turns(renderer, turns, {})
    # A cancel mid-generation records an aborted turn.
    slow = sim_gateway(renderer, output_len=8, latency_s=5.0)
    with serving(slow) as (client, admin_key):
        rollout = Rollout(client, admin_key)

        async def cancel_soon() -> httpx.Response:
            await asyncio.sleep(0.5)
            return await asyncio.to_thread(
                client.post, f"/v1/rollouts/{rollout.id}/cancel", headers=rollout.admin
            )

        async def both() -> tuple[httpx.Response, httpx.Response]:
            chat = asyncio.to_thread(rollout.post, {"messages": start})
            return await asyncio.gather(chat, cancel_soon())

        answer, cancelled = asyncio.run(both())
        assert cancelled.status_code == 200 and answer.status_code >= 400
        turns = rollout.trajectory()["turns"]
    assert [t["finish_reason"] for t in turns] == ["abort"]
    check_turns(renderer, turns, {})


# --- Claim 5: Messages and Responses routes record what the chat route would. ---------------


async def test_anthropic_route_records_what_in_process_chat_records(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer
) -> None:
    from rollway.gateway.http.messages_request import MessagesRequest

    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    whole = sim_gateway(renderer, output_len=8)
    whole.register("r", {})
    tool = {
        "name": "add",
        "description": "Add.",
        "input_schema": ADD_TOOL["function"]["parameters"],
    }
    use = {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "3"}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Add."},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    url = f"/v1/rollouts/{rollout.id}/messages"
    for step, edit in enumerate([None, 1.0, True, 1, "text", None]):
        if isinstance(edit, (int, float)):
            messages[1] = {"role": "assistant", "content": [{**use, "input": {"a": edit}}]}
        elif edit == "text":
            messages[0] = {"role": "user", "content": [{"type": "text", "text": "Add."}]}
        body = {"max_tokens": 8, "system": "Be brief.", "messages": messages, "tools": [tool]}
        answer = client.post(url, json=body, headers=rollout.headers)
        assert answer.status_code == 200, answer.text
        chat = MessagesRequest.model_validate(copy.deepcopy(body)).to_chat()
        await whole.chat("r", chat)
        text = "".join(b.get("text", "") for b in answer.json()["content"])
        messages = [*messages, {"role": "assistant", "content": text or "."},
                    {"role": "user", "content": f"Step {step}."}]  # fmt: skip
    ours, truth = rollout.trajectory(), served(await whole.trajectory("r"))
    assert [t["prompt_ids"] for t in ours["turns"]] == [t["prompt_ids"] for t in truth["turns"]]
    assert [t["prompt_hash"] for t in ours["turns"]] == [
        sha256_prompt_hash(t["prompt_ids"]) for t in ours["turns"]
    ]
    prompt = renderer.decode(ours["turns"][2]["prompt_ids"])
    assert '"arguments": {"a": true}' in prompt


def test_responses_route_branching_on_previous_response_ids(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer
) -> None:
    """Responses continue older responses (branches) and the chat route in between: each
    recorded prompt is what its conversation renders to, or extends its parent correctly."""
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    url = f"/v1/rollouts/{rollout.id}/responses"

    def respond(text: str, previous: str | None) -> str:
        body: Body = {"input": text, "max_output_tokens": 8}
        if previous:
            body["previous_response_id"] = previous
        answer = client.post(url, json=body, headers=rollout.headers)
        assert answer.status_code == 200, answer.text
        return answer.json()["id"]

    first = respond("One.", None)
    second = respond("Two.", first)
    respond("Two again.", first)  # a branch from the older response
    third = respond("Three.", second)
    rollout.reply({"messages": [{"role": "user", "content": "Chat."}]})
    respond("Four.", third)
    turns = rollout.trajectory()["turns"]
    assert len(turns) == 6
    for turn in turns:
        assert turn["prompt_hash"] == sha256_prompt_hash(turn["prompt_ids"])
    prompts = [renderer.decode(t["prompt_ids"]) for t in turns]
    assert "Two." not in prompts[2] and "Two again." in prompts[2]
    assert all(word in prompts[5] for word in ("One.", "Two.", "Three.", "Four."))
    assert "Two again." not in prompts[5] and "Chat." not in prompts[5]


def test_hashes_hold_when_a_weight_update_aborts_and_reissues_turns(
    renderer: ChatRenderer,
) -> None:
    gateway = sim_gateway(renderer, output_len=8, latency_s=0.6)
    with serving(gateway) as (client, admin_key):
        rollout = Rollout(client, admin_key)
        messages = [{"role": "user", "content": "Start."}]
        reply = rollout.reply({"messages": messages})
        messages = [*messages, reply, {"role": "user", "content": "Next."}]

        async def update_soon() -> httpx.Response:
            await asyncio.sleep(0.3)
            body = {"source": "/ckpt/1", "mode": "abort"}
            return await asyncio.to_thread(
                client.post, "/admin/weights", json=body, headers=rollout.admin
            )

        async def both() -> list[Any]:
            chat = asyncio.to_thread(rollout.reply, {"messages": messages})
            return await asyncio.gather(chat, update_soon())

        second, update = asyncio.run(both())
        assert update.status_code == 200, update.text
        follow = [*messages, second, {"role": "user", "content": "Last."}]
        rollout.reply({"messages": follow})
        turns = rollout.trajectory()["turns"]
    assert turns[1]["reissued"] >= 1
    assert [t["segment"] for t in turns] == [0, 0, 0]
    check_turns(renderer, turns, rollout.sent)


# Message keys sort the arguments' keys (on purpose: an agent's re-serialized echo of the
# model's call must still extend the turn). An edit that only reorders the keys of an older call
# is therefore not rendered, though the template renders keys in the order sent: the known
# limitation docs/gateway.md states, against claim 1 ("key order").


def test_reordered_argument_keys_in_an_earlier_call_keep_the_order_first_sent(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer
) -> None:
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    reply = rollout.reply({"messages": history('{"a": 1, "b": 2}'), "tools": [ADD_TOOL]})
    edited = [*history('{"b": 2, "a": 1}'), reply, {"role": "user", "content": "More."}]
    rollout.reply({"messages": edited, "tools": [ADD_TOOL]})
    turns = rollout.trajectory()["turns"]
    assert [t["segment"] for t in turns] == [0, 0]  # not taken as an edit: the turn extends
    as_first_sent = [*history('{"a": 1, "b": 2}'), reply, {"role": "user", "content": "More."}]
    check_turns(
        renderer, turns, {0: rollout.sent[0], 1: {**rollout.sent[1], "messages": as_first_sent}}
    )
    with pytest.raises(AssertionError):  # what the template would write of the request as sent
        check_turns(renderer, turns, rollout.sent)


# --- Random sessions over HTTP, judged by the render oracle alone. ---------------------------

SAFE_ARGUMENTS = [
    '{"a": 1}', '{"a":1}', '{"a": 1.0}', '{"a": true}', {"a": 1}, {"a": 1.0}, {"a": True},
    '{"a": 1e2}', '{"a": 100.0}', '{"a": "\\u00e9"}', '{"a": "é"}', "not json", '{"a": -0}',
    '{"a": 0}', {"a": [1, {"b": False}]}, {"a": [1, {"b": 0}]}, '{"a": null}', {"a": None},
]  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_random_sessions_record_prompts_their_messages_render_to(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer, seed: int
) -> None:
    import random

    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    rng = random.Random(seed)
    messages, reply = history('{"a": 1}'), None
    for _ in range(14):
        action = rng.choice(
            ["append", "append", "edit", "parts", "retype", "extra", "drop", "resend", "bad"]
        )
        if action == "append" and reply is not None:
            messages = [*messages, reply, {"role": "user", "content": rng.choice("xyz")}]
        elif action == "edit":
            at = rng.randrange(len(messages))
            messages[at] = {**messages[at], "content": rng.choice(["x", "y", "", None])}
            if messages[at]["content"] is None and messages[at]["role"] != "assistant":
                messages[at]["content"] = "z"
        elif action == "parts":
            at = rng.randrange(len(messages))
            text = messages[at].get("content") or ""
            messages[at] = {**messages[at], "content": [{"type": "text", "text": text}]}
        elif action == "retype":
            calls = [i for i, m in enumerate(messages) if m.get("tool_calls")]
            if calls:
                at = rng.choice(calls)
                messages[at] = call_message(copy.deepcopy(rng.choice(SAFE_ARGUMENTS)))
        elif action == "extra":
            at = rng.randrange(len(messages))
            messages[at] = {**messages[at], "refusal": None, "x": rng.choice([1, 1.0, True])}
        elif action == "drop" and len(messages) > 2:
            messages = messages[:-1]
        elif action == "bad":
            wrong = list(messages)
            at = rng.randrange(len(wrong) + 1)
            wrong.insert(at, {"role": "wizard", "content": "x"})
            answer = rollout.post({"messages": wrong, "tools": [ADD_TOOL]})
            assert answer.status_code == 422
            assert answer.json()["error"]["param"] == f"messages.{at}.role"
            continue
        reply = rollout.reply({"messages": messages, "tools": [ADD_TOOL]})
        messages = copy.deepcopy(messages)
    check_turns(renderer, rollout.trajectory()["turns"], rollout.sent)


class RecordingChat:
    """A chat-level engine (no token ids) that answers a fixed text and keeps what it got."""

    def __init__(self) -> None:
        self.received: list[list[dict[str, Any]]] = []

    async def chat(self, messages, tools, sampling, request_id):  # type: ignore[no-untyped-def]
        from rollway.generation import ChatGeneration

        self.received.append(copy.deepcopy(messages))
        return ChatGeneration({"role": "assistant", "content": f"ok {len(messages)}"}, "stop", 1, 1)

    async def abort(self, request_id: str) -> None:
        pass

    async def close(self) -> None:
        pass


def test_a_chat_level_engine_gets_each_request_s_own_messages(renderer: ChatRenderer) -> None:
    engine = RecordingChat()
    with serving(Gateway(engine, renderer, model_name="chat")) as (client, admin_key):  # type: ignore[arg-type]
        rollout = Rollout(client, admin_key)
        messages, reply, sent = history('{"a": 1}'), {}, []
        for name, edit in [("start", None), *scripted_bodies()]:
            edited = messages if edit is None else edit(messages, reply)
            raw = (
                edited
                if isinstance(edited, bytes)
                else orjson.dumps({"messages": edited, "tools": [ADD_TOOL]})
            )
            answer = rollout.post(raw)
            assert answer.status_code == 200, (name, answer.text)
            reply = answer.json()["choices"][0]["message"]
            messages = orjson.loads(raw)["messages"]
            sent.append((name, validated(orjson.loads(raw))[0]))
        recorded = Trajectory.model_validate(rollout.trajectory(whole_prompts=False))
    assert len(engine.received) == len(sent) == len(recorded.turns)
    for got, (name, expected) in zip(engine.received, sent, strict=True):
        assert orjson.dumps(got) == orjson.dumps(expected), name  # 1, 1.0, true told apart
    for index, turn in enumerate(recorded.turns):
        assert turn.prompt_hash == sha256_prompt_hash(recorded.prompt_ids(index))


def test_changing_tools_between_turns_with_reused_messages(
    sim_http: tuple[httpx.Client, str, Gateway], renderer: ChatRenderer
) -> None:
    """Tools are not part of what is reused: each turn's prompt follows its own tools."""
    client, admin_key, _ = sim_http
    rollout = Rollout(client, admin_key)
    other = copy.deepcopy(ADD_TOOL)
    other["function"]["description"] = "Add two integers, carefully."
    messages = history('{"a": 1}')
    for step, tools in enumerate([[ADD_TOOL], [ADD_TOOL], None, [other], [other], [ADD_TOOL]]):
        body: Body = {"messages": messages}
        if tools is not None:
            body["tools"] = tools
        reply = rollout.reply(body)
        messages = [*messages, reply, {"role": "user", "content": f"Step {step}."}]
    turns = rollout.trajectory()["turns"]
    # Back on the first tools, the request extends the first thread's tip (the answers of
    # the other tools' turns come in its prompt), not a fresh segment.
    assert [t["segment"] for t in turns] == [0, 0, 1, 2, 2, 0]
    check_turns(renderer, turns, rollout.sent)
    assert "carefully" in renderer.decode(turns[3]["prompt_ids"])
    assert "carefully" not in renderer.decode(turns[5]["prompt_ids"])
