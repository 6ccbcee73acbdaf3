"""The short version of benchmarks/ray_nodes.py: a batch on a local cluster of two nodes, one
worker pinned to each, is all in flight at once before the first answer, every rollout ends,
and the figures the benchmark reports come out (their sizes are measured, not asserted, at
this scale: a few hundred rollouts say nothing of a per-rollout cost)."""

from __future__ import annotations

from benchmarks.ray_nodes import measure


def test_a_batch_on_two_nodes_is_all_in_flight_and_every_rollout_ends() -> None:
    figures = measure(rollouts=200, nodes=2, latency_s=8.0, status_s=1.0)
    assert figures.ok == 200
    assert figures.peak_in_flight == 200  # all dispatched before the first answer
    assert 0 < figures.dispatch_s < figures.latency_s
    assert figures.rollouts_per_s > 0 and figures.wall_s >= figures.latency_s
    assert len(figures.worker_kb_in_flight) == 2  # one worker per node, each measured
    assert figures.driver_kb_in_flight > 0
    # Status lines kept coming while the batch was in flight (one due every second).
    assert 0 < figures.first_status_s < figures.latency_s
    assert figures.status_gap_s < figures.latency_s
