"""An LLM as judge: a reward function that asks a model, through a rollway gateway, how good a
rollout's answer is. By default it asks the policy's own engine (the gateway the rollout ran
through); given an engine spec, a gateway of its own. Each call is a rollout of its own at the
gateway (``<rollout id>.judge-<n>``, one turn, the judge's sampling): never a turn or a sample
of the policy's trajectory. What each call asked, answered, scored and took is kept in the
record's ``reward_info["judge_calls"]``, by the scoring scope the runner opens around the reward
function (``judging``)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from rollway.errors import ConfigError, JudgeAnswerError, RewardError
from rollway.gateway.core import Gateway
from rollway.gateway.factory import build_gateway
from rollway.gateway.handle import GatewayHandle, LocalGateway
from rollway.gateway.request_schema import RegisterRequest
from rollway.trajectory import Trajectory

#: Asks for a score from 0 to 10 on the answer's last line; ``parse_score`` reads it.
DEFAULT_PROMPT = (
    "Grade the answer to the task below.\n\nTask: {task}\n\nAnswer: {answer}\n\n"
    'Reply with one line "Score: N", N from 0 (wrong) to 10 (right).'
)
#: A judge is asked to be brief and deterministic unless it says otherwise.
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": 128}
#: How much of an answer an error quotes.
EXCERPT_CHARS = 120

_SCORE = re.compile(r"score\s*[:=]?\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def parse_score(answer: str, *, low: float = 0.0, high: float = 10.0) -> float:
    """The last ``Score: N`` in ``answer`` as ``(N - low) / (high - low)``: 0 to 1. A
    ``JudgeAnswerError`` quoting the answer when it has none or N is out of range (the reward's
    retries ask again)."""
    found = _SCORE.findall(answer)
    if not found:
        raise JudgeAnswerError(f"judge answer has no 'Score: N': {excerpt(answer)!r}")
    value = float(found[-1])
    if not low <= value <= high:
        raise JudgeAnswerError(
            f"judge score {value:g} is outside {low:g}..{high:g}: {excerpt(answer)!r}"
        )
    return (value - low) / (high - low)


def excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else f"{text[:EXCERPT_CHARS]}..."


@dataclass
class JudgeScope:
    """Where a judge asks (``gateway``: the policy's; None: only a judge with its own engine
    can) and on whose behalf (``owner``: the rollout scored); ``calls`` collects each call."""

    gateway: GatewayHandle | None
    owner: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    _numbers: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def next_id(self) -> str:
        # Ids stay within the gateway's 200 characters; the number keeps them apart.
        return f"{self.owner[:180]}.judge-{next(self._numbers)}"


_SCOPE: contextvars.ContextVar[JudgeScope | None] = contextvars.ContextVar(
    "rollway_judge_scope", default=None
)


@contextlib.contextmanager
def judging(gateway: GatewayHandle | None, owner: str) -> Iterator[list[dict[str, Any]]]:
    """Judges called inside (in this task and those it starts) ask through ``gateway`` for
    ``owner``; yields the list their calls are noted in."""
    scope = JudgeScope(gateway, owner)
    token = _SCOPE.set(scope)
    try:
        yield scope.calls
    finally:
        _SCOPE.reset(token)


class Judge:
    """A reward function that asks a model to grade the rollout. ``prompt`` is a template:
    ``{task}`` (the task as JSON), ``{answer}`` (the trajectory's last answer), and each task
    field by name (``{question}``; ``{task[answer]}`` for a field named ``answer``). ``parse``
    makes the reward from the judge's answer (``parse_score`` by default: ``Score: N`` of 0 to
    10, as 0 to 1) and raises a ``JudgeAnswerError`` when it cannot. ``engine``: None asks the
    policy's engine, through the rollout's gateway; an engine spec (``embedded``,
    ``vllm://host:port``...), a ``Gateway`` or a gateway handle asks that one (``model``: the
    spec's model folder).
    ``sampling`` (register fields: ``temperature``, ``max_tokens``, ``seed``...) is the
    judge's own, over ``DEFAULT_SAMPLING``; ``system`` an optional system message."""

    def __init__(
        self,
        prompt: str = DEFAULT_PROMPT,
        *,
        parse: Callable[[str], float] = parse_score,
        engine: str | Gateway | GatewayHandle | None = None,
        model: str | None = None,
        sampling: Mapping[str, Any] | None = None,
        system: str | None = None,
        name: str = "judge",
    ) -> None:
        self.prompt, self.parse, self.system, self.name = prompt, parse, system, name
        self.engine, self.model = engine, model
        self.sampling = {**DEFAULT_SAMPLING, **(sampling or {})}
        try:
            RegisterRequest.model_validate(self.sampling)
        except ValidationError as exc:
            raise ConfigError(f"Judge sampling: {exc.errors()[0]['msg']}", "sampling") from None
        self._own: GatewayHandle | None = None
        self._building = threading.Lock()

    def identity(self) -> str:
        """What a fingerprint and a rescore name it by: its engine and parser."""
        engine = self.engine if isinstance(self.engine, str) else "policy"
        parse = getattr(self.parse, "__qualname__", type(self.parse).__qualname__)
        return f"judge({self.name}, engine={engine}, parse={parse})"

    async def __call__(self, task: dict[str, Any], trajectory: Trajectory) -> float:
        scope = _SCOPE.get() or JudgeScope(None, "judge")
        gateway = await self._gateway(scope)
        messages = self.messages(task, trajectory)
        judge_id = scope.next_id()
        note: dict[str, Any] = {"name": self.name, "rollout_id": judge_id, "prompt": messages}
        scope.calls.append(note)
        start = time.monotonic()
        try:
            answer = await self._ask(gateway, judge_id, messages, scope.owner)
        except Exception as exc:
            note["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            note["latency_s"] = round(time.monotonic() - start, 6)
        note["answer"] = answer
        try:
            note["score"] = float(self.parse(answer))
        except RewardError as exc:
            note["error"] = str(exc)
            raise
        return float(note["score"])

    def messages(self, task: dict[str, Any], trajectory: Trajectory) -> list[dict[str, str]]:
        """The judge's chat: the optional system message and the filled-in prompt. A template
        field that is not there is a ``RewardError`` naming it (asking again cannot help)."""
        answer = trajectory.turns[-1].content if trajectory.turns else None
        fields = {**task, "task": _TaskFields(task), "answer": answer or ""}
        try:
            text = self.prompt.format_map(fields)
        except (KeyError, IndexError) as exc:
            raise RewardError(
                f"judge prompt field {{{exc.args[0]}}} is neither the task's nor one of "
                "{task}, {answer}: fix the Judge's prompt template"
            ) from None
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": text}]

    async def _ask(
        self, gateway: GatewayHandle, judge_id: str, messages: list[dict[str, str]], owner: str
    ) -> str:
        register = RegisterRequest(max_turns=1, metadata={"judge_of": owner}, **self.sampling)
        await gateway.register(judge_id, register)
        try:
            result = await gateway.chat(judge_id, {"messages": messages})
        finally:
            await gateway.unregister(judge_id)
        return result.content or ""

    async def _gateway(self, scope: JudgeScope) -> GatewayHandle:
        if self.engine is None:
            if scope.gateway is None:
                raise RewardError(
                    "Judge(engine=None) asks the policy's engine, which only a running client "
                    "gives it (a rollout, client.rescore): give it one, Judge(engine='embedded')"
                )
            return scope.gateway
        if self._own is None:
            # Loading a model takes seconds: off the loop every rollout shares.
            self._own = await asyncio.to_thread(self._build)
        return self._own

    def _build(self) -> GatewayHandle:
        with self._building:  # two first calls at once build one engine
            if self._own is not None:
                return self._own
            if isinstance(self.engine, Gateway):
                return LocalGateway(self.engine)
            if isinstance(self.engine, str):
                built = build_gateway(self.engine, model=self.model, rollout_ttl_s=None)
                return LocalGateway(built)
            assert self.engine is not None
            return self.engine

    async def aclose(self) -> None:
        """Close the engine the judge built for itself (from a spec), if it built one."""
        own, self._own = self._own, None
        if isinstance(own, LocalGateway) and isinstance(self.engine, str):
            await own.gateway.engine.close()


class _TaskFields(dict[str, Any]):
    """The task in a judge's template: JSON as ``{task}``, a field as ``{task[name]}``."""

    def __format__(self, spec: str) -> str:
        return json.dumps(self, default=str)
