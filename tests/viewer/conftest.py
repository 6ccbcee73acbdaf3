"""A real run folder to look at (rollouts on the embedded model through the recording gateway,
debug events kept, plus agent failures), the viewer served on loopback, and headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollway.agents import AgentLoop, RolloutContext
from rollway.agents.folding import ContextFolding, DropToolOutputs, Footprint
from rollway.client import RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult
from rollway.viewer import create_viewer_app, open_run
from rollway.web.background_server import BackgroundServer
from tests.conftest import ADD_TOOL, NO_CHROMIUM, tool_call

EXP_ID = "viewer-run"
FOLDED_ID = "folded-run"
#: A worked example the agent writes before the task: a tool call, its (long) result and an
#: answer, none sampled by the model.
FEW_SHOT: list[dict[str, Any]] = [
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", 3, 4)]},
    {"role": "tool", "tool_call_id": "call_0", "content": "7\n" + "add(3, 4) = 7; " * 30},
    {"role": "assistant", "content": "3 + 4 = 7."},
]
REPORT = "Here is a long report to read before answering: " + "all is well. " * 25


class TwoTurnAgent(AgentLoop):
    """Asks, then always asks again: the second turn's prompt carries template glue (mask 0)
    between the two sampled completions (mask 1). A task with ``fail`` raises at once."""

    name = "two-turn"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        if ctx.task.get("fail"):
            raise RuntimeError(f"no luck with {ctx.task['task_id']}")
        messages: list[dict[str, Any]] = [{"role": "user", "content": ctx.task["q"]}]
        for follow_up in ("Now say it in words.", None):
            reply = await ctx.chat(messages, tools=[ADD_TOOL], max_tokens=8)
            messages.append(reply.message)
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
        return ctx.complete(messages, reward=float("5" in (reply.content or "")))


class FoldingAgent(AgentLoop):
    """A few-shot example, the task, then three turns through context folding whose budget the
    second call fits and the third (after a long report) does not: the third folds the history
    (the example's tool output dropped), so the rollout has two segments."""

    name = "folding"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages: list[dict[str, Any]] = [*FEW_SHOT, {"role": "user", "content": ctx.task["q"]}]
        sent = list(messages)
        reply = await ctx.chat(messages, tools=[ADD_TOOL], max_tokens=8)
        messages += [reply.message, {"role": "user", "content": "Go on."}]
        probe = Footprint()
        probe.observe(sent, reply)
        folding = ContextFolding(probe.estimate(messages), [DropToolOutputs(keep_last=0)], margin=0)
        folding.footprint.observe(sent, reply)
        for follow_up in (REPORT, None):
            reply = await folding.chat(ctx, messages, tools=[ADD_TOOL], max_tokens=8)
            messages.append(reply.message)
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
        assert folding.folds == 1
        return ctx.complete(messages, reward=1.0)


@dataclass(frozen=True)
class RealRun:
    folder: Path
    renderer: ChatRenderer


@pytest.fixture(scope="session")
def real_run(
    engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path_factory: pytest.TempPathFactory
) -> RealRun:
    root = tmp_path_factory.mktemp("runs")
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    tasks = [{"task_id": "add", "q": "What is 2 + 3?"}, {"task_id": "bad", "fail": True}]
    with RolloutClient(TwoTurnAgent, gateway, store=str(root), exp_id=EXP_ID, debug=True,
                       seed=3, max_retry_attempts=1) as client:  # fmt: skip
        items = list(client.run_batch(tasks, group_size=2))
    # The 8-token answers may be cut: truncated then, a success all the same.
    assert sorted(i.result.status for i in items if not i.success) == ["error", "error"]
    assert len(items) == 4
    return RealRun(root / EXP_ID, renderer)


@pytest.fixture(scope="session")
def folded_run(
    engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path_factory: pytest.TempPathFactory
) -> RealRun:
    """One folded rollout (two segments) with few-shot messages, its entropy recorded."""
    root = tmp_path_factory.mktemp("folded")
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    with RolloutClient(FoldingAgent, gateway, store=str(root), exp_id=FOLDED_ID, seed=5,
                       max_retry_attempts=1, record_entropy=True) as client:  # fmt: skip
        (item,) = client.run_batch([{"task_id": "fold", "q": "What is 2 + 3?"}])
    assert item.success, item.error or item.result
    return RealRun(root / FOLDED_ID, renderer)


@pytest.fixture(scope="session")
def viewer_url(real_run: RealRun) -> Iterator[str]:
    with BackgroundServer(create_viewer_app(open_run(str(real_run.folder)))) as url:
        yield url


def _find_chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)


def find_chromium() -> str:
    """Debian's ``chromium``. Missing, the browser tests skip on a developer's machine and fail
    under CI (``CI`` set, as .ci/run sets it after installing the package): there they must run."""
    found = _find_chromium()
    if found is not None:
        return found
    why = NO_CHROMIUM
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI is set, so the browser tests may not skip", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def chromium() -> str:
    return find_chromium()


@dataclass(frozen=True)
class Browser:
    binary: str
    profile: Path

    def _run(self, url: str, *args: str) -> str:
        command = [self.binary, "--headless", "--no-sandbox", "--disable-gpu",
                   "--hide-scrollbars", f"--user-data-dir={self.profile}",
                   # The pages fill in from fetches after load: let them finish first.
                   "--virtual-time-budget=15000", *args, url]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    def dom(self, url: str) -> str:
        """The page's DOM after its scripts ran."""
        return self._run(url, "--dump-dom")

    def screenshot(self, url: str, path: Path, size: tuple[int, int] = (1400, 1000)) -> Path:
        self._run(url, f"--screenshot={path}", f"--window-size={size[0]},{size[1]}")
        return path


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Browser:
    return Browser(chromium, tmp_path / "chromium-profile")
