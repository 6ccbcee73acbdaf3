"""Any program as the agent: a command run in a sandbox, pointed at its rollout's gateway.

The program gets ``OPENAI_BASE_URL``/``OPENAI_API_KEY``/``OPENAI_MODEL`` (and the Anthropic
equivalents) for its rollout, the task as JSON on stdin and in the file named by
``ROLLWAY_TASK_FILE``, and may write a result JSON (``{"reward": ..., "finish_reason": ...}``)
to ``ROLLWAY_RESULT_FILE`` (a regular file of at most ``SandboxLimits.result_bytes``: a link, a
FIFO or a bigger file is an agent error naming it, ``rollway.sandbox.readback``; it is read in
the folder the sandbox made, whatever the program did to its path); otherwise the reward
function scores the recorded conversation. A result file that is there but is not a JSON object
of that shape (``reward`` a finite number or null, ``finish_reason`` a string or null, other
keys ignored) is an agent error saying what is wrong. The record's final messages are the
gateway's recorded conversation, and its metrics count the turns the gateway recorded. A
non-zero exit (a signal's too) is an agent error carrying the tail of stderr; a sandbox whose
supervisor died before the program's exit status was written raises ``InfrastructureError`` from
its ``wait`` (``rollway.sandbox.supervisor_death``): rollway's machinery failed, not the program,
so the rollout is retried and never scored as the policy's. The sandbox is torn down on every
path (success, failure, timeout, cancellation); a teardown that fails is one of the record's
``cleanup_errors`` and leaves the program's outcome as it was. A reward that uses the
environment (``@uses_environment``) gets the sandbox of a program that ended first: lent to it
(``RolloutEnvironment``: the folder, commands run in it) and torn down once it scored. With
tracing on (``rollway.tracing``) it also gets ``TRACEPARENT`` and the ``OTEL_*`` settings.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollway import tracing
from rollway.agents.base import AgentLoop
from rollway.agents.context import RolloutContext
from rollway.checks import is_number
from rollway.errors import AgentError
from rollway.results import AgentResult
from rollway.sandbox.base import Sandbox, SandboxLimits
from rollway.sandbox.environment import RolloutEnvironment, reward_env
from rollway.sandbox.local_sandbox import LocalSandbox

_STDERR_TAIL = 2000


class ProgramAgent(AgentLoop):
    """Runs ``command`` once per rollout."""

    name = "program"
    #: The client serves its gateway over HTTP for agents that say they need it.
    needs_http = True
    lends_environment = True

    def __init__(
        self,
        command: str | Sequence[str] = ("true",),
        *,
        limits: SandboxLimits | None = None,
        env: dict[str, str] | None = None,
        sandbox: Callable[[SandboxLimits], Sandbox] = LocalSandbox,
    ) -> None:
        words = shlex.split(command) if isinstance(command, str) else list(command)
        # The command runs in a fresh working directory: a relative path to a file that
        # exists here (``python examples/agent.py``) must keep naming that file there.
        self.command = [_absolute_if_file(word) for word in words]
        self.limits = limits or SandboxLimits()
        self.env = env or {}
        self.make_sandbox = sandbox

    async def run(self, ctx: RolloutContext) -> AgentResult:
        if ctx.base_url is None or ctx.api_key is None:
            raise AgentError("a program agent needs the client to serve its gateway over HTTP")
        box = self.make_sandbox(self.limits)
        ctx.log_event("create_sandbox", sandbox=type(box).__name__)
        lent = False
        try:
            task_file = box.workdir / "task.json"
            result_file = box.workdir / _RESULT_FILE
            task_json = json.dumps(ctx.task)
            task_file.write_text(task_json)
            await box.start(
                self.command, self._env(ctx, task_file, result_file), task_json.encode()
            )
            ctx.log_event("start_agent", command=self.command)
            outcome = await box.wait()
            ctx.log_event("wait", exit_code=outcome.exit_code, timed_out=outcome.timed_out)
            # In a thread, so that the rollout's timeout holds whatever the file turns out to be.
            written = await asyncio.to_thread(_read_result, box, self.limits.result_bytes)
            if ctx.keep_environment:  # the reward runs in it; the runner tears it down
                ctx.environment = RolloutEnvironment(box, reward_env(box.workdir))
                lent = True
        finally:
            if not lent:
                await _tear_down(box, ctx)
        if outcome.timed_out:
            return ctx.error(f"program exceeded its {self.limits.wall_timeout_s} s wall clock")
        if outcome.exit_code != 0:
            tail = outcome.stderr[-_STDERR_TAIL:].strip()
            return ctx.error(f"program exited with {outcome.exit_code}: {tail}")
        if isinstance(written, AgentError):
            return ctx.error(str(written))
        reward, finish_reason = written.get("reward"), written.get("finish_reason")
        # No messages: the program's conversation is the gateway's, which the record takes.
        return ctx.complete(
            [],
            finish_reason=finish_reason if finish_reason is not None else "stop",
            reward=float(reward) if reward is not None else None,
        )

    def _env(self, ctx: RolloutContext, task_file: Any, result_file: Any) -> dict[str, str]:
        assert ctx.base_url is not None and ctx.api_key is not None
        model = ctx.gateway.model_name
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(task_file.parent),
            "OPENAI_BASE_URL": ctx.base_url,
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_MODEL": model,
            "ANTHROPIC_BASE_URL": ctx.base_url,
            "ANTHROPIC_API_KEY": ctx.api_key,
            "ANTHROPIC_MODEL": model,
            "ROLLWAY_ROLLOUT_ID": ctx.rollout_id,
            "ROLLWAY_TASK_FILE": str(task_file),
            "ROLLWAY_RESULT_FILE": str(result_file),
            **({"ROLLWAY_GATEWAY_SOCKET": ctx.gateway_socket} if ctx.gateway_socket else {}),
            # TRACEPARENT and the OTEL_* settings, when tracing is on: the program may join.
            **tracing.child_env(),
            **self.env,
        }


async def _tear_down(box: Sandbox, ctx: RolloutContext) -> None:
    """Destroy the sandbox on every path; a failure is the record's cleanup error, never the
    program's outcome (the program already ended, well or badly, on its own)."""
    try:
        await box.destroy()
    except Exception as exc:
        ctx.cleanup_failed("teardown", exc)
    else:
        ctx.log_event("teardown")


