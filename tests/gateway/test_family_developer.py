"""A ``developer`` message (OpenAI's name for system instructions) on Qwen3's real template,
which has no such role and drops it without a word: rendered as a system message where it
stands, as vLLM's Responses API folds developer messages into the system instructions, not
lost as the template (and vLLM's chat completions, which hands it the role) would lose it
(docs/gateway.md, "Roles")."""

from __future__ import annotations

from typing import Any

import pytest

from rollway.gateway.render.renderers import load_renderer
from tests.gateway.test_family_edits import tokenizer

QUESTION = {"role": "user", "content": "Hi."}
ANSWER = {"role": "assistant", "content": "Hello."}


@pytest.mark.parametrize(
    "chat",
    [
        [{"role": "developer", "content": "Be brief."}, QUESTION],
        [QUESTION, ANSWER, {"role": "developer", "content": "Be brief."}, QUESTION],
    ],
    ids=["first", "later"],
)
def test_a_developer_message_on_qwen3_is_its_system_message_where_it_stands(
    chat: list[dict[str, Any]],
) -> None:
    words = tokenizer("qwen3")
    as_system = [m | {"role": "system"} if m["role"] == "developer" else m for m in chat]
    template = words.apply_chat_template(as_system, tokenize=False, add_generation_prompt=True)
    assert load_renderer(words).prompt_ids(chat, None) == words.encode(template)
    dropped = words.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert "Be brief." in template and "Be brief." not in dropped  # the template loses it
