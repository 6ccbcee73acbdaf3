"""Long horizons: how a rollout's record, the gateway's memory and a turn's CPU grow with turns.

Each rollout runs an agent loop through an in-process gateway over the simulated engine (no
latency, ``--answer`` tokens per answer): every turn appends a tool observation of about
``--observation`` tokens to the history. Printed per turn count:

- final context (tokens) and the sample's ids as JSON (bytes): what the trainer gets;
- the record as the store writes it (bytes) and its ratio to the sample's ids;
- that ratio less the conversation's text, which the record keeps once (goal: <= 1.5x; the
  text alone is about 0.8x the ids as JSON, so the whole record cannot be 1.5x in JSON);
- writing, reading back and exporting the record (ms; goal: linear in turns);
- a turn's gateway CPU at the start and at the end of the rollout (goal: last within 1.2x).

Then ``--in-flight`` rollouts are held open at once for ``--flight-turns`` turns and what the
gateway holds (traced allocations) is set against their final contexts' ids as Python lists
(goal: at most 2x), and what its ids and logprobs take (the turns' containers; each id is
held once, by the turn that added it) against the final contexts' ids as int32 (goal: at most
1.3x). Measured between calls: a call in flight also holds its prompt, joined for the engine.

Usage: python benchmarks/long_horizon.py [--turns 10,40,100,200] [--in-flight 256]
It runs on the previous release too (``PYTHONPATH=<its checkout>/src``), for the before figures.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

import rollway
from rollway.gateway import Gateway, build_gateway
from rollway.results import RolloutRecord
from rollway.store.export import export_records
from rollway.store.file import FileStore
from rollway.trajectory import Trajectory

#: Observations are slices of rollway's own source: what a software agent's tools print.
SOURCE = "\n".join(path.read_text() for path in sorted(Path(rollway.__file__).parent.rglob("*.py")))
CHARS_PER_TOKEN = 3.4  # about what the tokenizer makes of Python source


@dataclass
class Measured:
    turns: int
    context: int
    sample_ids_bytes: int
    record_bytes: int
    text_bytes: int
    write_ms: float
    read_ms: float
    export_ms: float
    first_turns_ms: float
    last_turns_ms: float

    @property
    def record_ratio(self) -> float:
        return self.record_bytes / self.sample_ids_bytes

    @property
    def token_ratio(self) -> float:
        """The record less its conversation's text, to the sample's ids."""
        return (self.record_bytes - self.text_bytes) / self.sample_ids_bytes

    @property
    def cpu_ratio(self) -> float:
        return self.last_turns_ms / self.first_turns_ms


def observation(rng: random.Random, tokens: int) -> str:
    size = int(tokens * CHARS_PER_TOKEN)
    start = rng.randrange(len(SOURCE) - size)
    return SOURCE[start : start + size]


async def run_agent(
    gateway: Gateway, rollout_id: str, turns: int, observation_tokens: int, seed: int
) -> list[float]:
    """One rollout of ``turns`` model calls; returns each call's gateway time (ms)."""
    gateway.register(rollout_id, {"seed": seed})
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a software agent."},
        {"role": "user", "content": "Fix the failing test.\n" + observation(rng, 50)},
    ]
    timings = []
    for turn in range(turns):
        started = time.perf_counter()
        answer = await gateway.chat(rollout_id, {"messages": messages})
        timings.append((time.perf_counter() - started) * 1000)
        messages.append(answer.message)
        messages.append({"role": "user", "content": observation(rng, observation_tokens)})
        del turn
    return timings


def make_record(trajectory: Trajectory, rollout_id: str) -> RolloutRecord:
    return RolloutRecord(
        exp_id="long", rollout_key=f"{rollout_id}-0", rollout_id=rollout_id, task_index=0,
        group_id=rollout_id, group_index=0, sample_index=0, status="completed", reward=1.0,
        started_at=time.time(), elapsed_s=1.0, messages=trajectory.messages,
        trajectory=trajectory,
    )  # fmt: skip


