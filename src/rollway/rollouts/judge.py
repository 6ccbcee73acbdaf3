"""An LLM as judge: a reward function that asks a model, through a rollway gateway, how good a
rollout's answer is. By default it asks the policy's own engine (the gateway the rollout ran
through); given an engine spec, a gateway of its own. Each call is a rollout of its own at the
gateway (``<rollout id>.judge-<n>``, one turn, the judge's sampling): never a turn or a sample
of the policy's trajectory. What each call asked, answered, scored and took is kept in the
record's ``reward_info["judge_calls"]``, by the scoring scope the runner opens around the reward
function (``judging``). An answer the parser cannot read is asked again with what can change:
a judge at temperature 0 answers the same prompt the same way, so its retries sample at
``retry_temperature``, each with a seed of its own."""

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
from rollway.rollouts.rubric import Rubric
from rollway.trajectory import Trajectory

#: Asks for a score from 0 to 10 on the answer's last line; ``parse_score`` reads it.
DEFAULT_PROMPT = (
    "Grade the answer to the task below.\n\nTask: {task}\n\nAnswer: {answer}\n\n"
    'Reply with one line "Score: N", N from 0 (wrong) to 10 (right).'
)
#: A judge is asked to be brief and deterministic unless it says otherwise.
DEFAULT_SAMPLING: dict[str, Any] = {"temperature": 0.0, "max_tokens": 128}
#: The temperature a greedy judge's retries sample at, after an answer it could not read.
RETRY_TEMPERATURE = 0.7
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
    #: Answers each judge (by ``id``) could not read so far: its next call is a retry.
    unreadable: dict[int, int] = field(default_factory=dict)
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
    judge's own, over ``DEFAULT_SAMPLING``; ``system`` an optional system message.
    ``retry_temperature``: what a judge at temperature 0 samples at when it asks again after
    an answer it could not read (with the seed of the try, which a seeded judge's retries
    change too); None: such an answer fails at once, since asking again would get it again."""

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
        retry_temperature: float | None = RETRY_TEMPERATURE,
    ) -> None:
        self.prompt, self.parse, self.system, self.name = prompt, parse, system, name
        self.engine, self.model = engine, model
        self.retry_temperature = retry_temperature
        self.sampling = {**DEFAULT_SAMPLING, **(sampling or {})}
        try:
            RegisterRequest.model_validate(self.sampling)
            if retry_temperature is not None:
                RegisterRequest.model_validate({"temperature": retry_temperature})
        except ValidationError as exc:
            raise ConfigError(f"Judge sampling: {exc.errors()[0]['msg']}", "sampling") from None
        self._own: GatewayHandle | None = None
        self._building = threading.Lock()

    def identity(self) -> str:
        """What a fingerprint and a rescore name it by: its engine and parser."""
        engine = self.engine if isinstance(self.engine, str) else "policy"
        parse = getattr(self.parse, "__qualname__", type(self.parse).__qualname__)
        return f"judge({self.name}, engine={engine}, parse={parse})"

    @property
    def needs_policy_engine(self) -> bool:
        """It asks the policy's engine, which only a running client lends it."""
        return self.engine is None

    async def __call__(self, task: dict[str, Any], trajectory: Trajectory) -> float:
        scope = _SCOPE.get() or JudgeScope(None, "judge")
        gateway = await self._gateway(scope)
        messages = self.messages(task, trajectory)
        judge_id = scope.next_id()
        retry = scope.unreadable.get(id(self), 0)
        sampling = self.retry_sampling(retry)
        note: dict[str, Any] = {"name": self.name, "rollout_id": judge_id, "prompt": messages}
        if sampling != self.sampling:
            note["sampling"] = {k: v for k, v in sampling.items() if self.sampling.get(k) != v}
        scope.calls.append(note)
        start = time.monotonic()
        try:
            answer = await self._ask(gateway, judge_id, messages, scope.owner, sampling)
        except Exception as exc:
            note["error"] = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            note["latency_s"] = round(time.monotonic() - start, 6)
        note["answer"] = answer
        try:
            note["score"] = float(self.parse(answer))
        except JudgeAnswerError as exc:
            note["error"] = str(exc)
            scope.unreadable[id(self)] = retry + 1
            if self.retry_sampling(retry + 1) == sampling:
                raise RewardError(
                    f"{exc} (not asked again: at temperature 0 with no retry_temperature the "
                    "judge would answer the same; Judge(retry_temperature=0.7) asks again at "
                    "that temperature)"
                ) from exc
            raise
        except RewardError as exc:
            note["error"] = str(exc)
            raise
        return float(note["score"])

    def retry_sampling(self, retry: int) -> dict[str, Any]:
        """The sampling of the ``retry``-th ask after unreadable answers (0: the first ask):
        a greedy judge samples at ``retry_temperature``, and a seed (the judge's own, else 0)
        moves on by one each time, so that the answer can change."""
        if retry == 0:
            return self.sampling
        changed = dict(self.sampling)
        if changed.get("temperature") == 0:
            if self.retry_temperature is None:
                return self.sampling  # greedy: nothing to change
            changed["temperature"] = self.retry_temperature
        changed["seed"] = (self.sampling.get("seed") or 0) + retry
        return changed

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
        self,
        gateway: GatewayHandle,
        judge_id: str,
        messages: list[dict[str, str]],
        owner: str,
        sampling: dict[str, Any],
    ) -> str:
        register = RegisterRequest(max_turns=1, metadata={"judge_of": owner}, **sampling)
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

    @property
    def holds_engine(self) -> bool:
        """It has its engine built (or given) and ready: ``aclose`` closes one it built."""
        return self._own is not None

    async def aclose(self) -> None:
        """Close the engine the judge built for itself (from a spec), if it built one."""
        own, self._own = self._own, None
        if isinstance(own, LocalGateway) and isinstance(self.engine, str):
            await own.gateway.engine.close()


def judges_in(reward_fn: object) -> list[Judge]:
    """The judges ``reward_fn`` is or holds (a ``Rubric``'s functions, rubrics within)."""
    if isinstance(reward_fn, Judge):
        return [reward_fn]
    if isinstance(reward_fn, Rubric):
        return [judge for fn in reward_fn.functions.values() for judge in judges_in(fn)]
    return []


def refuse_without_policy(reward_fn: object) -> None:
    """A ``ConfigError`` when ``reward_fn`` holds a judge of the policy's engine and nothing
    lends it one (a rescore outside a client): every record would fail for it."""
    if any(judge.needs_policy_engine for judge in judges_in(reward_fn)):
        raise ConfigError(
            "the reward holds a Judge with no engine of its own (engine=None), which asks the "
            "policy's engine: only a running client lends it one, and this rescore has none. "
            "Give the judge an engine, Judge(engine='embedded') or 'vllm://host:port', or "
            "rescore with client.rescore() on a client of the policy's engine",
            "reward",
        )


class _TaskFields(dict[str, Any]):
    """The task in a judge's template: JSON as ``{task}``, a field as ``{task[name]}``."""

    def __format__(self, spec: str) -> str:
        return json.dumps(self, default=str)
