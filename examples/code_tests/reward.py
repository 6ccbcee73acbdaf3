"""A reward that needs the environment: the task's tests, run against the ``solution.py`` the
program agent (``agent.py``) left in its sandbox, in that same sandbox and under its limits,
before the sandbox is torn down. ``@uses_environment`` asks for it: the reward is called with
the rollout's ``RolloutEnvironment`` third. Each test is an expression, checked on its own (one
that raises fails alone); the reward is the share that pass, and ``passed`` is a component.

    rollway run --cmd "python examples/code_tests/agent.py" \
        --tasks examples/code_tests/tasks.jsonl --reward examples/code_tests/reward.py:passing_tests
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rollway import RolloutEnvironment, uses_environment
from rollway.trajectory import Trajectory

#: Runs in the sandbox: imports solution.py from the working folder, checks each test (stdin,
#: JSON), prints how many passed. A solution that does not import passes none.
CHECK = """
import json, sys
tests = json.load(sys.stdin)
try:
    import solution
except BaseException as exc:
    print(json.dumps({"passed": 0, "error": f"{type(exc).__name__}: {exc}"}))
    sys.exit(0)
passed = 0
for test in tests:
    try:
        passed += eval(test, vars(solution)) is True
    except BaseException:
        pass
print(json.dumps({"passed": passed}))
"""
#: Seconds the tests may take (the sandbox's own wall clock bounds them too).
TIMEOUT_S = 10.0


@uses_environment
async def passing_tests(
    task: dict[str, Any], trajectory: Trajectory, environment: RolloutEnvironment
) -> dict[str, Any]:
    """The share of ``task["tests"]`` that pass against the program's ``solution.py``."""
    tests = list(task["tests"])
    ran = await environment.run(
        [sys.executable, "-c", CHECK], stdin=json.dumps(tests).encode(), timeout_s=TIMEOUT_S
    )
    passed = _passed(ran.stdout) if not ran.timed_out and ran.exit_code == 0 else None
    if passed is None:  # the checker did not finish (a solution that hangs on import, say)
        return {"reward": 0.0, "passed": 0, "checker": (ran.stderr or ran.stdout)[-500:]}
    passed = min(passed, len(tests))
    return {"reward": passed / len(tests), "passed": passed}


def _passed(stdout: str) -> int | None:
    """The checker's count, from its last line (None: the solution ended it early)."""
    try:
        return int(json.loads(stdout.strip().splitlines()[-1])["passed"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None