async def measure(turns: int, observation_tokens: int, answer_tokens: int) -> Measured:
    gateway = build_gateway(f"sim://?latency_s=0&output_len={answer_tokens}")
    rollout_id = f"long-{turns}"
    timings = await run_agent(gateway, rollout_id, turns, observation_tokens, seed=turns)
    trajectory = await gateway.trajectory(rollout_id)
    sample = trajectory.samples[-1]
    sample_ids = orjson.dumps(sample.prompt_ids + sample.response_ids)
    record = make_record(trajectory, rollout_id)
    with tempfile.TemporaryDirectory() as root:
        store = FileStore(root, "long")
        started = time.perf_counter()
        store.write(record)
        written = time.perf_counter()
        read = store.get(record.rollout_key)
        read_back = time.perf_counter()
        assert read is not None and read.trajectory is not None
        export_records([read], Path(root) / "samples.jsonl", "jsonl")
        exported = time.perf_counter()
        record_bytes = len(stored(record))
    window = max(3, min(10, turns // 4))
    return Measured(
        turns=turns,
        context=len(sample.prompt_ids) + len(sample.response_ids),
        sample_ids_bytes=len(sample_ids),
        record_bytes=record_bytes,
        text_bytes=len(orjson.dumps(record.messages)),
        write_ms=(written - started) * 1000,
        read_ms=(read_back - written) * 1000,
        export_ms=(exported - read_back) * 1000,
        first_turns_ms=statistics.median(timings[1 : 1 + window]),
        last_turns_ms=statistics.median(timings[-window:]),
    )


def stored(record: RolloutRecord) -> bytes:
    """The record as the store writes it (the previous release, format 1: its JSON)."""
    return record.stored() if hasattr(record, "stored") else record.model_dump_json().encode()


def prompt_len(turn: Any) -> int:
    return turn.prompt_len if hasattr(turn, "prompt_len") else len(turn.prompt_ids)


def id_bytes(gateway: Gateway, rollout_ids: list[str]) -> int:
    """The bytes the gateway's ids and logprobs of ``rollout_ids`` take: each turn's containers
    (list or array; and the sequence tip's, in releases that kept one) and, in a list, each int
    or float object once (a small int Python caches costs nothing; an object two lists share
    counts once)."""
    seen: set[int] = set()
    total = 0
    for rollout_id in rollout_ids:
        state = gateway._rollouts[rollout_id]
        held = [state.tip.ids] if getattr(state, "tip", None) is not None else []
        for turn in state.turns:
            held += [getattr(turn, "new_prompt_ids", None), turn.completion_ids, turn.logprobs]
        for values in held:
            if values is None or id(values) in seen:
                continue
            seen.add(id(values))
            total += sys.getsizeof(values)
            if isinstance(values, list):
                for value in values:
                    if id(value) not in seen and not (isinstance(value, int) and value < 257):
                        seen.add(id(value))
                        total += sys.getsizeof(value)
    return total


@dataclass
class InFlight:
    held: int  # bytes traced by tracemalloc
    id_bytes: int  # of these, the ids and logprobs (``id_bytes``)
    ids: int  # the final contexts' ids

    @property
    def list_bytes(self) -> int:
        """The final contexts' ids as Python lists (an int object and a pointer a token)."""
        return self.ids * (sys.getsizeof(10_000) + 8)


async def in_flight_growth(
    rollouts: int, turns: int, observation_tokens: int, answer_tokens: int
) -> InFlight:
    """What the gateway holds with ``rollouts`` open at once after ``turns`` turns each, of that
    its ids and logprobs, and how many ids their final contexts have."""
    gateway = build_gateway(f"sim://?latency_s=0&output_len={answer_tokens}")
    await run_agent(gateway, "warm-up", 2, observation_tokens, seed=0)
    await gateway.unregister("warm-up")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    agents = [
        run_agent(gateway, f"r{i}", turns, observation_tokens, seed=i) for i in range(rollouts)
    ]
    await asyncio.gather(*agents)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    held_ids = id_bytes(gateway, [f"r{i}" for i in range(rollouts)])
    ids = 0
    for i in range(rollouts):
        last = (await gateway.trajectory(f"r{i}")).turns[-1]
        ids += prompt_len(last) + len(last.completion_ids)
    return InFlight(held, held_ids, ids)


async def main_async(args: argparse.Namespace) -> list[Measured]:
    rows = []
    print(
        f"{'turns':>6} {'context':>8} {'sample ids':>11} {'record':>11} {'ratio':>6} "
        f"{'less text':>9} {'write ms':>9} {'read ms':>8} {'export ms':>10} {'turn ms first':>14} "
        f"{'last':>6} {'ratio':>6}"
    )
    for turns in args.turns:
        m = await measure(turns, args.observation, args.answer)
        rows.append(m)
        print(
            f"{m.turns:>6} {m.context:>8} {m.sample_ids_bytes:>11,} {m.record_bytes:>11,} "
            f"{m.record_ratio:>5.2f}x {m.token_ratio:>8.2f}x {m.write_ms:>9.1f} {m.read_ms:>8.1f} "
            f"{m.export_ms:>10.1f} "
            f"{m.first_turns_ms:>14.3f} {m.last_turns_ms:>6.3f} {m.cpu_ratio:>5.2f}x"
        )
    if args.in_flight:
        f = await in_flight_growth(args.in_flight, args.flight_turns, args.observation, args.answer)
        print(
            f"{args.in_flight} rollouts of {args.flight_turns} turns in flight, {f.ids:,} ids: "
            f"the gateway holds {f.held / 2**20:,.0f} MiB ({f.held / f.ids:.1f} bytes an id), "
            f"{f.held / f.list_bytes:.2f}x their ids as lists (goal <= 2x); its ids and "
            f"logprobs {f.id_bytes / 2**20:,.0f} MiB, {f.id_bytes / f.ids:.2f} bytes an id, "
            f"{f.id_bytes / (4 * f.ids):.2f}x the ids as int32 (goal <= 1.3x)"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", default="10,40,100,200")
    parser.add_argument("--observation", type=int, default=540, help="tokens per observation")
    parser.add_argument("--answer", type=int, default=32, help="tokens per answer")
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--flight-turns", type=int, default=100)
    args = parser.parse_args(argv)
    args.turns = [int(t) for t in args.turns.split(",")]
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
