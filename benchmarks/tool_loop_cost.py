"""The gateway's in-process CPU per turn of a tool loop, per model family, and the share of it
spent tokenizing; run by ``gateway_overhead.py --section families|prefix``.

Every answer is a tool call in the family's own shape (Qwen3: thinking, then a ``<tool_call>``
block), served by the scripted engine with the family's real tokenizer: each turn renders the
new messages, tokenizes them, decodes the answer, splits the reasoning and parses the call.
CPU is the process's (worker threads included) over the turns, the agents' loop and the
scripted engine with it; tokenizing is the CPU time of the Rust tokenizer's encode calls (on
the calling thread: the benchmark turns the tokenizer's own thread pool off, which a batch of
one text gains nothing from).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from rollway.engines.scripted import ScriptedEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.gateway.render.renderers import load_renderer
from rollway.model_folders import resolve_model_path

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # encode calls on the thread that makes them
FAMILIES = Path("~/.cache/rollway/families").expanduser()
LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a fact up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
#: ``question(index)``: rollout ``index``'s first user message.
Question = Callable[[int], str]


def model_folder(model: str) -> Path:
    """``smollm2`` (the default model), a family fetched by ``scripts/fetch_families.sh``
    (``qwen3``), or a folder."""
    if model == "smollm2":
        return Path(resolve_model_path())
    if "/" not in model and (FAMILIES / model).is_dir():
        return FAMILIES / model
    folder = Path(model).expanduser()
    if not (folder / "tokenizer_config.json").is_file():
        raise SystemExit(
            f"--model {model}: neither a fetched family (scripts/fetch_families.sh {model}) "
            "nor a model folder with a tokenizer_config.json"
        )
    return folder


def load(model: str) -> tuple[Any, ChatRenderer]:
    """The model's tokenizer and the renderer chosen for its folder, as the gateway does."""
    tokenizer = AutoTokenizer.from_pretrained(model_folder(model))
    return tokenizer, load_renderer(tokenizer)


def tool_call_completion(renderer: ChatRenderer) -> str:
    """An answer that calls ``lookup``, with thinking first where the family thinks."""
    call = json.dumps({"name": "lookup", "arguments": {"q": "the next fact"}})
    thought = "<think>\nI should look the next fact up.\n</think>\n\n" if renderer.thinking else ""
    return f"{thought}<tool_call>\n{call}\n</tool_call>{renderer.eos_text}"


def shared_prompt(tokens: int) -> tuple[str, list[dict[str, Any]]]:
    """A system prompt and tools of about ``tokens`` tokens together, as agentic RL tasks
    share them."""
    rules = "".join(
        f"Rule {n}: check each fact with a lookup before you rely on it in an answer.\n"
        for n in range(tokens // 40)
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{n}",
                "description": f"Tool number {n}: it searches the knowledge base for a topic.",
                "parameters": {
                    "type": "object",
                    "properties": {"topic": {"type": "string", "description": "What to find."}},
                    "required": ["topic"],
                },
            },
        }
        for n in range(tokens // 120)
    ]
    return f"You are a research agent.\n{rules}", [LOOKUP, *tools]


@dataclass
class Cost:
    turns: int
    cpu_s: float
    tokenize_s: float
    #: Characters given to the tokenizer to encode.
    encoded_chars: int
    segments: list[int]

    @property
    def cpu_us_per_turn(self) -> float:
        return self.cpu_s / self.turns * 1e6

    @property
    def tokenize_share(self) -> float:
        return self.tokenize_s / self.cpu_s


