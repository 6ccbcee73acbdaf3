"""What a ``RolloutClient`` is built from, checked and typed in one place before anything
starts: a bad value is named at construction, not met as a hang or a failed rollout later."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollway import tracing
from rollway.agents.base import AgentLoop
from rollway.agents.server.remote_agent import PollPolicy, resolve_agent
from rollway.checks import check_count, check_seconds, is_number
from rollway.errors import ConfigError
from rollway.generation import SamplingParams
from rollway.ids import check_exp_id, id_from
from rollway.retry import RetryPolicy
from rollway.rollouts import RolloutConfig, RolloutLimits, ServingConfig
from rollway.rollouts.config import config_object


def check_pacing(
    max_concurrent: int,
    tps_limit: float | None,
    status_interval: float,
    stuck_after_s: float | None,
) -> None:
    """Refuse a cap, rate, status interval or stuck time that would hang or spin a batch."""
    check_count("max_concurrent", max_concurrent, least=1)
    if tps_limit is not None and not (is_number(tps_limit) and 0 < tps_limit < math.inf):
        raise ConfigError("tps_limit must be None or a positive number", "tps_limit")
    check_seconds("status_interval", status_interval)
    if stuck_after_s is not None:
        check_seconds("stuck_after_s", stuck_after_s, zero=True)


@dataclass(frozen=True)
class ClientConfig:
    """The agent, the experiment id, the settings every rollout runs with, and how the client
    serves agent servers."""

    agent: AgentLoop
    exp_id: str
    settings: RolloutConfig
    serving: ServingConfig

    @classmethod
    def build(
        cls,
        agent: AgentLoop | type[AgentLoop] | str,
        exp_id: str | None,
        *,
        agent_key: str | None,
        poll: PollPolicy | None,
        trace: bool,
        serving: ServingConfig | Mapping[str, Any] | None,
        sampling: SamplingParams | Mapping[str, Any] | None,
        limits: RolloutLimits | Mapping[str, Any] | None,
        retry: RetryPolicy | Mapping[str, Any] | None,
        debug: bool,
        options: Mapping[str, Any],
    ) -> ClientConfig:
        """From ``RolloutClient``'s arguments: config objects or mappings of their fields,
        plus keyword options (``RolloutConfig.build`` says how they combine)."""
        served = config_object(ServingConfig, serving, "serving")
        tracing.enable_if(trace)
        ready = resolve_agent(agent, agent_key, poll)
        # Rollout ids and the store's folder start with it: a bad one fails here, not later.
        exp = check_exp_id(exp_id) if exp_id else id_from(ready.name)
        # Checked and typed once, here: a typo fails now, not in every rollout.
        settings = RolloutConfig.build(
            exp, sampling=sampling, limits=limits, retry=retry, debug=debug, options=options
        )
        return cls(ready, exp, settings, served or ServingConfig())