def _absolute_if_file(word: str) -> str:
    # Not ``resolve()``: a venv's ``bin/python`` is a symlink to the base interpreter, which
    # run by its own path would not see the venv's packages.
    path = Path(word)
    try:
        is_file = not path.is_absolute() and path.is_file()
    except OSError:  # a word no file can be named (longer than NAME_MAX): an argument
        return word
    return os.path.abspath(word) if is_file else word


def _read_result(box: Sandbox, limit: int) -> dict[str, Any] | AgentError:
    """The result the program wrote, {} if none; the error if the file is not one to read
    (``rollway.sandbox.readback``) or not a result (``_parse_result``)."""
    try:
        text = box.read_back(_RESULT_FILE, limit, "result file", "SandboxLimits.result_bytes")
    except AgentError as error:
        return error
    try:
        return _parse_result(text) if text is not None else {}
    except AgentError as error:
        return AgentError(f"the program's result file {box.workdir / _RESULT_FILE} {error}")


def _parse_result(text: bytes) -> dict[str, Any]:
    """A JSON object whose ``reward`` is a finite number or null and whose ``finish_reason``
    is a string or null (other keys are the program's own); an ``AgentError`` saying what is
    wrong otherwise (the caller names the file)."""
    try:
        data = json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise AgentError("is nested too deeply to be a result") from None
    except ValueError as error:  # not UTF-8 either
        raise AgentError(f"is not JSON ({error}): write an object such as {_EXAMPLE}") from None
    if not isinstance(data, dict):
        kind = _JSON_KINDS.get(type(data), "value")
        raise AgentError(f"holds a JSON {kind}, not an object such as {_EXAMPLE}")
    reward, finish_reason = data.get("reward"), data.get("finish_reason")
    if reward is not None and not (is_number(reward) and math.isfinite(reward)):
        raise AgentError(f"has reward {_shown(reward)}: a finite number or null")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise AgentError(f"has finish_reason {_shown(finish_reason)}: a string or null")
    return data


_RESULT_FILE = "result.json"
_EXAMPLE = '{"reward": 1.0, "finish_reason": "stop"}'
_JSON_KINDS: dict[type, str] = {
    list: "list",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
#: Digits of an integer in a result: any such fits a float, and it is far below Python's own
#: limit (4300), whose error would tell the program's author to raise that.
_MAX_DIGITS = 300


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > _MAX_DIGITS:
        raise ValueError(f"an integer of {len(digits.lstrip('-'))} digits, over {_MAX_DIGITS}")
    return int(digits)


def _shown(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:40] + "..."
