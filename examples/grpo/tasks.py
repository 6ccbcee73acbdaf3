"""The tasks the loop trains on: ``one-word`` (the default) and ``calculator`` (harder).

``one-word``: short questions under the system prompt "Answer with exactly one word."; the
reward is the reply's form, not its truth: 1 for one word, 1/n for n words, 0 for a reply the
token cap cut off. The untrained 135M model mostly rambles past the cap, but a few of every
group already stop early, so the group-normalised advantage has a signal from the first step.

``calculator``: ``examples/calculator``'s tool-using agent (few-shot, up to four turns, tool
results between them): its samples hold several sampled spans with masked-out tool output,
which is what the ratio check must get right on multi-turn data.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.calculator.agent import CalculatorAgent
from rollway.agents import AgentLoop, RolloutContext
from rollway.types import RolloutResult

SYSTEM_PROMPT = "Answer with exactly one word."

QUESTIONS = (
    "What colour is the sky on a clear day?",
    "What is the capital of France?",
    "Name a fruit that is yellow.",
    "What is the opposite of hot?",
    "Which animal says moo?",
    "Name a planet in our solar system.",
    "What is frozen water called?",
    "What do bees make?",
    "Which season comes after winter?",
    "What is the largest ocean on Earth?",
    "What is the opposite of up?",
    "Name a primary colour.",
    "What language is spoken in Spain?",
    "What do you call a baby cat?",
    "Which star is closest to the Earth?",
    "What is the colour of grass?",
    "Name a musical instrument with strings.",
    "What do cows drink?",
    "Which animal is known as the king of the jungle?",
    "What is the first day of the week?",
    "Name a vegetable that is orange.",
    "What do you use to write on a blackboard?",
    "Which bird is a symbol of peace?",
    "What is the capital of Italy?",
)

_WORD = re.compile(r"\w+(?:'\w+)*")  # don't is one word


def one_word_reward(text: str | None, finish_reason: str) -> float:
    """1 for a one-word reply, 1/n for n words, 0 when cut off by the token cap or empty."""
    if finish_reason == "length":
        return 0.0
    words = _WORD.findall(text or "")
    return 1.0 / len(words) if words else 0.0


class OneWordAgent(AgentLoop):
    """One turn: the question under the one-word system prompt, scored by its form."""

    name = "one-word"

    async def run(self, ctx: RolloutContext) -> RolloutResult:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": ctx.task["question"]},
        ]
        reply = await ctx.chat(messages)
        reward = one_word_reward(reply.content, reply.finish_reason)
        return ctx.complete([*messages, reply.message], reply.finish_reason, reward=reward)


@dataclass(frozen=True)
class TaskSet:
    """An agent, its task rows (cycled through, step by step), and its token cap per call."""

    agent: type[AgentLoop]
    rows: tuple[dict[str, Any], ...]
    max_tokens: int

    def for_step(self, step: int, count: int) -> list[dict[str, Any]]:
        """``count`` rows for ``step``; ids carry the step, so steps never share a record."""
        start = step * count
        picked = [self.rows[(start + i) % len(self.rows)] for i in range(count)]
        return [{**row, "task_id": f"s{step}-{row['task_id']}"} for row in picked]


def load_task_set(name: str) -> TaskSet:
    """The ``one-word`` or ``calculator`` task set."""
    if name == "one-word":
        rows = tuple({"task_id": f"q{i}", "question": q} for i, q in enumerate(QUESTIONS))
        return TaskSet(OneWordAgent, rows, max_tokens=12)
    if name == "calculator":
        path = Path(__file__).resolve().parents[1] / "calculator" / "tasks.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = tuple(json.loads(line) for line in lines if line)
        return TaskSet(CalculatorAgent, rows, max_tokens=48)  # the agent's own cap
    raise ValueError(f"unknown task {name!r}: use one-word or calculator")
