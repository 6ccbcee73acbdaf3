"""An Anthropic prefill (a final assistant message) is continued, not closed: on the real
tokenizers and templates of Qwen3 and GPT-OSS, through the anthropic SDK (streamed and not)
driving a scripted engine, the prompt ends with the prefill's text inside an open answer, the
reply is the continuation (as Anthropic answers), and the conversation sent back with the whole
message is one exact sample. A prefill no family can continue is a 422 naming why."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from rollway.gateway.render.renderers import load_renderer
from tests.conftest import Closing
from tests.gateway import families_common as common
from tests.gateway.families_common import Served
from tests.gateway.test_family_edits import tokenizer

PREFILL = "The answer is"
#: Per family: the open answer the prompt ends with, the continuation, the next answer.
FAMILIES = {
    "qwen3": (
        f"<|im_start|>assistant\n<think>\n\n</think>\n\n{PREFILL}",
        [" 4.<|im_end|>", "Yes.<|im_end|>"],
    ),
    "gptoss": (
        f"<|start|>assistant<|channel|>final<|message|>{PREFILL}",
        [" 4.<|return|>", "<|channel|>final<|message|>Yes.<|return|>"],
    ),
}


@pytest.fixture(params=sorted(FAMILIES))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, Served]]:
    family = str(request.param)
    words = tokenizer(family)
    script = FAMILIES[family][1]
    gateway = common.scripted_gateway(script, words, load_renderer(words), "m")
    yield from ((family, served) for served in common.serve(*gateway))


def ask(client: anthropic.Anthropic, messages: list[dict[str, Any]], stream: bool) -> Any:
    asked = {"model": "m", "max_tokens": 64, "messages": messages}
    if not stream:
        return client.messages.create(**asked)
    with client.messages.stream(**asked) as events:
        return events.get_final_message()


@pytest.mark.parametrize("stream", [False, True])
def test_a_prefill_is_continued_and_the_conversation_is_one_sample(
    served: tuple[str, Served], closing: Closing, stream: bool
) -> None:
    family, (url, gateway, engine) = served
    words = gateway.renderer.tokenizer
    registered = gateway.register("p1", {"max_tokens": 64})
    client = closing(
        anthropic.Anthropic(base_url=f"{url}/v1/rollouts/p1", api_key=registered.api_key)
    )
    question = {"role": "user", "content": "What is 2 + 2?"}
    reply = ask(client, [question, {"role": "assistant", "content": PREFILL}], stream)
    assert [b.text for b in reply.content if b.type == "text"] == [" 4."]
    assert reply.stop_reason == "end_turn"
    assert words.decode(engine.prompts[0]).endswith(FAMILIES[family][0])
    whole = {"role": "assistant", "content": PREFILL + " 4."}
    again = ask(client, [question, whole, {"role": "user", "content": "Sure?"}], stream)
    assert [b.text for b in again.content if b.type == "text"] == ["Yes."]
    trajectory = asyncio.run(gateway.trajectory("p1"))
    script = FAMILIES[family][1]
    common.check_one_exact_sample(trajectory, engine, words, script)
    (sample,) = trajectory.samples
    prefilled = words.encode(FAMILIES[family][0], add_special_tokens=False)
    assert sample.prompt_ids[-len(prefilled) :] == prefilled  # the prefill is prompt, mask 0


def test_a_final_assistant_message_that_cannot_be_continued_is_a_422(
    served: tuple[str, Served], closing: Closing
) -> None:
    _, (url, gateway, _) = served
    registered = gateway.register("p2", {"max_tokens": 64})
    client = closing(
        anthropic.Anthropic(base_url=f"{url}/v1/rollouts/p2", api_key=registered.api_key)
    )
    use = {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}}
    with pytest.raises(anthropic.UnprocessableEntityError, match="continuing the final"):
        ask(
            client,
            [{"role": "user", "content": "Add."}, {"role": "assistant", "content": [use]}],
            False,
        )
    with pytest.raises(anthropic.UnprocessableEntityError, match="is empty"):
        ask(
            client,
            [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": ""}],
            False,
        )
