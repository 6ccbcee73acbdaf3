from __future__ import annotations

import json

from rollway.gateway.render.tool_calls import parse_tool_calls, render_tool_calls


def test_hermes_blocks_become_openai_tool_calls_and_leave_the_content() -> None:
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.error is None and parsed.content == "Let me add."
    (call,) = parsed.tool_calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}


def test_several_calls_are_all_kept_in_order() -> None:
    text = "".join(
        f'<tool_call>{{"name": "f{i}", "arguments": {{}}}}</tool_call>' for i in range(3)
    )
    parsed = parse_tool_calls(text)
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["f0", "f1", "f2"]
    assert parsed.content == ""


def test_unparseable_call_is_returned_as_content_and_flagged() -> None:
    for text in (
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {}}',
    ):
        parsed = parse_tool_calls(text)
        assert parsed.tool_calls == [] and parsed.content == text and parsed.error


def test_plain_text_is_untouched() -> None:
    parsed = parse_tool_calls("just words")
    assert parsed.content == "just words" and parsed.tool_calls == [] and parsed.error is None


def test_rendered_calls_parse_back_to_the_same_calls() -> None:
    calls = [{"id": "c", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]
    parsed = parse_tool_calls(render_tool_calls("thinking", calls))
    assert parsed.content == "thinking"
    assert parsed.tool_calls[0]["function"]["arguments"] == '{"a": 1}'
