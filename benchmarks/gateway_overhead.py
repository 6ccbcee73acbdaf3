"""What the gateway costs per turn, and what the embedded engine delivers.

1. Added latency per turn, simulated engine at zero latency: p50/p99 of a multi-turn tool
   conversation through the gateway (in-process call, and HTTP to a `rollway gateway`
   subprocess) against calling the engine directly, at concurrency 1 and 256; and against the
   floor, the engine plus the tokenizing any token-exact agent loop does itself.
2. Throughput at 256 concurrent rollouts as a ratio to calling the engine directly, at zero
   engine latency (pure overhead) and at a realistic engine latency.
3. Embedded engine aggregate tokens/s at 1, 4 and 16 concurrent requests.
4. ``families``: in-process CPU per turn of a tool loop whose answers are tool calls in the
   family's shape, SmolLM2 against ``--model`` (e.g. ``qwen3``: thinking, ``<tool_call>``).
5. ``prefix``: 64 concurrent tool loops whose tasks share a ~2k-token system prompt and tools:
   CPU per turn and the share spent tokenizing, first prompts tokenized whole and by pieces.

Usage: python benchmarks/gateway_overhead.py [--quick] [--model qwen3] [--section NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.tool_loop_cost import families, load, shared_prefix

from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.generation import SamplingParams
from rollway.model_folders import resolve_model_path

TURNS = 5
TOOL = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}
FIRST = [{"role": "user", "content": "Look things up until you know the answer."}]


@dataclass
class Run:
    latencies_s: list[float]
    wall_s: float

    @property
    def turns_per_s(self) -> float:
        return len(self.latencies_s) / self.wall_s

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000.0


TurnFn = Callable[[str, list[dict]], Awaitable[dict]]


async def drive(turn: TurnFn, rollouts: int, concurrency: int) -> Run:
    """``rollouts`` conversations of TURNS turns, ``concurrency`` at a time."""
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with gate:
            rollout_id = f"b{index}-{uuid.uuid4().hex[:6]}"
            messages = list(FIRST)
            for step in range(TURNS):
                started = time.perf_counter()
                message = await turn(rollout_id, messages)
                latencies.append(time.perf_counter() - started)
                messages = [*messages, message, {"role": "tool", "content": f"fact {step}"}]

    started = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(rollouts)])
    return Run(latencies, time.perf_counter() - started)


def direct_turns(engine: SimEngine, renderer: ChatRenderer, own_tokens: bool = False) -> TurnFn:
    """The baseline: the engine alone, on the same prompt ids the gateway would send. With
    ``own_tokens``, the floor: the engine plus what a token-exact agent loop calling it directly
    must do anyway each turn (decode the answer, tokenize the tool result into the template);
    no recording, no tool-call parsing, no checks."""
    prompts: dict[str, list[int]] = {}
    sampling = SamplingParams(max_tokens=64)

    async def turn(rollout_id: str, messages: list[dict]) -> dict:
        if rollout_id not in prompts:
            prompts[rollout_id] = renderer.prompt_ids(FIRST, [TOOL])
        ids = prompts[rollout_id]
        result = await engine.generate(ids, sampling, rollout_id)
        ids += result.output_ids
        if not own_tokens:
            return {"role": "assistant", "content": "x"}
        text = renderer.decode(result.output_ids)
        tool_result = {"role": "tool", "content": f"fact {len(messages) // 2}"}
        ids += renderer.continuation_ids(result.output_ids, [tool_result], [TOOL]) or []
        return {"role": "assistant", "content": text}

    return turn


def in_process_turns(gateway: Gateway) -> TurnFn:
    async def turn(rollout_id: str, messages: list[dict]) -> dict:
        if len(messages) == 1:
            gateway.register(rollout_id, {"max_tokens": 64})
        result = await gateway.chat(rollout_id, {"messages": messages, "tools": [TOOL]})
        return result.message

    return turn


def http_turns(session: aiohttp.ClientSession, url: str, admin_key: str) -> TurnFn:
    keys: dict[str, str] = {}
    admin = {"Authorization": f"Bearer {admin_key}"}

    async def turn(rollout_id: str, messages: list[dict]) -> dict:
        base = f"{url}/v1/rollouts/{rollout_id}"
        if rollout_id not in keys:
            async with session.post(
                f"{base}/register", json={"max_tokens": 64}, headers=admin
            ) as r:
                keys[rollout_id] = (await r.json())["api_key"]
        headers = {"Authorization": f"Bearer {keys[rollout_id]}"}
        body = {"messages": messages, "tools": [TOOL]}
        async with session.post(f"{base}/chat/completions", json=body, headers=headers) as r:
            r.raise_for_status()
            return (await r.json())["choices"][0]["message"]

    return turn


def start_http_gateway(engine_spec: str, admin_key: str) -> tuple[subprocess.Popen, str]:
    """`rollway gateway` in its own process, as in production; client and server get a core each."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "rollway", "gateway", "--engine", engine_spec, "--port", str(port)]
    env = {**os.environ, "ROLLWAY_ADMIN_KEY": admin_key}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read().decode()) from None
            time.sleep(0.1)
    raise RuntimeError("gateway did not start")


