"""Prometheus metrics of one gateway, in its own registry (several gateways may share a process)."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rollway.engines.base import ReportsStats, WeightSync

#: The media type of ``render``'s text: the format ``generate_latest`` writes.
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"

log = logging.getLogger(__name__)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        gauge, counter = self._gauge, self._counter
        self.rollouts_active = gauge("rollway_rollouts_active", "Registered rollouts.")
        self.turns = counter("rollway_turns", "Chat turns answered.", "finish_reason")
        self.tokens = counter("rollway_tokens", "Tokens through the gateway.", "kind")
        # Children looked up once: ``labels()`` on every turn costs more than the count.
        self.prompt_tokens = self.tokens.labels("prompt")
        self.completion_tokens = self.tokens.labels("completion")
        self._turns_by_finish: dict[str, Counter] = {}
        self.turn_latency = Histogram(
            "rollway_turn_latency_seconds", "Engine time per turn.", registry=self.registry
        )
        self.engine_errors = counter("rollway_engine_errors", "Failed generations.")
        self.rollouts_expired = counter(
            "rollway_rollouts_expired", "Rollouts dropped after idling past the TTL."
        )
        self.turns_reissued = counter(
            "rollway_turns_reissued", "Turns the engine aborted (a weight update), sent again."
        )
        self.policy_version = gauge(
            "rollway_policy_version", "Weights version the engine samples with (-1: none)."
        )
        self.rollouts_stuck = gauge(
            "rollway_rollouts_stuck", "Rollouts without progress past the watchdog's limit."
        )
        self.truncations = counter("rollway_truncations", "Limits hit.", "reason")
        self.endpoint_healthy = gauge(
            "rollway_engine_endpoint_healthy",
            "1 while an engine endpoint takes traffic.",
            "endpoint",
        )
        self.endpoint_in_flight = gauge(
            "rollway_engine_endpoint_in_flight",
            "Requests running on an engine endpoint.",
            "endpoint",
        )
        self.endpoint_ejections = gauge(
            "rollway_engine_endpoint_ejections", "Times an engine endpoint was ejected.", "endpoint"
        )
        self.endpoint_refused = gauge(
            "rollway_engine_endpoint_refused",
            "Requests an engine endpoint refused before they were sent (sent elsewhere).",
            "endpoint",
        )

    def _gauge(self, name: str, documentation: str, *labels: str) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    def _counter(self, name: str, documentation: str, *labels: str) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def observe_engine(self, engine: object) -> None:
        """Copy the engine's version and a routed engine's endpoint states into the gauges
        (at scrape time)."""
        version = engine.policy_version if isinstance(engine, WeightSync) else None
        self.policy_version.set(-1 if version is None else version)
        if not isinstance(engine, ReportsStats):
            return
        for name, endpoint in engine.stats()["endpoints"].items():
            self.endpoint_healthy.labels(name).set(1 if endpoint["healthy"] else 0)
            self.endpoint_in_flight.labels(name).set(endpoint["in_flight"])
            self.endpoint_ejections.labels(name).set(endpoint["ejections"])
            self.endpoint_refused.labels(name).set(endpoint["refused"])

    def turn_answered(self, finish_reason: str) -> None:
        counter = self._turns_by_finish.get(finish_reason)
        if counter is None:
            counter = self._turns_by_finish[finish_reason] = self.turns.labels(finish_reason)
        counter.inc()

    def truncated(self, rollout_id: str, reason: str) -> None:
        self.truncations.labels(reason).inc()
        log.info("rollout truncated", extra={"rollout_id": rollout_id, "stage": reason})

    def render(self) -> bytes:
        """The metrics in Prometheus' text format (``PROMETHEUS_TEXT``)."""
        return generate_latest(self.registry)