class TimedEncode:
    """The renderer's Rust encode call, its CPU time counted (what 'tokenizing' means here)."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.seconds = 0.0
        self.chars = 0
        self._encode = renderer._encode_fast
        renderer._encode_fast = self

    def __call__(self, texts: list[str], **kwargs: Any) -> Any:
        self.chars += sum(map(len, texts))
        started = time.thread_time()
        try:
            return self._encode(texts, **kwargs)
        finally:
            self.seconds += time.thread_time() - started


async def tool_loops(
    tokenizer: Any,
    renderer: ChatRenderer,
    *,
    rollouts: int,
    concurrency: int,
    turns: int,
    system: str | None,
    tools: list[dict[str, Any]],
    question: Question,
) -> Cost:
    """``rollouts`` tool loops of ``turns`` turns, ``concurrency`` at a time, in process."""
    answer = tokenizer.encode(tool_call_completion(renderer), add_special_tokens=False)
    engine = ScriptedEngine([answer] * (rollouts * turns), tokenizer)
    gateway = Gateway(engine, renderer, model_name="bench")
    timed = TimedEncode(renderer)
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with gate:
            rollout_id = f"t{index}"
            gateway.register(rollout_id, {"max_tokens": 64})
            head = [{"role": "system", "content": system}] if system else []
            messages = [*head, {"role": "user", "content": question(index)}]
            for step in range(turns):
                result = await gateway.chat(rollout_id, {"messages": messages, "tools": tools})
                message = dict(result.message)
                (call,) = message["tool_calls"]
                result_message = {"role": "tool", "tool_call_id": call["id"]}
                messages = [*messages, message, {**result_message, "content": f"fact {step}"}]

    cpu = time.process_time()
    await asyncio.gather(*[one(i) for i in range(rollouts)])
    cpu = time.process_time() - cpu
    renderer._encode_fast = timed._encode
    segments = [(await gateway.trajectory(f"t{i}")).segment_count for i in range(rollouts)]
    return Cost(rollouts * turns, cpu, timed.seconds, timed.chars, segments)


def render_and_parse_us(tokenizer: Any, renderer: ChatRenderer, calls: int = 2000) -> float:
    """A turn's renderer work alone, best of 5 (us): the answer decoded, its reasoning and
    tool call parsed, and a tool result's ids appended after it."""
    completion = tool_call_completion(renderer)
    ids = tokenizer.encode(completion, add_special_tokens=False)
    result = [{"role": "tool", "tool_call_id": "call_1", "content": "fact 3"}]

    def turn() -> None:
        renderer.parse(renderer.decode(ids[:-1]), True)
        renderer.continuation_ids(ids, result, [LOOKUP])

    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(calls):
            turn()
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


def families(models: list[str], rollouts: int, turns: int, repeats: int) -> dict[str, list[Cost]]:
    """Each model's CPU per turn (median of ``repeats``, interleaved) on a short tool loop:
    one user question, one tool; the ratio of each to the first."""
    loaded = {model: load(model) for model in models}
    runs: dict[str, list[Cost]] = {model: [] for model in models}
    for _ in range(repeats):
        for model, (tokenizer, _) in loaded.items():
            renderer = load_renderer(tokenizer)  # fresh: no model's caches warm from a run
            cost = asyncio.run(
                tool_loops(
                    tokenizer, renderer, rollouts=rollouts, concurrency=64, turns=turns,
                    system=None, tools=[LOOKUP], question=lambda i: f"What is fact {i}?",
                )
            )  # fmt: skip
            runs[model].append(cost)
    print(f"\nin-process CPU per turn, {turns}-turn tool loops, 64 concurrent, one tool:")
    medians: dict[str, float] = {}
    for model, costs in runs.items():
        per_turn = sorted(c.cpu_us_per_turn for c in costs)
        medians[model] = per_turn[len(per_turn) // 2]
        print(
            f"  {model:<10} {loaded[model][1].name:<7} median {medians[model]:5.0f} us/turn "
            f"(min {per_turn[0]:.0f}, max {per_turn[-1]:.0f})  ratio to {models[0]} "
            f"{medians[model] / medians[models[0]]:4.2f}  segments/rollout {max(costs[0].segments)}"
        )
    print("a turn's rendering and parsing alone (decode, reasoning, tool call, tool result ids):")
    alone = {model: render_and_parse_us(*loaded[model]) for model in models}
    for model, us in alone.items():
        print(f"  {model:<10} {us:5.1f} us/turn  ratio to {models[0]} {us / alone[models[0]]:4.2f}")
    return runs


def shared_prefix(model: str, tokens: int, rollouts: int, turns: int) -> dict[str, Cost]:
    """64 concurrent tool loops whose tasks share a system prompt and tools of ~``tokens``
    tokens and differ in their question: first prompts whole (before) and by pieces."""
    tokenizer, renderer = load(model)
    system, tools = shared_prompt(tokens)
    rendered = renderer.render(
        [{"role": "system", "content": system}], tools, add_generation_prompt=False
    )
    shared = len(renderer.encode(rendered))
    print(f"\n{model}: {turns}-turn tool loops, 64 concurrent, {rollouts} tasks sharing a "
          f"{shared}-token system prompt + {len(tools)} tools, distinct questions:")  # fmt: skip
    costs: dict[str, Cost] = {}
    for label in ("whole prompts", "by pieces"):
        renderer = load_renderer(tokenizer)
        if label == "whole prompts":
            renderer.prompt_pieces = None
        costs[label] = cost = asyncio.run(
            tool_loops(
                tokenizer, renderer, rollouts=rollouts, concurrency=64, turns=turns,
                system=system, tools=tools, question=lambda i: f"Question {i}: what is fact {i}?",
            )
        )  # fmt: skip
        print(
            f"  {label:<14} {cost.cpu_us_per_turn:7.0f} us/turn CPU, tokenizing "
            f"{cost.tokenize_s / cost.turns * 1e6:6.0f} us/turn = {cost.tokenize_share:5.1%}"
        )
    return costs
