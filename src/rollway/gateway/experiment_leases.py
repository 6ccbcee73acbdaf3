"""The gateway's side of experiment leases (``rollway.leases``): clients that share a gateway
each hold their experiment here, and a rollout of a held experiment is registered only for its
holder. A client with its own store folder would otherwise meet another client of the same
experiment id only here, where their rollout ids collide."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field

from rollway.errors import ExperimentInUseError
from rollway.leases import Lease, LeaseHolder, check_free


class LeaseRequest(BaseModel):
    """``POST /v1/experiments/{exp_id}/lease``: take or renew the experiment's lease."""

    model_config = ConfigDict(extra="forbid", strict=True)

    holder: LeaseHolder
    ttl_s: float = Field(gt=0, le=3600)


class ReleaseRequest(BaseModel):
    """``POST /v1/experiments/{exp_id}/release``: give the lease back."""

    model_config = ConfigDict(extra="forbid", strict=True)

    holder_id: str = Field(min_length=1, max_length=64)


class ExperimentLeases:
    """The live lease of each experiment on this gateway, by experiment id."""

    def __init__(self) -> None:
        self._held: dict[str, Lease] = {}

    def take(self, exp_id: str, holder: LeaseHolder, ttl_s: float) -> Lease:
        """Take or renew; ``ExperimentInUseError`` naming the holder of a live lease."""
        check_free(self._held.get(exp_id), holder, "lease at the gateway")
        lease = self._held[exp_id] = Lease(
            exp_id=exp_id, holder=holder, renewed_at=time.time(), ttl_s=ttl_s
        )
        return lease

    def release(self, exp_id: str, holder_id: str) -> bool:
        """Drop the lease if ``holder_id`` holds it; whether it did."""
        lease = self._held.get(exp_id)
        if lease is None or lease.holder.id != holder_id:
            return False
        del self._held[exp_id]
        return True

    def check_register(self, rollout_id: str, client: str | None) -> None:
        """Refuse to register a rollout of an experiment another client (or a caller that
        names none) holds. Rollout ids start with their experiment's id and a dot; experiment
        ids may hold dots too, so every prefix ending before a dot is looked up."""
        if not self._held:
            return
        for at, char in enumerate(rollout_id):
            lease = self._held.get(rollout_id[:at]) if char == "." else None
            if lease is None:
                continue
            if not lease.is_live():
                del self._held[lease.exp_id]
            elif lease.holder.id != client:
                raise ExperimentInUseError(
                    f"rollout {rollout_id!r} belongs to experiment {lease.exp_id!r}, which "
                    f"another client holds at this gateway: {lease.holder.describe()}",
                    param="client",
                )
