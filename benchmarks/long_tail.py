"""The long tail of a step: ``client.step_source`` against waiting for every rollout.

A simulated engine (``--turn-s`` per model call) and an agent whose number of turns is heavy
tailed: 90% of rollouts make 1 or 2 calls, 10% from 10 to 40 (5 to 20x) (``--long-share``,
``--long-turns``), drawn per rollout from a fixed seed, so both modes meet the same rollouts.
Each step the trainer takes ``--groups`` groups of ``--group-size`` (its training is
``--train-s`` of sleep) and pushes new weights (``update_weights``, abort mode: turns in flight
go on under the new version):

- ``wait for every rollout``: ``run_batch`` of the step's tasks, all of them awaited;
- ``step source``: ``client.step_source(..., over_sample=--over-sample)``: the first groups
  done, the rest carried into the next step; ``stale="restart"`` past ``--max-staleness``.

Printed per mode: steps per minute, trainer-input tokens per second (response tokens handed
over), and the checks: no rollout handed over that did not complete, every handed token's
version one the engine had served (at most the trainer's, at least 0), and staleness within the
bound. Goal: the step source at least 1.8x the steps per minute.

Usage: python benchmarks/long_tail.py [--steps 12] [--groups 8] [--group-size 4]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import build_gateway
from rollway.results import AgentResult, RolloutRecord


class TailAgent(AgentLoop):
    """Makes ``turns`` model calls, drawn per rollout from the task's seed; reward: the
    sample's parity (every group informative: this measures the tail, not dynamic sampling)."""

    name = "long-tail"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        sample = int(ctx.rollout_id.rsplit(".", 2)[-2])
        draw = random.Random(f"{ctx.task['seed']}:{sample}")
        long = draw.random() < ctx.task["long_share"]
        turns = draw.randint(*ctx.task["long_turns"]) if long else draw.randint(1, 2)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        for _ in range(turns):
            reply = await ctx.chat(messages)
            messages += [reply.message, {"role": "user", "content": "more"}]
        return ctx.complete(messages, reward=float(sample % 2))


@dataclass
class Result:
    mode: str
    steps: int
    wall_s: float
    tokens: int
    staleness: Counter[int]
    bad: list[str]

    @property
    def steps_per_min(self) -> float:
        return 60 * self.steps / self.wall_s

    def line(self) -> str:
        stale = ", ".join(f"{k}: {v}" for k, v in sorted(self.staleness.items()))
        return (
            f"{self.mode:>24}: {self.steps_per_min:6.1f} steps/min, "
            f"{self.tokens / self.wall_s:8.0f} trainer-input tokens/s, "
            f"tokens by versions behind {{{stale}}}, problems: {self.bad or 'none'}"
        )


def make_client(args: argparse.Namespace, store: str, exp_id: str) -> RolloutClient:
    engine = SimEngine(SimConfig(latency_s=args.turn_s, output_len=16))
    return RolloutClient(
        TailAgent,
        build_gateway(engine),
        store=store,
        exp_id=exp_id,
        max_concurrent=1024,
        max_tokens=16,
        timeout=600,
        stuck_after_s=None,
    )


def tasks(args: argparse.Namespace, count: int) -> list[dict[str, Any]]:
    long_turns = (10, 2 * args.long_turns)  # 5 to 20x the short ones' 1 or 2
    return [
        {"task_id": f"t{i}", "seed": i, "long_share": args.long_share, "long_turns": long_turns}
        for i in range(count)
    ]


def check(records: list[RolloutRecord], version: int | None, bound: int | None) -> list[str]:
    """What is wrong with a handed batch: a rollout that did not complete, a token of a version
    the engine never served, staleness past the bound."""
    bad = [f"{r.rollout_key}: {r.status}" for r in records if r.status != "completed"]
    for record in records:
        versions = [v for t in record.trajectory.turns for v in t.policy_versions or []] if (
            record.trajectory) else []  # fmt: skip
        if version is not None and any(not 0 <= v <= version for v in versions):
            bad.append(f"{record.rollout_key}: a token of a version never served")
        oldest = record.policy_version
        lag = None if version is None or oldest is None else version - oldest
        if bound is not None and lag is not None and lag > bound:
            bad.append(f"{record.rollout_key}: {lag} versions behind")
    return bad


def wait_for_every_rollout(args: argparse.Namespace, store: str) -> Result:
    staleness: Counter[int] = Counter()
    bad: list[str] = []
    tokens = 0
    all_tasks = tasks(args, args.steps * args.groups)
    with make_client(args, store, "wait-all") as client:
        started = time.monotonic()
        for step in range(args.steps):
            step_tasks = all_tasks[step * args.groups : (step + 1) * args.groups]
            records = [i.result for i in client.run_batch(step_tasks, args.group_size)]
            bad += check(records, client.policy_version, args.max_staleness)
            tokens += sum(r.metrics.response_tokens for r in records)
            staleness[0] += sum(r.metrics.response_tokens for r in records)
            time.sleep(args.train_s)  # the trainer's step
            client.update_weights(f"step-{step}")
        wall_s = time.monotonic() - started
    return Result("wait for every rollout", args.steps, wall_s, tokens, staleness, bad)


def step_source(args: argparse.Namespace, store: str) -> Result:
    staleness: Counter[int] = Counter()
    bad: list[str] = []
    tokens = 0
    # Tasks enough for the steps and what runs on past the last one.
    all_tasks = tasks(args, args.steps * args.groups * 4)
    with make_client(args, store, "step-source") as client:
        source = client.step_source(
            all_tasks,
            group_size=args.group_size,
            groups_per_step=args.groups,
            over_sample=args.over_sample,
            max_staleness=args.max_staleness,
            stale="restart",
        )
        started = time.monotonic()
        with source:
            for step in range(args.steps):
                batch = source.next_batch()
                bad += check(batch.records, client.policy_version, args.max_staleness)
                bad += [f"step {step} lacks {batch.lacking} groups"] * (batch.lacking > 0)
                tokens += sum(r.metrics.response_tokens for r in batch.records)
                staleness.update(batch.metrics.staleness)
                time.sleep(args.train_s)
                client.update_weights(f"step-{step}")
            wall_s = time.monotonic() - started
    return Result("step source", args.steps, wall_s, tokens, staleness, bad)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--groups", type=int, default=8, help="groups per step (B)")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--over-sample", type=float, default=1.0)
    parser.add_argument("--max-staleness", type=int, default=8)
    parser.add_argument("--turn-s", type=float, default=0.05, help="seconds per model call")
    parser.add_argument("--long-share", type=float, default=0.1)
    parser.add_argument("--long-turns", type=int, default=20, help="a long rollout: up to Nx")
    parser.add_argument("--train-s", type=float, default=0.1, help="the trainer's step")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    with tempfile.TemporaryDirectory() as store:
        results = [wait_for_every_rollout(args, store), step_source(args, store)]
    for result in results:
        print(result.line())
    speedup = results[1].steps_per_min / results[0].steps_per_min
    ok = speedup >= 1.8 and not any(r.bad for r in results)
    print(f"step source / wait for every rollout: {speedup:.2f}x steps per minute "
          f"(goal >= 1.8x): {'met' if ok else 'NOT met'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
