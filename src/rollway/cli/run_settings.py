"""``rollway run``'s settings as one typed value, built once from the command line, the
environment and the config file (``cli.config_file.merged_settings``): the run reads fields,
never a dict by string keys. Each field is the option of the same name (``rollway run
--help``); its default stays in ``run``'s signature, where ``--help`` and the config file read
it, so there are none here: every field comes from the merged settings."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rollway.errors import ConfigError
from rollway.executors import Executor, RayExecutor
from rollway.rollouts.config import RolloutLimits, ServingConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSettings:
    # What to run, on what.
    tasks: str | None
    agent: str | None
    cmd: str | None
    sandbox: str
    sandbox_writable: list[str] | None
    agent_key: str | None
    group_size: int
    limit: int | None
    resume: bool
    reward: str | None
    # The engine, or a shared gateway in front of one.
    engine: str
    model: str | None
    gateway: str | None
    gateway_key: str | None
    # Sampling (the engine's defaults where not given).
    temperature: float
    top_p: float
    top_k: int
    stop: list[str] | None
    top_logprobs: int
    record_entropy: bool
    seed: int | None
    max_tokens: int | None
    # Each rollout's bounds.
    max_turns: int | None
    max_seq_len: int | None
    timeout: float
    max_attempts: int | None
    reward_timeout: float
    reward_retries: int
    stop_grace: float
    # Where rollouts run, and what serves them.
    concurrency: int
    executor: str
    ray_address: str | None
    workers: int | None
    workers_per_node: int | None
    http_host: str
    http_port: int
    public_url: str | None
    # Where results go, and how the run is watched.
    out: str
    exp_id: str | None
    events: Path | None
    status_interval: float
    stuck_after: float
    abort_stuck: bool
    trace: bool

    @classmethod
    def of(cls, merged: dict[str, Any]) -> RunSettings:
        """The merged settings, each under its option's name (an option without a field, or
        a field without an option, fails here: the two lists are one)."""
        return cls(**merged)

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def limits(self) -> RolloutLimits:
        return RolloutLimits(
            max_turns=self.max_turns,
            max_seq_len=self.max_seq_len,
            timeout=self.timeout or None,
            reward_timeout=self.reward_timeout,
            stop_grace_s=self.stop_grace,
            reward_retries=self.reward_retries,
        )

    def serving(self) -> ServingConfig:
        return ServingConfig(host=self.http_host, port=self.http_port, public_url=self.public_url)

    def retry(self) -> dict[str, int] | None:
        return {"attempts": self.max_attempts} if self.max_attempts else None

    def where_to_run(self) -> str | Executor:
        """The executor: a name, or a ``RayExecutor`` with the Ray options (refused, by name,
        without Ray)."""
        if self.executor != "ray":
            given = [name for name in _RAY_OPTIONS if getattr(self, name)]
            if given:
                flags = " and ".join(f"--{name.replace('_', '-')}" for name in given)
                verb = "goes" if len(given) == 1 else "go"
                raise ConfigError(f"{flags} {verb} with --executor ray", param=given[0])
            return self.executor
        if self.workers and self.workers_per_node:
            raise ConfigError(
                "give --workers or --workers-per-node, not both (with --workers-per-node the "
                "count is the live nodes times it)",
                param="workers_per_node",
            )
        return RayExecutor(
            address=self.ray_address,
            num_workers=self.workers,
            workers_per_node=self.workers_per_node,
        )


_RAY_OPTIONS = ("ray_address", "workers", "workers_per_node")
