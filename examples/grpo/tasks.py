"""The tasks the loop trains on: ``one-word`` (the default) and ``calculator`` (harder).

``one-word``: short general-knowledge questions under the system prompt "Answer with exactly
one word."; the reward is half form (1/n for n words) and half truth (an accepted answer among
the words), 0 for a reply the token cap cut off. The untrained 135M model mostly rambles past
the cap, but a few replies in most groups stop early, so the group-normalised advantage has a
signal from the first step. Form alone is learnt too well: the model soon answers one made-up
word; the truth half keeps the words answers.

``calculator``: ``examples/calculator``'s tool-using agent (few-shot, up to four turns, tool
results between them): its samples hold several sampled spans with masked-out tool output,
which is what the ratio check must get right on multi-turn data.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.calculator.agent import CalculatorAgent
from rollway.agents import AgentLoop, RolloutContext
from rollway.results import AgentResult

SYSTEM_PROMPT = "Answer with exactly one word."

#: Questions and the one-word answers accepted (lowercase).
QUESTIONS: tuple[tuple[str, frozenset[str]], ...] = tuple(
    (question, frozenset(answers.split()))
    for question, answers in (
        ("What colour is the sky on a clear day?", "blue"),
        ("What is the capital of France?", "paris"),
        ("Name a fruit that is yellow.", "banana bananas lemon lemons mango pineapple"),
        ("What is the opposite of hot?", "cold cool"),
        ("Which animal says moo?", "cow cows cattle"),
        (
            "Name a planet in our solar system.",
            "mercury venus earth mars jupiter saturn uranus neptune",
        ),
        ("What is frozen water called?", "ice"),
        ("What do bees make?", "honey wax"),
        ("Which season comes after winter?", "spring"),
        ("What is the largest ocean on Earth?", "pacific"),
        ("What is the opposite of up?", "down"),
        ("Name a primary colour.", "red blue yellow"),
        ("What language is spoken in Spain?", "spanish castilian"),
        ("What do you call a baby cat?", "kitten kitty"),
        ("Which star is closest to the Earth?", "sun"),
        ("What is the colour of grass?", "green"),
        ("Name a musical instrument with strings.", "guitar violin cello harp viola banjo ukulele"),
        ("What do cows drink?", "water"),
        ("Which animal is known as the king of the jungle?", "lion"),
        ("What is the first day of the week?", "sunday monday"),
        ("Name a vegetable that is orange.", "carrot carrots pumpkin squash"),
        ("What do you use to write on a blackboard?", "chalk"),
        ("Which bird is a symbol of peace?", "dove pigeon"),
        ("What is the capital of Italy?", "rome"),
    )
)

_WORD = re.compile(r"\w+(?:'\w+)*")  # don't is one word


def one_word_reward(text: str | None, finish_reason: str, answers: frozenset[str]) -> float:
    """Half for the form (1/n for n words), half for naming an accepted answer; 0 for a reply
    the token cap cut off."""
    if finish_reason == "length":
        return 0.0
    words = [w.lower() for w in _WORD.findall(text or "")]
    if not words:
        return 0.0
    return 0.5 / len(words) + 0.5 * bool(answers.intersection(words))


class OneWordAgent(AgentLoop):
    """One turn: the question under the one-word system prompt, scored by its form."""

    name = "one-word"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": ctx.task["question"]},
        ]
        reply = await ctx.chat(messages)
        answers = frozenset(ctx.task["answers"])
        reward = one_word_reward(reply.content, reply.finish_reason, answers)
        return ctx.complete([*messages, reply.message], reply.finish_reason, reward=reward)


@dataclass(frozen=True)
class TaskSet:
    """An agent, its task rows (cycled through), and its token cap per call."""

    agent: type[AgentLoop]
    rows: tuple[dict[str, Any], ...]
    max_tokens: int

    def stream(self) -> Iterator[dict[str, Any]]:
        """The rows over and over (the step source takes as many as the run needs; each
        is a group at its own position, so passes never share a record)."""
        return itertools.cycle(self.rows)


def load_task_set(name: str) -> TaskSet:
    """The ``one-word`` or ``calculator`` task set."""
    if name == "one-word":
        rows = tuple(
            {"task_id": f"q{i}", "question": q, "answers": sorted(a)}
            for i, (q, a) in enumerate(QUESTIONS)
        )
        return TaskSet(OneWordAgent, rows, max_tokens=12)
    if name == "calculator":
        path = Path(__file__).resolve().parents[1] / "calculator" / "tasks.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = tuple(json.loads(line) for line in lines if line)
        return TaskSet(CalculatorAgent, rows, max_tokens=48)  # the agent's own cap
    raise ValueError(f"unknown task {name!r}: use one-word or calculator")