def report(label: str, base: Run, run: Run) -> None:
    print(
        f"  {label:<20} p50 {run.pct(0.5):8.3f} ms  p99 {run.pct(0.99):8.3f} ms  "
        f"added p50 {run.pct(0.5) - base.pct(0.5):7.3f} ms  "
        f"{run.turns_per_s:7.0f} turns/s  ratio to direct {run.turns_per_s / base.turns_per_s:5.2f}"
    )


async def compare(
    config: SimConfig, renderer: ChatRenderer, rollouts: int, concurrency: int
) -> None:
    """Direct engine calls, the gateway in-process, and over HTTP, on one engine config."""
    latency = f"{config.latency_s * 1000:.0f} ms" if config.latency_s else "zero latency"
    print(f"\nsimulated engine at {latency}, {concurrency} concurrent rollouts:")
    engine = SimEngine(config)
    base = await drive(direct_turns(engine, renderer), rollouts, concurrency)
    report("direct engine call", base, base)
    floor = await drive(direct_turns(engine, renderer, own_tokens=True), rollouts, concurrency)
    report("direct + own tokens", base, floor)
    gateway = Gateway(engine, renderer, model_name="sim")
    in_process = await drive(in_process_turns(gateway), rollouts, concurrency)
    report("gateway in-process", base, in_process)
    print(f"  {'':<20} in-process to direct + own tokens: "
          f"{in_process.turns_per_s / floor.turns_per_s:5.2f}")  # fmt: skip
    admin_key = secrets.token_hex(8)
    spec = f"sim://?latency_s={config.latency_s}&output_len={config.output_len}"
    proc, url = start_http_gateway(spec, admin_key)
    try:
        connector = aiohttp.TCPConnector(limit=1024)
        async with aiohttp.ClientSession(connector=connector) as session:
            http = http_turns(session, url, admin_key)
            report("gateway over HTTP", base, await drive(http, rollouts, concurrency))
    finally:
        proc.terminate()
        proc.wait()


async def overhead(renderer: ChatRenderer, quick: bool) -> None:
    scale = 4 if quick else 1
    await compare(SimConfig(output_len=16), renderer, 200 // scale, 1)
    await compare(SimConfig(output_len=16), renderer, 1024 // scale, 256)
    await compare(SimConfig(output_len=16, latency_s=0.5), renderer, 1024 // scale, 256)


async def embedded_throughput(quick: bool) -> None:
    engine = EmbeddedEngine.from_pretrained()
    renderer = ChatRenderer(engine.tokenizer)
    ids = renderer.prompt_ids([{"role": "user", "content": "Tell me about the ocean."}], None)
    tokens = 16 if quick else 32
    print(f"\nembedded engine ({engine.device}), {tokens} tokens per request:")
    try:
        for concurrency in (1, 4, 16):
            sampling = SamplingParams(max_tokens=tokens, stop_token_ids=(), seed=1)
            started = time.perf_counter()
            results = await asyncio.gather(
                *[engine.generate(ids, sampling, f"t{concurrency}-{i}") for i in range(concurrency)]
            )
            wall = time.perf_counter() - started
            produced = sum(len(r.output_ids) for r in results)
            print(f"  concurrency {concurrency:>2}: {produced / wall:7.1f} tokens/s aggregate")
    finally:
        await engine.close()


SECTIONS = ("overhead", "embedded", "families", "prefix")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rollouts and tokens")
    parser.add_argument(
        "--model",
        default="smollm2",
        help="smollm2, a family fetched by scripts/fetch_families.sh (qwen3), or a model folder: "
        "its tokenizer, template and renderer (the embedded engine runs SmolLM2 always)",
    )
    parser.add_argument(
        "--section", action="append", choices=SECTIONS, help="run only these (repeatable)"
    )
    parser.add_argument("--rollouts", type=int, default=0, help="families/prefix: tasks")
    parser.add_argument("--shared-tokens", type=int, default=2000, help="prefix: shared size")
    return parser.parse_args(argv)


def main() -> None:
    args = parse()
    sections = args.section or SECTIONS
    print(f"{TURNS}-turn tool conversations; each turn appends a tool result.")
    if "overhead" in sections:
        if args.model == "smollm2":
            renderer = ChatRenderer(AutoTokenizer.from_pretrained(resolve_model_path()))
        else:  # the HTTP gateway serves SmolLM2: its ids would not be the model's
            renderer = load(args.model)[1]
        asyncio.run(overhead(renderer, args.quick))
    if "embedded" in sections:
        asyncio.run(embedded_throughput(args.quick))
    rollouts = args.rollouts or (64 if args.quick else 256)
    if "families" in sections:
        models = ["smollm2", *([args.model] if args.model != "smollm2" else [])]
        families(models, rollouts, TURNS, repeats=1 if args.quick else 5)
    if "prefix" in sections:
        shared_prefix(args.model, args.shared_tokens, rollouts, TURNS)


if __name__ == "__main__":
    main()
