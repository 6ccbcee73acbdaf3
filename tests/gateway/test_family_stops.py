"""A stop string inside a thinking family's reasoning (Qwen3, GPT-OSS analysis), through the
unmodified SDKs: the streamed reasoning adds up to the recorded one, cut before the stop string,
never the stop string itself."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from rollway.engines.scripted import ScriptedEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.renderers import load_renderer
from rollway.web.background_server import BackgroundServer
from tests.conftest import Closing
from tests.gateway.test_family_edits import tokenizer

#: Each family's folder and an answer whose reasoning holds the stop string (the engine
#: stops right after it, as vLLM and SGLang do).
SCRIPTS = {
    "qwen3": ("qwen3", "<think>\nI will STOP"),
    "gptoss": ("gptoss", "<|channel|>analysis<|message|>I will STOP"),
}
QUESTION = [{"role": "user", "content": "Go."}]


@pytest.fixture(params=sorted(SCRIPTS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Gateway]]:
    folder, answer = SCRIPTS[request.param]
    tok = tokenizer(folder)
    engine = ScriptedEngine([answer, answer], tok)
    gateway = Gateway(engine, load_renderer(tok, None), model_name=folder)
    with BackgroundServer(create_app(gateway, admin_key=f"ak-{secrets.token_hex(8)}")) as url:
        yield url, gateway


def test_the_streamed_reasoning_stops_where_the_recorded_one_does(
    served: tuple[str, Gateway], closing: Closing
) -> None:
    url, gateway = served
    registered = gateway.register("r", {"max_tokens": 64})
    base = f"{url}/v1/rollouts/r"
    chat = closing(openai.OpenAI(base_url=base, api_key=registered.api_key))
    whole = chat.chat.completions.create(model="m", messages=QUESTION, stop=["STOP"])  # type: ignore[arg-type]
    assert (whole.choices[0].message.model_extra or {})["reasoning_content"] == "I will "
    streamed = ""
    for chunk in chat.chat.completions.create(
        model="m",
        messages=QUESTION,  # type: ignore[arg-type]
        stop=["STOP"],
        stream=True,
    ):
        if chunk.choices:
            extra: dict[str, Any] = chunk.choices[0].delta.model_extra or {}
            streamed += extra.get("reasoning_content") or ""
    assert streamed == "I will "


def test_streamed_thinking_deltas_stop_where_the_recorded_thinking_does(
    served: tuple[str, Gateway], closing: Closing
) -> None:
    url, gateway = served
    registered = gateway.register("r", {"max_tokens": 64})
    client = closing(
        anthropic.Anthropic(base_url=f"{url}/v1/rollouts/r", api_key=registered.api_key)
    )
    thinking = ""
    with client.messages.stream(
        model="m",
        max_tokens=64,
        messages=QUESTION,  # type: ignore[arg-type]
        stop_sequences=["STOP"],
    ) as events:
        for event in events:
            if event.type == "content_block_delta" and event.delta.type == "thinking_delta":
                thinking += event.delta.thinking
        final = events.get_final_message()
    assert thinking == "I will "
    assert [getattr(b, "thinking", None) for b in final.content] == ["I will "]
    assert final.stop_reason == "stop_sequence"
