"""`rollway gateway --workers 2` (a subprocess, as a user starts it) in front of the one real
vLLM server of the real leg (`make test-vllm`): concurrent rollouts through its front are
exact on both workers (sampled ids under mask 1, logprobs a fresh fp32 forward pass of the
weights gives), each rollout's turns reach the one worker that holds it, and a weight update
through the front makes the server load the folder once (vLLM's own request counter of
``/collective_rpc``), not once per worker; the tokens of both workers carry the new version."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollway.client import RolloutClient
from rollway.gateway import RemoteGateway
from rollway.gateway.workers.worker_pool import worker_index
from rollway.generation import GenerationResult
from rollway.model_folders import prepare_default_model
from rollway.results import RolloutRecord
from tests.cli.test_gateway_command import free_port
from tests.cli.test_gateway_rollout_ttl import wait_until_serving
from tests.cli.test_gateway_workers import ADMIN_KEY, turns_by_worker
from tests.outcomes import ENDED

from .test_vllm_conformance import (
    LOGPROB_TOLERANCE,
    TwoTurns,
    fresh_forward_logprobs,
    label_start_weights,
    real_leg,
    weights,
)
from .vllm_servers import REAL, RealVLLM

WORKERS = 2
ROLLOUTS = 6  # a batch: both workers hold some (checked), all at once


@pytest.fixture
def front(real_vllm: RealVLLM) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "ROLLWAY_ADMIN_KEY": ADMIN_KEY}
    engine = f"vllm://127.0.0.1:{real_vllm.port}"
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", engine, "--port", str(port),
           "--workers", str(WORKERS)]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            wait_until_serving(proc, client)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def weight_loads(url: str) -> float:
    """``POST /collective_rpc`` calls vLLM answered (its ``http_requests_total``): one per
    ``reload_weights``, the only method rollway calls there."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    assert "http_requests_total" in text, "vLLM's /metrics has no http_requests_total"
    pattern = r'^http_requests_total\{[^}]*handler="/collective_rpc"[^}]*\} ([0-9.e+]+)$'
    return sum(float(n) for n in re.findall(pattern, text, re.MULTILINE))


def check_exact(record: RolloutRecord, folder: Path, version: int) -> None:
    """One sequence: the ids sampled under mask 1 are the turns' completions, their logprobs
    beside them the turns' and a fresh fp32 pass's of ``folder``; every token ``version``."""
    assert record.status in ENDED, (record.status, record.reason)
    trajectory = record.trajectory
    assert trajectory is not None and trajectory.segment_count == 1
    (sample,) = trajectory.samples
    mask = sample.loss_mask
    sampled = [t for t, m in zip(sample.response_ids, mask, strict=True) if m]
    assert sampled == [t for turn in trajectory.turns for t in turn.completion_ids]
    recorded = [lp for lp, m in zip(sample.logprobs, mask, strict=True) if m]
    assert recorded == [lp for turn in trajectory.turns for lp in turn.logprobs]
    whole = GenerationResult(sample.response_ids, [], "stop")
    fresh = fresh_forward_logprobs(sample.prompt_ids, whole, folder)
    expected = [lp for lp, m in zip(fresh, mask, strict=True) if m]
    worst = max(abs(a - b) for a, b in zip(recorded, expected, strict=True))
    assert worst <= LOGPROB_TOLERANCE, f"{record.rollout_id}: logprobs differ by {worst:.2e}"
    for turn in trajectory.turns:
        assert turn.policy_versions == [version] * len(turn.completion_ids)


def run_batch(client: RolloutClient, first: int) -> list[RolloutRecord]:
    tasks = [{"task_id": f"t{i}"} for i in range(first, first + ROLLOUTS)]
    return [item.result for item in client.run_batch(tasks)]


@getattr(pytest.mark, REAL)
@pytest.mark.timeout(1200)
def test_workers_sharing_the_real_server_are_exact_and_load_an_update_once(
    real_vllm: RealVLLM, front: str, tmp_path: Path
) -> None:
    leg = real_leg(real_vllm, prepare_default_model())
    gateway = RemoteGateway(front, admin_key=ADMIN_KEY)
    client = RolloutClient(TwoTurns, gateway, store=str(tmp_path / "runs"), exp_id="workers",
                           max_concurrent=ROLLOUTS, timeout=600)  # fmt: skip
    try:
        with client, weights(leg, tmp_path, "v1", 1.25) as new:
            before = run_batch(client, 0)
            loads = weight_loads(real_vllm.url)
            update = client.update_weights(str(new), mode="abort")
            assert update["policy_version"] == 1
            assert weight_loads(real_vllm.url) - loads == 1  # once, not once per worker
            after = run_batch(client, ROLLOUTS)
            client.update_weights(str(leg.folder))  # the start-up weights back, for what follows
            assert weight_loads(real_vllm.url) - loads == 2
    finally:
        asyncio.run(label_start_weights(leg))
    for record in before:
        check_exact(record, leg.folder, 0)
    for record in after:
        check_exact(record, new, 1)
    # Each rollout's turns reached the worker its id hashes to, and both workers held some.
    held = Counter(worker_index(r.rollout_id, WORKERS) for r in before + after)
    assert set(held) == {0, 1}, held
    assert turns_by_worker(front) == {str(w): 2.0 * n for w, n in held.items()}
