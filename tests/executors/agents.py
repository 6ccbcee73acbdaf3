"""Agents for Ray tests. Ray workers import this module by name (they share the driver's
working directory); what they did is appended to a file named in the task, since class
attributes do not cross processes."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from rollway.agents import AgentLoop, RolloutContext
from rollway.results import AgentResult, RolloutRecord
from rollway.store import FileStore


class ProbeAgent(AgentLoop):
    """Waits ``wait`` s (and while the file ``hold`` names exists), asks the model once
    (unless ``chat`` is false), then completes with the task's reward; with ``crash`` its
    worker process dies instead of answering."""

    name = "probe"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        task = ctx.task
        note(task, "start", ctx.rollout_id)
        try:
            await asyncio.sleep(task.get("wait", 0))
            # Another process releases it (the test, by removing the file): no event crosses.
            while held(task):  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if task.get("crash"):
                os._exit(1)  # the whole worker, as a segfault or the OOM killer would
            messages: list[dict[str, Any]] = [{"role": "user", "content": "Say hi."}]
            if task.get("chat", True):
                reply = await ctx.chat(messages)
                messages.append(reply.message)
            return ctx.complete(messages, reward=float(task.get("reward", 1.0)))
        finally:
            note(task, "end", ctx.rollout_id)


def held(task: dict[str, Any]) -> bool:
    return "hold" in task and Path(task["hold"]).exists()


def note(task: dict[str, Any], event: str, rollout_id: str) -> None:
    if "log" in task:
        with Path(task["log"]).open("a") as log:
            log.write(f"{event} {time.time()} {os.getpid()} {rollout_id}\n")


def events(path: Path) -> list[tuple[str, float, int, str]]:
    """(event, time, pid, rollout_id) for every line the agents wrote."""
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines()]
    return [(event, float(at), int(pid), rid) for event, at, pid, rid in rows]


def peak_concurrency(rows: list[tuple[str, float, int, str]]) -> int:
    running = peak = 0
    for event, *_ in sorted(rows, key=lambda row: (row[1], row[0] == "start")):
        running += 1 if event == "start" else -1
        peak = max(peak, running)
    return peak


class DyingStore(FileStore):
    """A folder store whose worker dies right after writing the record of a task marked
    ``die_after_write`` (once: a marker file says it happened), before the driver hears."""

    def write(self, record: RolloutRecord) -> None:
        super().write(record)
        marker = record.task.get("die_after_write")
        if marker and not Path(marker).exists():
            Path(marker).touch()
            os._exit(1)
