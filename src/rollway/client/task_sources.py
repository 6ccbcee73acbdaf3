"""Where tasks come from, read one way wherever tasks are given (``rollway run --tasks``,
``RolloutClient.run_batch``, ``RolloutClient.step_source``): rows as they are (a list, a
generator, a ``datasets`` split), a task source's spec (``reasoning-gym:NAME?...``), or a JSONL
file of task objects."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from rollway.client.reasoning_gym_source import SCHEME as REASONING_GYM
from rollway.client.reasoning_gym_source import reasoning_gym_tasks
from rollway.errors import ConfigError

#: What may be given as tasks.
Tasks = Iterable[dict[str, Any]] | str | os.PathLike[str]
#: Each task source, by the prefix of its spec.
TASK_SOURCES: dict[str, Callable[[str], list[dict[str, Any]]]] = {
    REASONING_GYM: reasoning_gym_tasks,
}


def read_tasks(tasks: Tasks) -> Iterable[dict[str, Any]]:
    """The rows ``tasks`` gives: rows as they are; a source's spec, its rows; any other text
    or path, the JSONL file there. A ``ConfigError`` (param ``tasks``) says what is wrong."""
    if not isinstance(tasks, str | os.PathLike):
        return tasks
    text = os.fspath(tasks)
    for prefix, source in TASK_SOURCES.items():
        if text.startswith(prefix):
            return source(text)
    return _jsonl_tasks(Path(text))


def tasks_name(tasks: Tasks) -> str:
    """What the tasks are called in a default experiment id: a file's stem, a source's
    dataset name (``reasoning-gym:leg_counting?size=9`` is ``leg_counting``)."""
    if not isinstance(tasks, str | os.PathLike):
        return "tasks"
    text = os.fspath(tasks)
    for prefix in TASK_SOURCES:
        if text.startswith(prefix):
            return text.removeprefix(prefix).partition("?")[0]
    return Path(text).stem


def _jsonl_tasks(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        sources = ", ".join(f"{prefix}NAME" for prefix in TASK_SOURCES)
        raise ConfigError(f"no task file {path} (or a task source: {sources})", param="tasks")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not JSON: {exc}", param="tasks") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: a task must be a JSON object", param="tasks")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path} holds no tasks", param="tasks")
    return rows
