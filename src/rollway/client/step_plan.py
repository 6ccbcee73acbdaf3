"""A step source's settings (``client.step_source``), each checked before anything starts."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from rollway.checks import check_count, is_number
from rollway.client.step_groups import STALE_POLICIES, UNSCORED, StalePolicy, Unscored
from rollway.errors import ConfigError
from rollway.rollouts import RolloutConfig


@dataclass(frozen=True)
class StepPlan:
    group_size: int
    groups_per_step: int
    over_sample: float
    dynamic_sampling: bool
    max_extra_groups: int
    max_refills: int
    max_staleness: int | None
    stale: StalePolicy
    unscored: Unscored
    prefetch: bool
    settings: RolloutConfig

    @property
    def cap(self) -> int:
        """Groups kept going at once (in flight or ready)."""
        return math.ceil(self.groups_per_step * (1 + self.over_sample))


def step_plan(
    client_staleness: int | None,
    *,
    group_size: int,
    groups_per_step: int,
    over_sample: float,
    dynamic_sampling: bool,
    max_extra_groups: int | None,
    max_refills: int,
    max_staleness: int | None,
    stale: str,
    prefetch: bool,
    settings: RolloutConfig,
    unscored: str = "refill",
) -> StepPlan:
    """The plan, or a ``ConfigError`` naming the setting and the fix. ``client_staleness``:
    the client's own ``max_staleness`` (the default, and it restarts running rollouts)."""
    check_count("group_size", group_size, least=1)
    check_count("groups_per_step", groups_per_step, least=1)
    if not is_number(over_sample) or not 0 <= over_sample < math.inf:
        raise ConfigError("over_sample must be a finite number >= 0 (0.5: 50% more groups)",
                          "over_sample")  # fmt: skip
    check_count("max_extra_groups", max_extra_groups, least=0, optional=True)
    check_count("max_refills", max_refills, least=0)
    check_count("max_staleness", max_staleness, least=0, optional=True)
    if stale not in STALE_POLICIES:
        raise ConfigError(f"stale must be one of {', '.join(STALE_POLICIES)}, not {stale!r}",
                          "stale")  # fmt: skip
    if unscored not in UNSCORED:
        raise ConfigError(
            f"unscored must be one of {', '.join(UNSCORED)}, not {unscored!r}", "unscored"
        )
    if stale == "keep" and client_staleness is not None:
        raise ConfigError(
            f"stale='keep' keeps stale tokens, but this client restarts rollouts more than "
            f"{client_staleness} versions behind: make the client without max_staleness",
            "stale",
        )
    return StepPlan(
        group_size=group_size,
        groups_per_step=groups_per_step,
        over_sample=float(over_sample),
        dynamic_sampling=bool(dynamic_sampling),
        max_extra_groups=groups_per_step if max_extra_groups is None else max_extra_groups,
        max_refills=max_refills,
        max_staleness=client_staleness if max_staleness is None else max_staleness,
        stale=cast(StalePolicy, stale),
        unscored=cast(Unscored, unscored),
        prefetch=bool(prefetch),
        settings=settings,
    )
