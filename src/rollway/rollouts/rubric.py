"""A reward made of named functions with weights: each function scores one thing (the format,
the answer, the length), its value is kept as a component of the reward (``reward_info``,
summaries, the export's ``reward/<name>`` columns), and the reward is their weighted sum unless
the rubric combines them otherwise."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from typing import Any

from rollway.checks import is_number
from rollway.errors import ConfigError, RewardError
from rollway.results import RESERVED_INFO
from rollway.rollouts.rewards import RewardFn, as_reward, call, reward_identity
from rollway.sandbox.environment import MARK, RolloutEnvironment, needs_environment
from rollway.trajectory import Trajectory

#: Makes the reward of a rollout from its components (by name).
Combine = Callable[[Mapping[str, float]], float]


class Rubric:
    """A reward function made of ``functions`` (name -> function, each sync or async and
    returning a float, or a dict like any reward function's, whose ``reward`` is the component
    and whose other numbers are kept as ``<name>.<key>``), run concurrently. The reward is
    ``combine(components)`` when given, else the sum of each component times its weight
    (``weights``, by name; 1.0 where none is given). What it returns is a reward dict:
    ``{"reward": total, **components}``. A function marked ``@uses_environment`` gets the
    rollout's environment third (and the rubric then uses the environment)."""

    def __init__(
        self,
        functions: Mapping[str, RewardFn],
        weights: Mapping[str, float] | None = None,
        *,
        combine: Combine | None = None,
    ) -> None:
        self.functions = dict(functions)
        self.weights = {name: 1.0 for name in self.functions} | dict(weights or {})
        self.combine = combine
        _check(self.functions, self.weights)
        # Its functions that use the rollout's environment get it: the rubric asks for it.
        setattr(self, MARK, any(needs_environment(fn) for fn in self.functions.values()))

    async def __call__(
        self,
        task: dict[str, Any],
        trajectory: Trajectory,
        environment: RolloutEnvironment | None = None,
    ) -> dict[str, Any]:
        names = list(self.functions)
        values = await asyncio.gather(
            *(call(self.functions[name], task, trajectory, environment) for name in names)
        )
        components: dict[str, Any] = {}
        for name, value in zip(names, values, strict=True):
            try:
                component, extras = as_reward(value)
            except RewardError as exc:
                raise RewardError(f"rubric function {name!r}: {exc}") from None
            components[name] = component
            components |= {f"{name}.{k}": v for k, v in extras.items() if is_number(v)}
        return {"reward": self._total(components), **components}

    def identity(self) -> str:
        """The rubric by its functions and weights, as a fingerprint and a rescore name it."""
        parts = [f"{n}={reward_identity(f)}*{self.weights[n]:g}" for n, f in self.functions.items()]
        combined = "" if self.combine is None else f"; combine={reward_identity(self.combine)}"
        return f"rubric({', '.join(parts)}{combined})"

    def _total(self, components: Mapping[str, float]) -> float:
        if self.combine is not None:
            try:
                return float(self.combine({n: components[n] for n in self.functions}))
            except Exception as exc:
                raise RewardError(f"rubric combine raised {type(exc).__name__}: {exc}") from exc
        return sum(components[name] * self.weights[name] for name in self.functions)


def _check(functions: Mapping[str, RewardFn], weights: Mapping[str, float]) -> None:
    if not functions:
        raise ConfigError("a Rubric needs at least one function", "functions")
    for name, fn in functions.items():
        if not isinstance(name, str) or not name or name in RESERVED_INFO or "." in name:
            raise ConfigError(
                f"rubric function name {name!r}: use a non-empty name without '.', other than "
                f"{', '.join(sorted(RESERVED_INFO))}",
                "functions",
            )
        if not callable(fn):
            raise ConfigError(f"rubric function {name!r} is not callable", "functions")
    for name, weight in weights.items():
        if name not in functions:
            raise ConfigError(f"weight for {name!r}, which is no rubric function", "weights")
        if not (is_number(weight) and math.isfinite(weight)):
            raise ConfigError(f"weight for {name!r} must be a finite number", "weights")
