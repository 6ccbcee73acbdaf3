"""The agent server's wire format: what a client sends to start a rollout."""

from __future__ import annotations

import ipaddress
from typing import Any

import yarl
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rollway.checks import MAX_SEQ_LEN
from rollway.gateway.request_schema import SamplingFields
from rollway.ids import IdempotencyKey, SafeId


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InitLimits(_Strict):
    timeout_s: float | None = Field(default=None, gt=0)
    max_turns: int | None = Field(default=None, ge=1)
    max_seq_len: int | None = Field(default=None, ge=2, le=MAX_SEQ_LEN)


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

    @field_validator("base_url", "callback_url")
    @classmethod
    def _reachable_url(cls, value: str | None) -> str | None:
        """A URL the server will call: checked now, not when the rollout first uses it."""
        if value is None:
            return value
        try:
            host = _host(value)
        except ValueError as exc:  # UnicodeError too: a host that IDNA cannot encode
            raise ValueError(f"not a URL: {exc}") from None
        if not host:
            raise ValueError("the URL names no host")
        return value

    @field_validator("sampling")
    @classmethod
    def _known_sampling(cls, value: dict[str, Any]) -> dict[str, Any]:
        """The declared sampling rules (the gateway's), so a bad value fails the init, not
        every turn. Its ``ValidationError`` goes up as it is: pydantic places its errors under
        this field (``sampling.temperature``), naming the field to fix."""
        SamplingFields.model_validate(value, strict=True)  # as read off the wire
        return value


def _host(url: str) -> str | None:
    """The host as the server's HTTP client will look it up; ``ValueError`` where it would
    fail before sending anything (a port out of range, a host that IDNA cannot encode)."""
    parsed = yarl.URL(url)  # as aiohttp parses it: encodes a non-ASCII host
    parsed.port  # noqa: B018 (raises ValueError when the port is not a number in range)
    host = parsed.raw_host
    if host and not _is_ip(host):
        host.encode("idna")  # as the resolver does: an empty or 64-character label fails
    return host


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
