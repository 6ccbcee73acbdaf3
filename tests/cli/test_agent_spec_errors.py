"""Where an agent spec goes wrong, the error says what is wrong with it: a class name the file
does not have (with the names it has), an agent server URL without its key."""

from __future__ import annotations

import os
from pathlib import Path

from tests.cli.test_run_failures import AGENT_SOURCE, assert_one_error, rollway


def test_validate_a_name_the_file_lacks_says_it_does_not_exist_and_lists_its_agents(
    tmp_path: Path,
) -> None:
    (tmp_path / "echo.py").write_text(AGENT_SOURCE + "\n\nclass NotAnAgent:\n    pass\n")
    missing = rollway("validate", "echo.py:Nope", cwd=tmp_path)
    assert_one_error(missing, "'Nope' in 'echo.py' does not exist; its AgentLoop classes: Echo")
    other = rollway("validate", "echo.py:NotAnAgent", cwd=tmp_path)
    assert_one_error(other, "'NotAnAgent' in 'echo.py' is not an AgentLoop subclass; its")


def test_a_run_on_an_agent_server_without_its_key_says_the_key_is_missing(tmp_path: Path) -> None:
    (tmp_path / "tasks.jsonl").write_text('{"question": "q"}\n')
    env = {k: v for k, v in os.environ.items() if k != "ROLLWAY_AGENT_KEY"}
    ran = rollway("run", "http://127.0.0.1:9", "--tasks", "tasks.jsonl", "--engine", "sim",
                  cwd=tmp_path, env=env)  # fmt: skip
    hint = assert_one_error(ran, "agent server http://127.0.0.1:9 needs its key")
    assert "ROLLWAY_AGENT_KEY" in hint and "Bearer" not in ran.stderr
