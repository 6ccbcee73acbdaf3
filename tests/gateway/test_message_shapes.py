"""New messages rendered by their shape: used where the template writes contents as given,
refused where it trims, drops or looks at them."""

from __future__ import annotations

from typing import Any

from jinja2 import Environment

from rollway.gateway.render.message_shapes import MessageShapes


def tail_of(source: str) -> Any:
    template = Environment().from_string(source)
    return lambda messages: template.render(messages=messages)


AS_GIVEN = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}<a>"
TOOL = {"role": "tool", "tool_call_id": "c1", "content": " 42\n"}


def test_a_shape_renders_as_the_template_does_and_is_rendered_once() -> None:
    calls = []
    template = tail_of(AS_GIVEN)

    def tail(messages: list[dict[str, Any]]) -> str:
        calls.append(messages)
        return str(template(messages))

    shapes = MessageShapes(tail)
    messages = [TOOL, {"role": "user", "content": "{{ x }}"}]
    assert shapes.render(messages) == template(messages)
    rendered = len(calls)
    again = [TOOL | {"content": "7", "tool_call_id": "c2"}, {"role": "user", "content": "b"}]
    assert shapes.render(again) == template(again)
    assert len(calls) == rendered  # the second is filled in, not rendered


def test_templates_that_change_or_drop_contents_are_refused() -> None:
    for source in (
        "{% for m in messages %}{{ m.content | trim }}{% endfor %}",
        "{% for m in messages %}{{ m.content if m.content else '-' }}{% endfor %}",
        "{% for m in messages %}{{ m.content | e }}{% endfor %}",
        "{% for m in messages %}{{ m.role }}{% endfor %}",
        "{% for m in messages %}{{ m.content }}{{ m.content }}{% endfor %}",
    ):
        assert MessageShapes(tail_of(source)).render([TOOL]) is None, source


def test_messages_with_other_fields_or_placeholder_text_are_not_shaped() -> None:
    shapes = MessageShapes(tail_of(AS_GIVEN))
    assert shapes.render([TOOL | {"name": "add"}]) is None
    assert shapes.render([{"role": "assistant", "content": "x"}]) is None
    assert shapes.render([{"role": "user", "content": "rollwayslot0x"}]) is None
