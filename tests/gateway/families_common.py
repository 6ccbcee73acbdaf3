"""Scaffolding shared by the model-family tests: the scripted gateway (in process or served on
loopback), the two-question tool loop driven in process, through the openai SDK (streamed and
not) and the anthropic SDK, and the check that a whole loop is one exact sample. Each family's
file says what its answers must be; the driving is written once, here."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai

from rollway.engines.scripted import ScriptedEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.base import Renderer
from rollway.trajectory import Trajectory
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, Closing

Echo = Callable[[dict[str, Any]], dict[str, Any]]
Ask = Callable[[list[dict[str, Any]]], dict[str, Any]]
Served = tuple[str, Gateway, ScriptedEngine]
QUESTION, FOLLOW_UP = "What is 1 + 2 + 3 + 4?", "And plus 5?"

ANTHROPIC_ADD = {
    "name": "add",
    "description": ADD_TOOL["function"]["description"],
    "input_schema": ADD_TOOL["function"]["parameters"],
}


#: The thinking of each turn of the scripted loop, for a family that thinks.
REASONING = [
    "Add 1 and 2 first.",
    "Now 3 and 3.",
    "Then 6 and 4.",
    "The sum is 10.",
    "Add 5 to 10.",
    "It is 15.",
]


def thinking_script(
    call: Callable[[str, int, int], str], answer: Callable[[str, str], str]
) -> list[str]:
    """Two questions: a 4-turn tool loop, then a 2-turn one after a second user message; each
    completion written by the family's ``call`` (thinking, a, b) or ``answer`` (thinking, text)."""
    return [
        call(REASONING[0], 1, 2),
        call(REASONING[1], 3, 3),
        call(REASONING[2], 6, 4),
        answer(REASONING[3], "1 + 2 + 3 + 4 = 10."),
        call(REASONING[4], 10, 5),
        answer(REASONING[5], "15."),
    ]


def check_thinking_answers(answers: list[dict[str, Any]], marker: str) -> None:
    """The reasoning apart, in ``reasoning_content``; no ``marker`` of the format left in the
    content; the calls parsed; the two answers' text."""
    assert [a.get("reasoning_content") for a in answers] == REASONING
    for answer in answers:
        assert marker not in (answer.get("content") or "")
    calls = [json.loads(a["tool_calls"][0]["function"]["arguments"]) for a in answers[:3]]
    assert calls == [{"a": 1, "b": 2}, {"a": 3, "b": 3}, {"a": 6, "b": 4}]
    assert answers[3]["content"] == "1 + 2 + 3 + 4 = 10." and not answers[3].get("tool_calls")
    assert answers[5]["content"] == "15."


def scripted_gateway(
    script: list[str], tokenizer: Any, renderer: Renderer, model_name: str
) -> tuple[Gateway, ScriptedEngine]:
    """A gateway over a scripted engine answering ``script``'s completions in turn."""
    engine = ScriptedEngine(script, tokenizer)
    return Gateway(engine, renderer, model_name=model_name), engine


def serve(gateway: Gateway, engine: ScriptedEngine) -> Iterator[Served]:
    """The HTTP gateway on loopback (for a fixture to ``yield from``)."""
    with BackgroundServer(create_app(gateway, admin_key=f"ak-{secrets.token_hex(8)}")) as url:
        yield url, gateway, engine


def with_reasoning_field(message: dict[str, Any]) -> dict[str, Any]:
    return message


def with_reasoning_in_content(message: dict[str, Any]) -> dict[str, Any]:
    reasoning, content = message.pop("reasoning_content"), message.get("content") or ""
    return message | {"content": f"<think>\n{reasoning}\n</think>\n\n{content}"}


def with_reasoning_dropped(message: dict[str, Any]) -> dict[str, Any]:
    message.pop("reasoning_content")
    return message


def tool_results(message: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    for call in message.get("tool_calls") or []:
        arguments = json.loads(call["function"]["arguments"])
        total = str(arguments["a"] + arguments["b"])
        results.append({"role": "tool", "tool_call_id": call["id"], "content": total})
    return results


def agent_loop(ask: Ask, echo: Echo) -> list[Any]:
    """Two questions, each answered through a tool loop; every answer sent back by ``echo``."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    answers = []
    for turns, follow_up in ((4, FOLLOW_UP), (2, None)):
        for _ in range(turns):
            answer = ask(messages)
            answers.append(dict(answer))
            messages += [echo(dict(answer)), *tool_results(answer)]
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return answers


def in_process_ask(gateway: Gateway, rollout: str) -> Ask:
    """Asks the gateway's chat directly, with the ``add`` tool."""

    def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"messages": messages, "tools": [ADD_TOOL]}
        return dict(asyncio.run(gateway.chat(rollout, body)).message)

    return ask


def in_process_loop(
    gateway: Gateway, rollout: str, echo: Echo, settings: dict[str, Any] | None = None
) -> list[Any]:
    """The tool loop in process, on a rollout registered with ``settings``."""
    gateway.register(rollout, settings or {"max_tokens": 256})
    return agent_loop(in_process_ask(gateway, rollout), echo)


def openai_client(closing: Closing, url: str, rollout: str, api_key: str) -> openai.OpenAI:
    return closing(openai.OpenAI(base_url=f"{url}/v1/rollouts/{rollout}", api_key=api_key))


