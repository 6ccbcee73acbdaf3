"""The embedded engine under multi-turn rollouts: aggregate sampled tokens/s and prefix reuse.

Each rollout is a conversation of ``--turns`` turns on the engine directly (token ids in and
out, no gateway): turn k+1's prompt is turn k's prompt, its completion and a new user message,
as an agent's next turn is: a follow-up question after an observation of
``--observation-words`` words (what a tool returned; 0: the question alone). All rollouts
share a system prompt; they come as tasks of ``--group-size`` samples each (a GRPO group).
Completion lengths vary as they do in RL: each turn's ``max_tokens`` is drawn (seeded) from
``--min-tokens``..``--max-tokens`` (equal values give every turn the same length), and
sampling is seeded, at temperature 1.

At each concurrency N, ``--rollouts-per-slot`` x N rollouts run, N at a time (an RL batch larger
than the engine's concurrency: a rollout starts as soon as another ends), each on an engine
that starts cold over the same loaded model. Reported: sampled tokens/s over the wall time,
CPU seconds per 1000 sampled tokens (steadier than wall time on a shared machine),
the share of prompt tokens whose KV was reused (shared prefixes and the prefix cache) and the
prefix cache's hit rate (lookups that reused at least one token), where the engine has one.
Usage: python benchmarks/embedded_throughput.py [--concurrency 1 16] [--turns 3]
       [--min-tokens 8] [--max-tokens 64] [--observation-words 40] [--rollouts-per-slot 4]
       [--repeats 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass

from rollway.engines.embedded import EmbeddedEngine
from rollway.generation import SamplingParams

SYSTEM = (
    "You are a patient tutor. You answer in two or three short sentences, you explain your "
    "reasoning plainly, and you never invent facts you are not sure of."
)
TASKS = [
    "Why is the sky blue?",
    "How do plants make food?",
    "What causes the tides?",
    "Why do we have seasons?",
    "How does a rainbow form?",
    "What is a prime number?",
    "How do bees make honey?",
    "Why does ice float on water?",
    "How do volcanoes erupt?",
    "Why do cats purr?",
    "What makes thunder loud?",
    "How does a compass work?",
    "Why do leaves change colour?",
    "How do fish breathe?",
    "What is an echo?",
    "Why is the sea salty?",
]
FOLLOW_UPS = ["Can you say that more simply?", "Give me one example.", "Why does that matter?"]
#: Observations are windows of this text's words.
PASSAGE = (
    "Light from the sun is made of many colours. When it passes through the air, small "
    "molecules scatter the shorter blue waves far more than the longer red ones, so blue light "
    "reaches our eyes from every part of the sky. Plants capture light in their leaves and use "
    "it to turn water and carbon dioxide into sugar, releasing oxygen. The moon pulls on the "
    "oceans, raising two bulges of water that travel around the planet as it turns, and these "
    "bulges are the tides. The tilt of the earth's axis changes how directly sunlight strikes "
    "each half of the planet during the year, which gives us the seasons. Bees collect nectar, "
    "store it in wax cells and fan it with their wings until most of the water evaporates. Ice "
    "is less dense than liquid water because its molecules lock into an open crystal lattice."
)


@dataclass
class Run:
    sampled_tokens: int
    wall_s: float
    cpu_s: float
    prompt_tokens: int
    reused_tokens: int
    cache_hit_rate: float | None

    @property
    def tokens_per_s(self) -> float:
        return self.sampled_tokens / self.wall_s


def render(engine: EmbeddedEngine, messages: list[dict[str, str]]) -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    return engine.tokenizer.encode(text, add_special_tokens=False)


def next_user_turn(engine: EmbeddedEngine, output_ids: list[int], message: str) -> list[int]:
    """The tokens after a completion that close it and open the next user turn."""
    end = "" if output_ids and output_ids[-1] in engine.eos_token_ids else "<|im_end|>"
    text = f"{end}\n<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n"
    return engine.tokenizer.encode(text, add_special_tokens=False)


def user_message(rng: random.Random, turn: int, words: int) -> str:
    question = FOLLOW_UPS[turn % len(FOLLOW_UPS)]
    if not words:
        return question
    passage = PASSAGE.split()
    start = rng.randrange(len(passage) - words)
    return f"The search returned: {' '.join(passage[start : start + words])}\n{question}"


async def rollout(
    engine: EmbeddedEngine, index: int, group_size: int, args: argparse.Namespace
) -> tuple[int, int]:
    """One conversation; returns its sampled and prompt token counts."""
    task = TASKS[(index // group_size) % len(TASKS)]
    ids = render(engine, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}])
    sampled = prompted = 0
    for turn in range(args.turns):
        rng = random.Random(f"{index}-{turn}")
        limit = rng.randint(args.min_tokens, args.max_tokens)
        sampling = SamplingParams(temperature=1.0, max_tokens=limit, seed=index * 7 + turn)
        result = await engine.generate(ids, sampling, f"r{index}-t{turn}")
        sampled += len(result.output_ids)
        prompted += len(ids)
        message = user_message(rng, turn, args.observation_words)
        ids = ids + result.output_ids + next_user_turn(engine, result.output_ids, message)
    return sampled, prompted


async def measure(engine: EmbeddedEngine, concurrency: int, args: argparse.Namespace) -> Run:
    cache = getattr(engine, "prefix_cache", None)  # the engine before the prefix cache has none
    group_size = min(args.group_size, concurrency)
    gate = asyncio.Semaphore(concurrency)

    async def gated(index: int) -> tuple[int, int]:
        async with gate:
            return await rollout(engine, index, group_size, args)

    started, cpu = time.perf_counter(), time.process_time()
    rollouts = args.rollouts_per_slot * concurrency
    counts = await asyncio.gather(*[gated(i) for i in range(rollouts)])
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    return Run(
        sampled_tokens=sum(s for s, _ in counts),
        wall_s=wall,
        cpu_s=cpu,
        prompt_tokens=sum(p for _, p in counts),
        reused_tokens=engine.prefix_tokens_saved,
        cache_hit_rate=None if cache is None else cache.hits / max(cache.lookups, 1),
    )


async def main(args: argparse.Namespace) -> None:
    loaded = EmbeddedEngine.from_pretrained(dtype=args.dtype)
    try:
        hello = render(loaded, [{"role": "user", "content": "Hi"}])
        await loaded.generate(hello, SamplingParams(max_tokens=4), "warm-up")
        print(
            f"{args.turns} turns per rollout, {args.min_tokens}..{args.max_tokens} tokens per "
            f"turn, observations of {args.observation_words} words, group size "
            f"{args.group_size}, {args.rollouts_per_slot} rollouts per slot, {args.dtype} weights"
        )
        for concurrency in args.concurrency:
            for _ in range(args.repeats):
                engine = EmbeddedEngine(loaded.model, loaded.tokenizer, device=loaded.device)
                try:
                    run = await measure(engine, concurrency, args)
                finally:
                    await engine.close()
                hit = "n/a" if run.cache_hit_rate is None else f"{run.cache_hit_rate:.0%}"
                print(
                    f"concurrency {concurrency:>3}: {run.tokens_per_s:6.1f} sampled tokens/s "
                    f"({run.sampled_tokens} tokens in {run.wall_s:.1f} s, "
                    f"{1000 * run.cpu_s / run.sampled_tokens:.0f} CPU s per 1000), "
                    f"prompt tokens reused {run.reused_tokens / run.prompt_tokens:.0%}, "
                    f"prefix cache hit rate {hit}",
                    flush=True,
                )
    finally:
        await loaded.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument(
        "--dtype", default="float32", help="the embedded engine's weights: float32 or bfloat16"
    )
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--min-tokens", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--observation-words", type=int, default=40)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--rollouts-per-slot", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    asyncio.run(main(parser.parse_args()))
