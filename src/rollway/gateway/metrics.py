"""Prometheus metrics of one gateway, in its own registry (several gateways may share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rollouts_active = Gauge(
            "rollway_rollouts_active", "Registered rollouts.", registry=self.registry
        )
        self.turns = Counter(
            "rollway_turns", "Chat turns answered.", ["finish_reason"], registry=self.registry
        )
        self.tokens = Counter(
            "rollway_tokens", "Tokens through the gateway.", ["kind"], registry=self.registry
        )
        self.turn_latency = Histogram(
            "rollway_turn_latency_seconds", "Engine time per turn.", registry=self.registry
        )
        self.engine_errors = Counter(
            "rollway_engine_errors", "Failed generations.", registry=self.registry
        )
        self.truncations = Counter(
            "rollway_truncations", "Limits hit.", ["reason"], registry=self.registry
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
