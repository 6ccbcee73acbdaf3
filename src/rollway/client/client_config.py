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
from rollway.client.progress import DEFAULT_STATUS_INTERVAL_S
from rollway.client.watchdog import DEFAULT_STUCK_AFTER_S
from rollway.errors import ConfigError
from rollway.gateway.engine_choice import EngineChoice
from rollway.generation import SamplingParams
from rollway.ids import check_exp_id, id_from
from rollway.retry import RetryPolicy
from rollway.rollouts import RolloutConfig, RolloutLimits, ServingConfig
from rollway.rollouts.config import config_object


@dataclass(frozen=True, slots=True)
class Pacing:
    """How the client paces and watches rollouts: at most ``max_concurrent`` in flight and
    ``tps_limit`` tokens a second; a bar (``show_progress``) and a status line every
    ``status_interval`` seconds; a rollout without progress for ``stuck_after_s`` (None or 0:
    never) reported, and with ``abort_stuck`` ended as a ``timeout``. Checked at construction:
    a value that would hang or spin a batch is refused, naming it."""

    max_concurrent: int = 16
    tps_limit: float | None = None
    show_progress: bool = False
    status_interval: float = DEFAULT_STATUS_INTERVAL_S
    stuck_after_s: float | None = DEFAULT_STUCK_AFTER_S
    abort_stuck: bool = False

    def __post_init__(self) -> None:
        check_count("max_concurrent", self.max_concurrent, least=1)
        tps_limit = self.tps_limit
        if tps_limit is not None and not (is_number(tps_limit) and 0 < tps_limit < math.inf):
            raise ConfigError("tps_limit must be None or a positive number", "tps_limit")
        check_seconds("status_interval", self.status_interval)
        if self.stuck_after_s is not None:
            check_seconds("stuck_after_s", self.stuck_after_s, zero=True)

    @property
    def watch_after_s(self) -> float | None:
        """When the watchdog reports a rollout (0 turns it off, as ``--stuck-after 0`` does)."""
        return self.stuck_after_s or None


@dataclass(frozen=True)
class ClientConfig:
    """The agent, the experiment id, the settings every rollout runs with, how the client
    serves agent servers, its engine argument sorted once, and its pacing."""

    agent: AgentLoop
    exp_id: str
    settings: RolloutConfig
    serving: ServingConfig
    engine: EngineChoice
    pacing: Pacing

    @classmethod
    def build(
        cls,
        agent: AgentLoop | type[AgentLoop] | str,
        exp_id: str | None,
        *,
        engine: EngineChoice,
        pacing: Pacing,
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
        return cls(ready, exp, settings, served or ServingConfig(), engine, pacing)
