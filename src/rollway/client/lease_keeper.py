"""A client's hold on its experiment (``rollway.leases``) while it runs batches: taken in the
store and at a shared gateway when a batch starts, renewed by a heartbeat, given back when the
last running batch ends. Batches are what collide: their rollout ids derive from the tasks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Iterator

from rollway.errors import ExperimentInUseError
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.leases import DEFAULT_TTL_S, Lease, LeaseHolder
from rollway.loop_thread import LoopThread
from rollway.store.base import Store

log = logging.getLogger(__name__)


class LeaseKeeper:
    """``gateway``: a shared gateway (None: the client's own, which nobody else uses); from
    now on its registrations name this client, Ray workers' copies included."""

    def __init__(
        self,
        exp_id: str,
        store: Store,
        gateway: RemoteGateway | None,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.holder = LeaseHolder.this_process()
        self.store, self.gateway = store, gateway
        if gateway is not None:
            gateway.lease_holder = self.holder.id
        self._lease = Lease(exp_id=exp_id, holder=self.holder, renewed_at=0.0, ttl_s=ttl_s)
        self._lock = threading.Lock()
        self._holds = 0
        self._beat: concurrent.futures.Future[None] | None = None

    @contextlib.contextmanager
    def held(self, loop: LoopThread) -> Iterator[None]:
        """Hold the experiment meanwhile (batches of this client share one hold); raises
        ``ExperimentInUseError`` naming the client that holds it."""
        with self._lock:
            if self._holds == 0:
                self._take(loop)
                self._beat = loop.submit(self._keep())
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                if self._holds > 0:  # zero: the client closed meanwhile
                    self._holds -= 1
                    if self._holds == 0:
                        self._release(loop)

    def close(self, loop: LoopThread) -> None:
        """Give the lease back now, even with batches left unfinished (the client closes)."""
        with self._lock:
            if self._holds > 0:
                self._holds = 0
                self._release(loop)

    def _take(self, loop: LoopThread) -> None:
        self.store.take_lease(self._lease.renewed())
        try:
            loop.call(self._take_at_gateway())
        except BaseException:
            self.store.release_lease(self.holder)
            raise

    async def _keep(self) -> None:
        """Renew the lease until cancelled. A renewal that fails is logged and tried again
        next beat: the lease outlives a few missed beats (a store or gateway outage)."""
        while True:
            await asyncio.sleep(self._lease.ttl_s / 6)
            try:
                await asyncio.to_thread(self.store.take_lease, self._lease.renewed())
                await self._take_at_gateway()
            except ExperimentInUseError as exc:
                # This client's heartbeat lapsed and another took the experiment.
                log.error("lost the lease on experiment %r: %s", self._lease.exp_id, exc)
            except Exception as exc:
                log.warning("could not renew the lease on %r: %r", self._lease.exp_id, exc)

    def _release(self, loop: LoopThread) -> None:
        """Stop the heartbeat and give the lease back where this client still holds it;
        failures are logged (a lease not given back lapses by itself)."""
        if self._beat is not None:
            self._beat.cancel()
        try:
            self.store.release_lease(self.holder)
        except Exception as exc:
            log.warning("could not release the store lease: %r", exc)
        if self.gateway is not None:
            try:
                loop.call(self.gateway.release_lease(self._lease.exp_id, self.holder))
            except Exception as exc:
                log.warning("could not release the gateway lease: %r", exc)

    async def _take_at_gateway(self) -> None:
        if self.gateway is not None:
            await self.gateway.take_lease(self._lease.exp_id, self.holder, self._lease.ttl_s)
