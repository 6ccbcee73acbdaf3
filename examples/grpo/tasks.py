"""The tasks the loop trains on: ``one-word`` (the default) and ``calculator`` (harder).

``one-word``: short general-knowledge questions under the system prompt "Answer with exactly
one word."; the reward is a ``Rubric``, half form (1/n for n words) and half truth (an accepted
answer among the words), each 0 for a reply the token cap cut off: the two are the reward's
components, in ``metrics.jsonl``, the plot and the run's summary. The untrained 135M model
mostly rambles past the cap, but a few replies in most groups stop early, so the
group-normalised advantage has a signal from the first step. Form alone is learnt too well:
the model soon answers one made-up word; the truth half keeps the words answers.

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
from rollway import RewardFn, Rubric
from rollway.agents import AgentLoop, RolloutContext
from rollway.results import AgentResult
from rollway.trajectory import Trajectory

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
    return 0.5 * form(text, finish_reason) + 0.5 * truth(text, finish_reason, answers)


def form(text: str | None, finish_reason: str) -> float:
    """1/n for a reply of n words; 0 for none, or one the token cap cut off."""
    words = _words(text, finish_reason)
    return 1.0 / len(words) if words else 0.0


def truth(text: str | None, finish_reason: str, answers: frozenset[str]) -> float:
    """1 when an accepted answer is among the reply's words (0 for a reply cut off)."""
    return float(bool(answers.intersection(_words(text, finish_reason))))


def _words(text: str | None, finish_reason: str) -> list[str]:
    return [] if finish_reason == "length" else [w.lower() for w in _WORD.findall(text or "")]


def _reply(trajectory: Trajectory) -> tuple[str | None, str]:
    """The rollout's one reply, as the gateway recorded it, and why it ended."""
    last = trajectory.turns[-1] if trajectory.turns else None
    return (last.content, last.finish_reason) if last is not None else (None, "length")


def form_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    return form(*_reply(trajectory))


def truth_reward(task: dict[str, Any], trajectory: Trajectory) -> float:
    return truth(*_reply(trajectory), frozenset(task["answers"]))


#: The one-word reward: its two halves, each a component of the reward.
ONE_WORD_RUBRIC = Rubric({"form": form_reward, "truth": truth_reward}, {"form": 0.5, "truth": 0.5})


class OneWordAgent(AgentLoop):
    """One turn: the question under the one-word system prompt (scored by ``ONE_WORD_RUBRIC``
    on the recorded reply)."""

    name = "one-word"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": ctx.task["question"]},
        ]
        reply = await ctx.chat(messages)
        return ctx.complete([*messages, reply.message], reply.finish_reason)


@dataclass(frozen=True)
class TaskSet:
    """An agent, its task rows (cycled through), its token cap per call, and the reward
    function the client scores rollouts with (None: the agent's own reward)."""

    agent: type[AgentLoop]
    rows: tuple[dict[str, Any], ...]
    max_tokens: int
    reward: RewardFn | None = None

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
        return TaskSet(OneWordAgent, rows, max_tokens=12, reward=ONE_WORD_RUBRIC)
    if name == "calculator":
        path = Path(__file__).resolve().parents[1] / "calculator" / "tasks.jsonl"
        lines = path.read_text(encoding="utf-8").splitlines()
        rows = tuple(json.loads(line) for line in lines if line)
        return TaskSet(CalculatorAgent, rows, max_tokens=48)  # the agent's own cap
    raise ValueError(f"unknown task {name!r}: use one-word or calculator")