def streamed_message(
    client: openai.OpenAI,
    messages: list[dict[str, Any]],
    model: str = "qwen3",
    thinks: bool = True,
    check_delta: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """The message an SDK user gathers from the stream's deltas. Where the model ``thinks``,
    the reasoning streams as the tokens come (a delta a token here: the scripted engine
    streams so), before any content; ``check_delta`` checks each delta."""
    content, reasoning, calls, kinds = "", "", [], []
    chunks = client.chat.completions.create(
        model=model, messages=messages, tools=[ADD_TOOL], stream=True
    )
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        if check_delta:
            check_delta(delta)
        thought = (delta.model_extra or {}).get("reasoning_content")
        kinds += ["content"] * bool(delta.content) + ["reasoning"] * bool(thought)
        content += delta.content or ""
        reasoning += thought or ""
        calls += [call.model_dump(exclude_none=True) for call in delta.tool_calls or []]
    if thinks:
        assert kinds.count("reasoning") > 1
        assert "content" not in kinds or kinds.index("content") > max(
            at for at, kind in enumerate(kinds) if kind == "reasoning"
        )
    for call in calls:
        call.pop("index")
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def openai_ask(
    client: openai.OpenAI, model: str, stream: bool, streamed: Callable[..., dict[str, Any]]
) -> Ask:
    """Asks through the SDK; not streamed, the message as the SDK returned it (a field it does
    not know, reasoning_content, kept); streamed, as ``streamed`` gathers it."""

    def ask(messages: list[dict[str, Any]]) -> dict[str, Any]:
        if stream:
            return streamed(client, messages)
        reply = client.chat.completions.create(model=model, messages=messages, tools=[ADD_TOOL])
        return reply.choices[0].message.model_dump(exclude_none=True)

    return ask


def openai_loop(
    served: Served,
    closing: Closing,
    model: str,
    stream: bool,
    streamed: Callable[..., dict[str, Any]] = streamed_message,
    wrap: Callable[[Ask], Ask] = lambda ask: ask,
    echo: Echo = with_reasoning_field,
    rollout: str = "r1",
) -> list[Any]:
    """The tool loop through the openai SDK on a rollout registered on the served gateway."""
    url, gateway, _ = served
    registered = gateway.register(rollout, {"max_tokens": 256})
    client = openai_client(closing, url, rollout, registered.api_key)
    return agent_loop(wrap(openai_ask(client, model, stream, streamed)), echo)


def anthropic_replies(
    served: Served, closing: Closing, model: str, stream: bool, rollout: str = "r1"
) -> list[Any]:
    """The tool loop through the anthropic SDK: each reply's content blocks sent back as the
    SDK returned them (a thinking block first, with its signature), the results of its
    ``tool_use`` blocks after it. The replies, one a turn."""
    url, gateway, _ = served
    registered = gateway.register(rollout, {"max_tokens": 256})
    client = closing(
        anthropic.Anthropic(base_url=f"{url}/v1/rollouts/{rollout}", api_key=registered.api_key)
    )

    def ask(messages: list[dict[str, Any]]) -> Any:
        asked = {"model": model, "max_tokens": 256, "messages": messages, "tools": [ANTHROPIC_ADD]}
        if not stream:
            return client.messages.create(**asked)
        with client.messages.stream(**asked) as events:
            return events.get_final_message()

    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    replies = []
    for turns, follow_up in ((4, FOLLOW_UP), (2, None)):
        for _ in range(turns):
            reply = ask(messages)
            replies.append(reply)
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in reply.content]}
            )
            uses = [b for b in reply.content if b.type == "tool_use"]
            results = [
                {"type": "tool_result", "tool_use_id": b.id, "content": str(sum(b.input.values()))}
                for b in uses
            ]
            if results:
                messages.append({"role": "user", "content": results})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    return replies


def blocks(replies: list[Any], kind: str) -> list[Any]:
    """The blocks of ``kind`` in all the replies, in order."""
    return [b for reply in replies for b in reply.content if b.type == kind]


def check_one_exact_sample(
    trajectory: Trajectory, engine: ScriptedEngine, tokenizer: Any, script: list[str]
) -> list[list[int]]:
    """One segment; the sampled ids are exactly the script's, under mask 1, with the engine's
    logprobs beside them; each prompt extends the previous prompt and completion. The
    script's ids, a list a turn."""
    assert trajectory.segment_count == 1
    (sample,) = trajectory.samples
    sampled = [t for t, m in zip(sample.response_ids, sample.loss_mask, strict=True) if m]
    scripted = [tokenizer.encode(text, add_special_tokens=False) for text in script]
    assert sampled == [token for ids in scripted for token in ids]
    logprobs = [lp for lp, m in zip(sample.logprobs, sample.loss_mask, strict=True) if m]
    assert logprobs == [-0.001 * rank for rank in range(1, len(sampled) + 1)]
    for turn, (prompt, ids) in enumerate(zip(engine.prompts[1:], scripted, strict=False)):
        before = engine.prompts[turn]
        assert prompt[: len(before) + len(ids)] == before + ids, f"turn {turn + 1}"
    return scripted
