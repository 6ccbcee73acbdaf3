"""An outside tester's attacks on true token streaming (docs/gateway.md, the
paragraph after the routes table). Each test here failed when written."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.web.background_server import BackgroundServer
from tests.conftest import Closing, Served
from tests.gateway.test_http_openai_sdk import register

USER = [{"role": "user", "content": "hi"}]


def serve(engine: object, renderer: ChatRenderer) -> Iterator[Served]:
    gateway = Gateway(engine, renderer, model_name="m")  # type: ignore[arg-type]
    admin_key = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin_key)) as url:
        yield Served(url, admin_key, gateway)


# Tools offered, an answer that begins with whitespace: nothing streams until the end.


class PacedText:
    """Streams the tokens of a given text one by one, 20 ms apart, then stops."""

    def __init__(self, renderer: ChatRenderer, text: str) -> None:
        self.ids = renderer.encode(text)

    async def generate_stream(self, input_ids: list[int], sampling: Any, request_id: str):  # type: ignore[no-untyped-def]
        from rollway.generation import GenerationChunk

        for index, token_id in enumerate(self.ids):
            await asyncio.sleep(0.02)
            last = index == len(self.ids) - 1
            yield GenerationChunk([token_id], [-0.5], "stop" if last else None, [0])

    async def generate(self, input_ids: list[int], sampling: Any, request_id: str):  # type: ignore[no-untyped-def]
        from rollway.engines.streaming import collect

        return collect([c async for c in self.generate_stream(input_ids, sampling, request_id)])

    async def abort(self, request_id: str) -> None:
        pass

    async def close(self) -> None:
        pass


TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
        },
    },
}
WORDS = "I cannot use a tool for this one, so here is a long plain answer in many small words."


@pytest.mark.parametrize("lead", ["\n", " "], ids=["newline", "space"])
def test_with_tools_offered_an_answer_that_begins_with_whitespace_still_streams(
    renderer: ChatRenderer, lead: str
) -> None:
    """docs/gateway.md: text is sent as it is decoded, held back only where the recorded
    answer might not keep it (... with tools, a possible start of a `<tool_call>` tag). An
    answer with no tool call at all that happens to start with a newline or a space (SmolLM2
    does this) is held back whole: its first delta comes with the last token, as if not
    streamed."""
    for served in serve(PacedText(renderer, lead + WORDS), renderer):
        registration = register(served)
        headers = {"Authorization": f"Bearer {registration['api_key']}"}
        deltas: list[str] = []
        with httpx.stream(
            "POST", f"{registration['base_url']}/chat/completions", headers=headers,
            json={"model": "m", "messages": USER, "tools": [TOOL], "stream": True}, timeout=30,
        ) as response:  # fmt: skip
            import json

            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    for choice in chunk.get("choices") or []:
                        if text := (choice.get("delta") or {}).get("content"):
                            deltas.append(text)
        assert "".join(deltas).strip() == WORDS
        assert len(deltas) > 5, f"streamed in {len(deltas)} piece(s): {deltas!r}"


# Anthropic stop sequences: the stream's (and JSON's) stop_reason.


def test_an_anthropic_stream_that_hits_a_stop_sequence_says_so(
    renderer: ChatRenderer,
    closing: Closing,
) -> None:
    """Anthropic's Messages API answers stop_reason "stop_sequence" and names the sequence in
    stop_sequence when one ended the answer; the SDK's final message carries them. rollway
    streams (and answers) "end_turn" with stop_sequence null, so an Anthropic client cannot
    tell a stop sequence from a natural end."""
    for served in serve(PacedText(renderer, "one two three STOP four five six"), renderer):
        registration = register(served)
        client = closing(
            anthropic.Anthropic(
                base_url=registration["base_url"], api_key=registration["api_key"], max_retries=0
            )
        )
        with client.messages.stream(
            model="m", max_tokens=32, messages=USER, stop_sequences=["STOP"]
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text == "one two three "
        assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "STOP")
