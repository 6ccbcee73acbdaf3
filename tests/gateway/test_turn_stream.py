"""A streamed answer's shown text: incomplete characters, special tokens, stop strings
and tool-call tags are held back, and what is shown is always where the recorded content
begins."""

from __future__ import annotations

from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.tool_calls import parse_tool_calls
from rollway.gateway.render.turn_stream import TurnText


def shown(renderer: ChatRenderer, text: str, stop: list[str], tools: bool) -> list[str]:
    """What TurnText shows after each token of ``text``, fed one id at a time."""
    specials = frozenset(renderer.tokenizer.all_special_ids)
    turn_text = TurnText(renderer, stop, tools, specials)
    return [turn_text.push([i]) for i in renderer.encode(text)]


def test_multibyte_characters_are_shown_only_once_complete(renderer: ChatRenderer) -> None:
    text = "héllo 世界 🎉 done"
    deltas = shown(renderer, text, [], tools=False)
    assert len(renderer.encode("🎉")) > 1  # the emoji spans tokens: a held piece is tested
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)


def test_a_special_token_is_never_shown_at_the_end_or_inside_the_answer(
    renderer: ChatRenderer,
) -> None:
    eos = renderer.tokenizer.eos_token_id
    specials = frozenset(renderer.tokenizer.all_special_ids)
    turn_text = TurnText(renderer, [], False, specials)
    ids = renderer.encode("Hi there")
    assert turn_text.push([*ids, eos]) == "Hi there"
    more = turn_text.push(renderer.encode(" again"))
    assert more == " again"  # not the special token's text: it is not text


def test_text_that_may_begin_a_stop_string_waits_and_the_stop_is_never_shown(
    renderer: ChatRenderer,
) -> None:
    text = "one two three STOP four"
    deltas = shown(renderer, text, ["STOP"], tools=False)
    assert "".join(deltas) == "one two three "
    # " ST" could have begun the stop: no delta ends with a prefix of it.
    assert not any(d.endswith(("S", "ST", "STO")) for d in deltas)
    partial = shown(renderer, "one STAR two", ["STOP"], tools=False)
    assert "".join(partial) == "one STAR two"  # a false start is shown once it is one


def test_with_tools_content_stops_where_a_call_begins_and_adds_up_to_the_parse(
    renderer: ChatRenderer,
) -> None:
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
    text = f"Let me add.\n{call}"
    deltas = shown(renderer, text, [], tools=True)
    joined = "".join(deltas)
    assert joined == "Let me add."
    assert parse_tool_calls(text).content.startswith(joined)
    assert not any("<" in d for d in deltas)


def test_with_tools_leading_whitespace_goes_out_with_the_text_after_it(
    renderer: ChatRenderer,
) -> None:
    # The parse keeps what starts the answer whether or not a call follows; only whitespace
    # with nothing after it yet (it may end up before a call, and be trimmed) waits.
    assert "".join(shown(renderer, "\n  hello", [], tools=True)) == "\n  hello"
    assert "".join(shown(renderer, "\n  hello", [], tools=False)) == "\n  hello"
    call = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    assert "".join(shown(renderer, f"\n  {call}", [], tools=True)) == ""
    assert parse_tool_calls(f"\n  hello\n{call}").content == "\n  hello"


async def test_a_stop_string_of_a_replacement_character_leaves_emoji_whole(
    gateway: Gateway,
) -> None:
    # Greedy, the model answers with emoji of three tokens each; their first tokens decode to
    # U+FFFD. Matched there, the turn ended after one token, empty and drifting.
    gateway.register("emoji", {"temperature": 0, "max_tokens": 12, "stop": ["\ufffd"]})
    messages = [{"role": "user", "content": "Reply with only an emoji: \U0001f600"}]
    result = await gateway.chat("emoji", {"messages": messages})
    assert (result.finish_reason, result.completion_tokens) == ("length", 12)
    assert result.message["content"] and "\ufffd" not in result.message["content"]
    trajectory = await gateway.trajectory("emoji")
    assert trajectory.turns[0].content == result.message["content"]
    assert trajectory.drift is not None and trajectory.drift.differing_tokens == 0
