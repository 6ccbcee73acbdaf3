"""What made a rollout's outcome: the fingerprint stored with its record. Resume returns a
stored record only when its fingerprint is the batch's, so a training loop never gets
rollouts of older weights, and a rerun with other settings never gets the old outcomes.

A fingerprint holds what changes an outcome: the client's policy (weights) version, the
served model, the agent (its class, a program's command, an agent server's URL), the reward
function (by name; a rubric by its functions and weights), the fixed sampling fields and the
limits (turns, tokens, timeouts). Not in it: the retry policy (resume reruns retried failures
anyway) and the reward's retries (how hard a grader is tried, not what it scores), debug
output, the executor and the pacing (concurrency, rate), which change how fast rollouts run,
not what they sample."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping
from typing import Any

import orjson

from rollway.agents.base import AgentLoop
from rollway.agents.program import ProgramAgent
from rollway.agents.server.remote_agent import RemoteAgent
from rollway.rollouts import RolloutConfig
from rollway.rollouts.rewards import RewardFn, reward_identity

#: Why a stored record without a fingerprint runs again.
NO_FINGERPRINT = "no fingerprint (recorded by an older rollway)"


def fingerprint(
    *,
    agent: AgentLoop,
    model: str,
    reward: RewardFn | None,
    settings: RolloutConfig,
    policy_version: int | None,
) -> dict[str, Any]:
    """The fingerprint of rollouts run now with these settings, as the store gives it back
    (JSON: tuples as lists), so a stored one compares equal."""
    made = {
        "policy_version": policy_version,
        "model": model,
        "agent": agent_identity(agent),
        "reward": None if reward is None else reward_identity(reward),
        "sampling": settings.fixed_sampling(),
        "limits": _limits(settings),
    }
    loaded: dict[str, Any] = orjson.loads(orjson.dumps(made))
    return loaded


def _limits(settings: RolloutConfig) -> dict[str, Any]:
    """The limits that change an outcome: all but ``reward_retries``, which also keeps the
    fingerprints of records made before it existed."""
    limits = dataclasses.asdict(settings.limits)
    del limits["reward_retries"]
    return limits


def difference(stored: Mapping[str, Any] | None, now: Mapping[str, Any]) -> str | None:
    """Why a record with the ``stored`` fingerprint is not one this batch would make (None: it
    is), in words that count well: the same for every record of an earlier run."""
    if stored is None:
        return NO_FINGERPRINT
    then, current = stored.get("policy_version"), now.get("policy_version")
    if then != current:
        return f"sampled by policy version {then} (now {current})"
    changed = [
        f"{name} {_shown(stored, name)} (now {_shown(now, name)})"
        for name in _leaves(stored, now)
        if name != "policy_version" and _at(stored, name) != _at(now, name)
    ]
    return f"settings changed: {', '.join(changed)}" if changed else None


def agent_identity(agent: AgentLoop) -> str:
    """The agent as a run's config and a fingerprint name it."""
    if isinstance(agent, RemoteAgent):
        return agent.url
    if isinstance(agent, ProgramAgent):
        return f"program: {shlex.join(agent.command)}"
    return f"{type(agent).__module__}:{type(agent).__qualname__}"


def _leaves(*fingerprints: Mapping[str, Any]) -> list[str]:
    """Every field's dotted name (``limits.timeout``), over both, in a stable order."""
    names: dict[str, None] = {}
    for prints in fingerprints:
        for key, value in prints.items():
            if isinstance(value, Mapping):
                names.update({f"{key}.{inner}": None for inner in value})
            else:
                names[key] = None
    return sorted(names)


def _at(prints: Mapping[str, Any], name: str) -> Any:
    value: Any = prints
    for part in name.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def _shown(prints: Mapping[str, Any], name: str) -> str:
    value = _at(prints, name)
    return "unset" if value is None else orjson.dumps(value).decode()
