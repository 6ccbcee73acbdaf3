"""Rewards that need the environment: a program agent's sandbox lent to its reward before
teardown (``@uses_environment``), with real programs in real sandboxes (local and namespace)
and the scripted engine writing the code: the example's tests run in the sandbox, retries get
the same sandbox, a reward's command is bounded by the sandbox and the reward's timeout, the
sandbox is gone after, and what cannot have an environment says so before anything runs."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from examples.code_tests.reward import passing_tests

from rollway import ConfigError, RolloutEnvironment, Rubric, uses_environment
from rollway.agents import AgentLoop, RolloutContext
from rollway.agents.program import ProgramAgent
from rollway.client import RolloutClient
from rollway.client.rescore import rescore
from rollway.engines.scripted import ScriptedEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult, RolloutRecord
from rollway.sandbox import LocalSandbox, NamespaceSandbox, Sandbox, SandboxLimits
from rollway.store import FileStore
from rollway.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[2]
AGENT = [sys.executable, str(ROOT / "examples" / "code_tests" / "agent.py")]
TASKS = [
    json.loads(line) for line in (ROOT / "examples/code_tests/tasks.jsonl").read_text().splitlines()
]
ADD = next(task for task in TASKS if task["task_id"] == "add")
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a * b if a else b\n```"  # passes 1 of 3
SANDBOXES = [LocalSandbox, NamespaceSandbox]


def run(
    renderer: ChatRenderer,
    tmp_path: Path,
    replies: list[str],
    reward: Any,
    *,
    sandbox: type[Sandbox] = LocalSandbox,
    tasks: list[dict[str, Any]] | None = None,
    **options: Any,
) -> list[RolloutRecord]:
    engine = ScriptedEngine(replies, renderer.tokenizer)
    gateway = Gateway(engine, renderer, model_name="smol")
    agent = ProgramAgent(AGENT, sandbox=sandbox)
    with RolloutClient(agent, gateway, store=str(tmp_path), reward=reward, **options) as client:
        return [item.result for item in client.run_batch(tasks or [ADD] * len(replies))]


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_the_examples_tests_run_in_the_programs_sandbox_and_score_it(
    renderer: ChatRenderer, tmp_path: Path, sandbox: type[Sandbox]
) -> None:
    # One at a time: the scripted engine answers in call order, and two programs race for it.
    right, wrong = run(
        renderer, tmp_path, [RIGHT, WRONG], passing_tests, sandbox=sandbox, max_concurrent=1
    )
    assert right.status == "completed", right.reason
    assert (right.reward, right.reward_components) == (1.0, {"passed": 3.0})
    assert (wrong.reward, wrong.reward_components) == (pytest.approx(1 / 3), {"passed": 1.0})
    assert right.cleanup_errors == [] and wrong.cleanup_errors == []


def test_the_reward_sees_the_folder_the_program_left_and_it_is_gone_after(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    seen: list[tuple[Path, str]] = []

    @uses_environment
    def read_solution(
        task: dict[str, Any], trajectory: Trajectory, environment: RolloutEnvironment
    ) -> float:  # sync: runs on a worker thread, so its commands go through run_sync
        ran = environment.run_sync(["cat", "solution.py"])
        seen.append((environment.workdir, ran.stdout))
        return float((environment.workdir / "solution.py").read_text() == ran.stdout)

    (record,) = run(renderer, tmp_path, [RIGHT], read_solution)
    assert record.reward == 1.0, record.reason
    ((workdir, solution),) = seen
    assert solution == "def add(a, b):\n    return a + b\n"
    assert not workdir.exists()  # torn down once scored


def test_a_retried_reward_gets_the_same_sandbox_on_each_try(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    tries: list[Path] = []

    @uses_environment
    async def flaky(
        task: dict[str, Any], trajectory: Trajectory, environment: RolloutEnvironment
    ) -> dict[str, Any]:
        tries.append(environment.workdir)
        if len(tries) == 1:
            raise RuntimeError("the grader's first try fails")
        return await passing_tests(task, trajectory, environment)

    (record,) = run(renderer, tmp_path, [RIGHT], flaky, limits={"reward_retries": 2})
    assert record.reward == 1.0, record.reason
    assert len(tries) == 2 and tries[0] == tries[1]
    assert "the grader's first try fails" in record.reward_info["tries"][0]["error"]


def test_a_rubric_gives_the_environment_to_its_functions_that_use_it(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    def brief(task: dict[str, Any], trajectory: Trajectory) -> float:
        return float(len(trajectory.turns[-1].content or "") < 200)

    rubric = Rubric({"tests": passing_tests, "brief": brief}, {"brief": 0.1})
    (record,) = run(renderer, tmp_path, [RIGHT], rubric)
    assert record.reward == pytest.approx(1.1), record.reason
    assert record.reward_components == {"tests": 1.0, "tests.passed": 3.0, "brief": 1.0}


def test_a_rewards_command_is_bounded_by_the_sandbox_and_by_the_rewards_timeout(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    results: list[Any] = []

    @uses_environment
    async def sleeper(
        task: dict[str, Any], trajectory: Trajectory, environment: RolloutEnvironment
    ) -> float:
        results.append(await environment.run(["sleep", "30"], timeout_s=0.5))
        await environment.run(["sleep", "30"])  # the reward's own timeout ends it
        return 1.0

    started = time.monotonic()
    (record,) = run(renderer, tmp_path, [RIGHT], sleeper, limits={"reward_timeout": 2.0})
    assert time.monotonic() - started < 20
    assert results[0].timed_out and results[0].wall_s < 5
    assert (record.status, record.error_kind) == ("error", "reward")
    assert "timed out after 2 s" in (record.reason or "")
    assert record.trajectory is not None  # kept: the record is whole but for its reward


def test_a_reward_that_uses_the_environment_needs_an_agent_that_lends_one(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    class InProcess(AgentLoop):
        name = "in-process"

        async def run(self, ctx: RolloutContext) -> AgentResult:
            return ctx.complete([])

    gateway = Gateway(ScriptedEngine([], renderer.tokenizer), renderer, model_name="smol")
    with pytest.raises(ConfigError, match="does not lend: run a program agent"):
        RolloutClient(InProcess(), gateway, store=str(tmp_path), reward=passing_tests)


def test_rescoring_with_a_reward_that_uses_the_environment_is_refused(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    (record,) = run(renderer, tmp_path, [RIGHT], passing_tests)
    store = FileStore(tmp_path, record.exp_id)
    with pytest.raises(ConfigError, match="cannot be rescored"):
        rescore(store, passing_tests)
    assert store.get(record.rollout_key) == record  # untouched


def test_a_sandbox_runs_further_commands_in_its_folder_under_its_limits() -> None:
    async def scenario() -> tuple[Any, Any, Any]:
        async with LocalSandbox(SandboxLimits(wall_timeout_s=1.0)) as box:
            await box.start(["sh", "-c", "echo hi > left.txt"], {"PATH": "/usr/bin:/bin"})
            await box.wait()
            read = await box.run(["cat", "left.txt"], {"PATH": "/usr/bin:/bin"})
            slow = await box.run(["sleep", "30"], {"PATH": "/usr/bin:/bin"}, timeout_s=60)
            again = await box.run(["true"], {"PATH": "/usr/bin:/bin"})
        return read, slow, again

    read, slow, again = asyncio.run(scenario())
    assert read.stdout == "hi\n" and read.exit_code == 0
    assert slow.timed_out and slow.wall_s < 5  # the sandbox's 1 s, not the 60 asked
    assert again.exit_code == 0 and not again.timed_out


def test_a_sync_try_that_timed_out_leaves_the_sandbox_to_the_next_try(
    renderer: ChatRenderer, tmp_path: Path
) -> None:
    """Its thread cannot be stopped, but its command is ended: the next try runs at once."""
    tries: list[float] = []

    @uses_environment
    def slow_then_quick(
        task: dict[str, Any], trajectory: Trajectory, environment: RolloutEnvironment
    ) -> float:
        tries.append(time.monotonic())
        command = ["sleep", "60"] if len(tries) == 1 else ["true"]
        return float(environment.run_sync(command).exit_code == 0)

    started = time.monotonic()
    limits = {"reward_timeout": 2.0, "reward_retries": 1}
    (record,) = run(renderer, tmp_path, [RIGHT], slow_then_quick, limits=limits)
    assert record.reward == 1.0, record.reason
    assert "timed out after 2 s" in record.reward_info["tries"][0]["error"]
    assert time.monotonic() - started < 30  # not the first command's 60 s
