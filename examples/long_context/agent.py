"""A log-reader agent whose conversation outgrows the model's context: it reads a server log
chunk by chunk (about 1,000 tokens of log, 2,200 tokens through the model with its answers and
the template), with the embedded engine's context capped at 512 tokens (``context_length``,
vLLM's ``--max-model-len``: so that it runs in about the time of ``make run`` on 2 CPU cores;
the mechanism is the same at 128k), then names the access code the log gave. It runs to the end
only thanks to context folding (``rollway.agents.folding``): past its budget, the agent keeps
the task and its last exchanges. Each fold starts a new segment (5 or 6 a rollout here), and the
export has one sample per segment of each rollout.

Run it:  rollway run examples/long_context/agent.py:LogReaderAgent \
             --tasks examples/long_context/tasks.jsonl --group-size 2 \
             --engine "embedded://?context_length=512"
A task with ``"fold": false`` reads without folding: its rollout fails once the prompt no
longer fits the context.
"""

from __future__ import annotations

import random
from typing import Any

from rollway.agents import (
    AgentLoop,
    ContextFolding,
    KeepLastTurns,
    RolloutContext,
    SummarizeOlder,
)
from rollway.results import AgentResult

SYSTEM = (
    "You read a server log chunk by chunk. After each chunk, reply OK, or NOTE and what "
    "matters if the chunk holds an access code."
)
SERVICES = ("auth", "billing", "search", "upload", "mailer", "scheduler")


def log_chunk(task: dict[str, Any], index: int) -> str:
    """Chunk ``index`` of the task's log: ``lines`` lines, the code on one line of the chunk
    ``code_at``."""
    rng = random.Random(f"{task['seed']}-{index}")
    lines = []
    for line in range(task.get("lines", 3)):
        service, worker = rng.choice(SERVICES), rng.randrange(1, 64)
        lines.append(
            f"10:{index:02d}:{line:02d} INFO {service} worker-{worker} served request "
            f"{rng.randrange(10**6)} in {rng.randrange(1, 900)} ms"
        )
    if index == task["code_at"]:
        lines.insert(
            len(lines) // 2, f"10:{index:02d}:30 WARN auth temporary access code {task['code']}"
        )
    return "\n".join(lines)


def check_answer(task: dict[str, Any], text: str | None) -> bool:
    return str(task["code"]) in (text or "")


class LogReaderAgent(AgentLoop):
    name = "log-reader"
    #: Prompt tokens the conversation may take: the rest of the context is room for answers.
    budget = 450

    async def run(self, ctx: RolloutContext) -> AgentResult:
        task = ctx.task
        policies = [SummarizeOlder(keep_last=2)] if task.get("summarize") else [KeepLastTurns(2)]
        folding = ContextFolding(self.budget, policies) if task.get("fold", True) else None
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Find the access code in this log."},
        ]
        for index in range(task["chunks"]):
            chunk = log_chunk(task, index)
            messages.append({"role": "user", "content": f"Chunk {index + 1}:\n{chunk}"})
            if folding is not None:
                reply = await folding.chat(ctx, messages, max_tokens=8)
            else:
                reply = await ctx.chat(messages, max_tokens=8)
            messages.append(reply.message)
        messages.append({"role": "user", "content": "What is the access code? Only the code."})
        ask = folding.chat(ctx, messages, max_tokens=12) if folding else ctx.chat(messages)
        answer = await ask
        messages.append(answer.message)
        return ctx.complete(messages, reward=1.0 if check_answer(task, answer.content) else 0.0)
