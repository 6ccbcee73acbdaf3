"""Thinking families (Qwen3, GPT-OSS) on their real tokenizers, driven by unmodified SDKs: an
agent that changes the reasoning of an answer before sending it back gets that reasoning in
the next prompt (a new segment, as any edit), while reasoning kept, moved into the content or
dropped still extends the sampled ids."""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest
from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.renderers import load_renderer
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, Closing, family_folder
from tests.gateway.test_families import ANTHROPIC_ADD, qwen3_answer, qwen3_call
from tests.gateway.test_family_gptoss import gptoss_answer, gptoss_call

SAMPLED = "Secret plan: add them."
EDITED = "SUMMARY of the plan."
#: Each family's folder and a call then an answer, the call thinking ``SAMPLED``.
SCRIPTS = {
    "qwen3": ("qwen3", [qwen3_call(SAMPLED, 1, 2), qwen3_answer("Done.", "3.")]),
    "gptoss": ("gptoss", [gptoss_call(SAMPLED, 1, 2), gptoss_answer("Done.", "3.")]),
}
Served = tuple[str, Gateway, ScriptedEngine, Any]


@functools.cache
def tokenizer(folder: str) -> Any:
    return AutoTokenizer.from_pretrained(family_folder(folder))


@pytest.fixture(params=sorted(SCRIPTS))
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    folder, script = SCRIPTS[request.param]
    tok = tokenizer(folder)
    engine = ScriptedEngine(script, tok)
    gateway = Gateway(engine, load_renderer(tok, None), model_name=folder)
    with BackgroundServer(create_app(gateway, admin_key=f"ak-{secrets.token_hex(8)}")) as url:
        yield url, gateway, engine, tok


def edited_field(message: dict[str, Any]) -> dict[str, Any]:
    return message | {"reasoning_content": EDITED}


def edited_in_content(message: dict[str, Any]) -> dict[str, Any]:
    message.pop("reasoning_content")
    return message | {"content": f"<think>\n{EDITED}\n</think>\n\n{message.get('content') or ''}"}


def kept(message: dict[str, Any]) -> dict[str, Any]:
    return message


def dropped_as(value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def drop(message: dict[str, Any]) -> dict[str, Any]:
        message.pop("reasoning_content")
        return message if value is ... else message | {"reasoning_content": value}

    return drop


def second_prompt(served: Served, echo: Callable[..., dict[str, Any]]) -> list[int]:
    """The prompt after the agent sends the call back through ``echo`` with its result."""
    url, gateway, engine, _ = served
    registered = gateway.register("r", {"max_tokens": 256})
    with openai.OpenAI(base_url=f"{url}/v1/rollouts/r", api_key=registered.api_key) as client:
        messages: list[Any] = [{"role": "user", "content": "Add 1 and 2."}]
        reply = client.chat.completions.create(model="m", messages=messages, tools=[ADD_TOOL])
        answer = reply.choices[0].message.model_dump(exclude_none=True)
        assert answer["reasoning_content"] == SAMPLED
        call_id = answer["tool_calls"][0]["id"]
        messages += [echo(answer), {"role": "tool", "tool_call_id": call_id, "content": "3"}]
        client.chat.completions.create(model="m", messages=messages, tools=[ADD_TOOL])
    return engine.prompts[1]


@pytest.mark.parametrize("echo", [edited_field, edited_in_content])
def test_an_edited_reasoning_is_the_next_prompts_history(
    served: Served, echo: Callable[..., dict[str, Any]]
) -> None:
    _, gateway, _, tok = served
    prompt = tok.decode(second_prompt(served, echo))
    assert EDITED in prompt and SAMPLED not in prompt
    trajectory = asyncio.run(gateway.trajectory("r"))
    assert trajectory.segment_count == 2


@pytest.mark.parametrize(
    "echo",
    [kept, dropped_as(...), dropped_as(None), dropped_as("")],
    ids=["kept", "key_absent", "none", "empty"],  # stable ids: xdist's workers must agree
)
def test_a_reasoning_kept_or_dropped_extends_the_sampled_ids(
    served: Served, echo: Callable[..., dict[str, Any]]
) -> None:
    _, gateway, engine, tok = served
    prompt = second_prompt(served, echo)
    assert prompt[: len(engine.prompts[0])] == engine.prompts[0]
    assert SAMPLED in tok.decode(prompt)
    assert asyncio.run(gateway.trajectory("r")).segment_count == 1


def test_an_edited_thinking_block_is_the_next_prompts_history(
    served: Served, closing: Closing
) -> None:
    url, gateway, engine, tok = served
    registered = gateway.register("r", {"max_tokens": 256})
    client = closing(
        anthropic.Anthropic(base_url=f"{url}/v1/rollouts/r", api_key=registered.api_key)
    )
    messages: list[Any] = [{"role": "user", "content": "Add 1 and 2."}]
    reply = client.messages.create(
        model="m", max_tokens=256, messages=messages, tools=[ANTHROPIC_ADD]
    )
    blocks = [block.model_dump() for block in reply.content]
    (thinking,) = [b for b in blocks if b["type"] == "thinking"]
    assert thinking["thinking"] == SAMPLED
    thinking["thinking"] = EDITED
    (use,) = [b for b in blocks if b["type"] == "tool_use"]
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "3"}
    messages += [{"role": "assistant", "content": blocks}, {"role": "user", "content": [result]}]
    client.messages.create(model="m", max_tokens=256, messages=messages, tools=[ANTHROPIC_ADD])
    prompt = tok.decode(engine.prompts[1])
    assert EDITED in prompt and SAMPLED not in prompt
    assert asyncio.run(gateway.trajectory("r")).segment_count == 2


def test_content_added_to_a_call_that_thought_is_the_next_prompts_history(served: Served) -> None:
    """GPT-OSS writes a call's content as its analysis; with the reasoning there too, the
    content goes as a commentary preamble (as the parse reads one), not dropped."""
    _, gateway, _, tok = served
    prompt = tok.decode(second_prompt(served, lambda m: m | {"content": "I'll call add."}))
    assert "I'll call add." in prompt and SAMPLED in prompt
    assert asyncio.run(gateway.trajectory("r")).segment_count == 2
