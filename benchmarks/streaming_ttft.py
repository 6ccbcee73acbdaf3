"""Time to first token and total time of a chat completion through the gateway over HTTP,
streamed (``stream: true``) against not, on the embedded engine and on the simulated engine
paced like a server. Not streamed, the first token comes with the last.

Usage: python benchmarks/streaming_ttft.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import time
import uuid
from typing import Any

import aiohttp
import orjson

from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.web.background_server import BackgroundServer

QUESTION = [{"role": "user", "content": "Tell me a short story about a lighthouse."}]


async def one_call(
    http: aiohttp.ClientSession, url: str, admin: str, stream: bool, max_tokens: int
) -> tuple[float, float]:
    """(seconds to the first content, seconds to the end) of one call on a new rollout."""
    rollout = f"{url}/v1/rollouts/b-{uuid.uuid4().hex[:10]}"
    async with http.post(f"{rollout}/register", json={},
                         headers={"Authorization": f"Bearer {admin}"}) as reply:  # fmt: skip
        key = (await reply.json())["api_key"]
    body = {"messages": QUESTION, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    started, first = time.perf_counter(), None
    async with http.post(f"{rollout}/chat/completions", json=body,
                         headers={"Authorization": f"Bearer {key}"}) as reply:  # fmt: skip
        reply.raise_for_status()
        if not stream:
            await reply.read()
            done = time.perf_counter() - started
            return done, done
        async for line in reply.content:
            if first is None and _has_content(line):
                first = time.perf_counter() - started
    done = time.perf_counter() - started
    return (done if first is None else first), done


def _has_content(line: bytes) -> bool:
    if not line.startswith(b"data: {"):
        return False
    chunk: dict[str, Any] = orjson.loads(line[6:])
    return any(c.get("delta", {}).get("content") for c in chunk.get("choices", []))


async def measure(url: str, admin: str, repeats: int, max_tokens: int) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    async with aiohttp.ClientSession() as http:
        await one_call(http, url, admin, True, 4)  # warm up
        for _ in range(repeats):
            for stream in (False, True):
                ttft, total = await one_call(http, url, admin, stream, max_tokens)
                mode = "streamed" if stream else "plain"
                figures.setdefault(f"{mode} ttft", []).append(ttft)
                figures.setdefault(f"{mode} total", []).append(total)
    return figures


def report(name: str, figures: dict[str, list[float]]) -> None:
    median = {k: statistics.median(v) * 1000.0 for k, v in figures.items()}
    print(f"\n{name}")
    for mode in ("plain", "streamed"):
        print(f"  {mode:9s} first token {median[f'{mode} ttft']:8.1f} ms"
              f"   total {median[f'{mode} total']:8.1f} ms")  # fmt: skip
    ratio = median["streamed ttft"] / median["plain ttft"]
    print(f"  streamed/plain time to first token: {ratio:.3f}")


def bench(name: str, engine: Any, renderer: ChatRenderer, repeats: int, max_tokens: int) -> None:
    gateway = Gateway(engine, renderer, model_name="bench")
    admin = f"ak-{secrets.token_hex(8)}"
    with BackgroundServer(create_app(gateway, admin_key=admin, close_engine=False)) as url:
        report(name, asyncio.run(measure(url, admin, repeats, max_tokens)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter answers")
    args = parser.parse_args()
    repeats, tokens = (2, 32) if args.quick else (5, 128)
    embedded = EmbeddedEngine.from_pretrained()
    renderer = ChatRenderer(embedded.tokenizer)
    bench(f"embedded engine, {tokens} tokens", embedded, renderer, repeats, tokens)
    paced = SimEngine(SimConfig(latency_s=0.05, per_token_s=0.01, output_len=tokens))
    bench(f"sim engine, 50 ms + 10 ms/token, {tokens} tokens", paced, renderer, repeats, tokens)
    asyncio.run(embedded.close())


if __name__ == "__main__":
    main()
