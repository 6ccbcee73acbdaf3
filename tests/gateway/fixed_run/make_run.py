"""A fixed, seeded run through an in-process gateway over the sim engine, as bytes: each
rollout's trajectory JSON and its exported sample rows. The file beside it (``run.jsonl``) is
these bytes as commit fa584dd made them (before ids were held once, in the turns), made again
when requests could extend any thread's tip (test_records_unchanged.py says what changed):
``PYTHONPATH=src python tests/gateway/fixed_run/make_run.py tests/gateway/fixed_run/run.jsonl``.
A change to how the gateway holds ids in flight must leave them byte for byte as they were."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from rollway.engines.sim import SimConfig, SimEngine
from rollway.errors import EngineError
from rollway.gateway import Gateway, build_gateway
from rollway.generation import GenerationResult, SamplingParams
from rollway.results import RolloutRecord
from rollway.store.export import export_records

Message = dict[str, Any]


class FailsAt(SimEngine):
    """The sim engine, failing its generations numbered in ``fail_at`` (1-based)."""

    def __init__(self, fail_at: set[int], config: SimConfig) -> None:
        super().__init__(config)
        self.calls, self.fail_at = 0, fail_at

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str
    ) -> GenerationResult:
        self.calls += 1
        if self.calls in self.fail_at:
            raise EngineError("the engine fell over")
        return await super().generate(input_ids, sampling, request_id)


async def linear(gateway: Gateway, rollout: str, steps: int) -> None:
    """A growing conversation; a failed call is asked again."""
    messages: list[Message] = [
        {"role": "system", "content": "You are a careful agent."},
        {"role": "user", "content": "Start."},
    ]
    for step in range(steps):
        while True:
            try:
                reply = await gateway.chat(rollout, {"messages": messages})
                break
            except EngineError:
                continue
        messages += [reply.message, {"role": "user", "content": f"Observation {step}: ok."}]


async def branched(gateway: Gateway, rollout: str) -> None:
    """Two concurrent branches of one turn, each going on; then a stream closed early."""
    first: list[Message] = [{"role": "user", "content": "Start."}]
    reply = (await gateway.chat(rollout, {"messages": first})).message
    branches = [[*first, reply, {"role": "user", "content": f"Branch {i}."}] for i in (1, 2)]
    answers = await asyncio.gather(*[gateway.chat(rollout, {"messages": b}) for b in branches])
    # The branch answered last goes on first, the other second: each extends its own tip.
    for branch, answer in reversed(list(zip(branches, answers, strict=True))):
        branch += [answer.message, {"role": "user", "content": "More."}]
        reply = (await gateway.chat(rollout, {"messages": branch})).message
    last = [*branches[0], reply, {"role": "user", "content": "Go on."}]
    stream = gateway.chat_stream(rollout, {"messages": last})
    async with contextlib.aclosing(stream):
        async for _ in stream:
            break
    reply = (await gateway.chat(rollout, {"messages": last})).message
    await gateway.chat(rollout, {"messages": [*last, reply, {"role": "user", "content": "End."}]})


def record(rollout: str, trajectory: Any) -> RolloutRecord:
    return RolloutRecord(
        exp_id="fixed", rollout_key=f"{rollout}-0", rollout_id=rollout, task_index=0,
        group_id=rollout, group_index=0, sample_index=0, status="completed", reward=1.0,
        started_at=0.0, elapsed_s=1.0, messages=trajectory.messages, trajectory=trajectory,
    )  # fmt: skip


async def run_bytes() -> bytes:
    """The run's records and sample rows, latencies (the one measured field) set to 0."""
    linear_gateway = build_gateway(FailsAt({3, 7}, SimConfig(output_len=12)))
    branch_gateway = build_gateway(FailsAt(set(), SimConfig(output_len=6, per_token_s=0.002)))
    lines = []
    for gateway, rollout, play in (
        (linear_gateway, "linear", lambda g, r: linear(g, r, 8)),
        (branch_gateway, "branched", branched),
    ):
        gateway.register(rollout, {"seed": 7, "max_tokens": 12})
        await play(gateway, rollout)
        trajectory = await gateway.trajectory(rollout)
        turns = [turn.model_copy(update={"latency_ms": 0.0}) for turn in trajectory.turns]
        trajectory = trajectory.model_copy(update={"turns": turns})
        lines.append(trajectory.model_dump_json().encode())
        with tempfile.TemporaryDirectory() as root:
            path = Path(root) / "samples.jsonl"
            export_records([record(rollout, trajectory)], path, "jsonl")
            lines.append(path.read_bytes().rstrip(b"\n"))
    return b"\n".join(lines) + b"\n"


if __name__ == "__main__":
    Path(sys.argv[1]).write_bytes(asyncio.run(run_bytes()))
