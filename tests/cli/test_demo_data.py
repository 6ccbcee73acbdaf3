"""``rollway demo`` sends the add tool and few-shot prefix that the tests (tests/tool_calls.py)
show make the embedded model call tools: a change to either is made to both."""

from __future__ import annotations

from rollway.cli import demo_command
from tests.tool_calls import ADD_TOOL, FEW_SHOT, tool_call


def test_the_demo_sends_the_tool_and_few_shot_the_tests_show_to_work() -> None:
    assert demo_command.ADD_TOOL == ADD_TOOL
    assert demo_command.FEW_SHOT == FEW_SHOT
    assert demo_command.tool_call("c", 1, 2) == tool_call("c", 1, 2)
