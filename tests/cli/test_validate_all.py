"""`rollway validate` reports every problem in one pass: a file's agents each get their report,
one class without `name` or one `@tool` with an untyped parameter does not stop the others from
being checked, and an agent's tools are checked even where its class has problems. A run still
refuses such a file at once."""

from __future__ import annotations

from pathlib import Path

from rollway.agents import AgentLoop, tool
from rollway.agents.validate import IssueCode, validate
from tests.cli.test_run_failures import assert_one_error, rollway

AGENTS = '''\
from rollway.agents import AgentLoop, tool


@tool
def untyped(a, b: int) -> int:
    """Adds."""
    return a + b


@tool
def fine(x: int) -> int:
    """Fine."""
    return x


class NoName(AgentLoop):
    tools = (fine, untyped)

    async def run(self, ctx):
        return ctx.complete([])


class SyncRun(AgentLoop):
    name = "sync"

    def run(self, ctx):
        return ctx.complete([])


class Good(AgentLoop):
    name = "good"
    tools = (fine,)

    async def run(self, ctx):
        return ctx.complete([])


class Base(AgentLoop):
    """No name and no run: a base for other agents, not one itself."""
'''


def test_every_agent_of_a_file_is_checked_and_every_problem_listed(tmp_path: Path) -> None:
    (tmp_path / "agents.py").write_text(AGENTS)
    ran = rollway("validate", "agents.py", cwd=tmp_path)
    assert ran.returncode == 1, ran.stderr
    assert ran.stdout.splitlines() == [
        "NoName: error MISSING_NAME name: the agent has no non-empty `name`",
        "NoName: error BAD_TOOL_DEFINITION tools[1]: tool 'untyped': parameter 'a' needs a type",
        "SyncRun: error RUN_NOT_ASYNC run: `run` must be `async def run(self, ctx)`",
        "Good: agent 'good' is ready; tools: fine",
    ]
    good = rollway("validate", "agents.py:Good", cwd=tmp_path)
    assert good.returncode == 0 and "ready" in good.stdout, good.stderr
    # Running from that file still fails at once, naming the first mistake.
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "t"}\n')
    failed = rollway("run", "agents.py:Good", "--tasks", "tasks.jsonl", "--engine", "sim",
                     cwd=tmp_path)  # fmt: skip
    assert_one_error(failed, "needs a type")


def test_an_agents_tools_are_checked_even_when_its_run_is_wrong() -> None:
    @tool
    def same(x: int) -> int:
        """One."""
        return x

    class BadRunTwiceNamedTools(AgentLoop):
        name = "bad"
        tools = (same, same)

        def run(self, ctx):  # type: ignore[override]
            return None

    codes = [issue.code for issue in validate(BadRunTwiceNamedTools).issues]
    assert codes == [IssueCode.RUN_NOT_ASYNC, IssueCode.DUPLICATE_TOOL_NAME]
