"""The agent server's wire format: what a client sends to start a rollout."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rollway.ids import IdempotencyKey, SafeId


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InitLimits(_Strict):
    timeout_s: float | None = Field(default=None, gt=0)
    max_turns: int | None = Field(default=None, ge=1)
    max_seq_len: int | None = Field(default=None, ge=2)


class InitRequest(_Strict):
    """``POST /v1/rollout/init``. The rollout is already registered at the gateway named by
    ``base_url`` (its OpenAI base URL) and ``api_key``; the agent server only runs the agent."""

    rollout_id: SafeId
    #: Names the experiment's folder in the store.
    exp_id: SafeId
    base_url: str = Field(pattern=r"^https?://")
    api_key: str = Field(min_length=1)
    model: str | None = None
    task: dict[str, Any]
    #: Names of the agent's tools to offer; None offers them all.
    tools: list[str] | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    limits: InitLimits = Field(default_factory=InitLimits)
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: Where to ``POST {callback_url}/v1/rollout/completed`` the report, with ``callback_key``.
    callback_url: str | None = Field(default=None, pattern=r"^https?://")
    callback_key: str | None = None
    #: A repeated init with the same key returns the same rollout (also ``Idempotency-Key``).
    idempotency_key: IdempotencyKey | None = None
    debug: bool = False
