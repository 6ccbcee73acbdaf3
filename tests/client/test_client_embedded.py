"""The calculator example end to end on the embedded model: exact samples, rewards, aborts."""

from __future__ import annotations

from pathlib import Path

from examples.calculator.agent import CalculatorAgent, check_answer

from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult

TASKS = [
    {"task_id": "add", "question": "What is 11 + 14?", "answer": 25},
    {"task_id": "mul", "question": "What is 6 * 7?", "answer": 42},
]


def test_calculator_batch_records_exact_samples_and_checked_rewards(
    engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path: Path
) -> None:
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    with RolloutClient(CalculatorAgent, gateway, store=str(tmp_path), seed=1) as client:
        items = list(client.run_batch(TASKS, group_size=2))
    assert len(items) == 4 and all(i.success for i in items)
    for item in items:
        record = item.result
        trajectory = record.trajectory
        assert record.group_id.endswith(record.task["task_id"])
        sampled = sum(sum(s.loss_mask) for s in trajectory.samples)
        assert sampled == record.metrics.response_tokens
        assert record.metrics.llm_calls == len(trajectory.turns)
        final = trajectory.messages[-1]["content"]
        assert record.reward == (1.0 if check_answer(record.task, final) else 0.0)


class LongTalker(AgentLoop):
    """Asks for a long answer (greedy: 122 tokens): its generation outlasts a short timeout
    however fast the engine (a short calculator answer, its prompt cached, can finish in one)."""

    name = "long-talker"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        ask = [{"role": "user", "content": "Count from 1 to 500, one number per line."}]
        reply = await ctx.chat(ask, max_tokens=1000)
        return ctx.complete([*ask, reply.message])


def test_timeout_aborts_the_embedded_generation(
    engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path: Path
) -> None:
    gateway = Gateway(engine, renderer, model_name="SmolLM2-135M-Instruct")
    aborted = engine.aborted_total
    # A generous grace: the abort lands at the next decode step, after a slow CPU prefill.
    client = RolloutClient(
        LongTalker, gateway, store=str(tmp_path), timeout=0.5, stop_grace_s=120, temperature=0
    )
    with client:
        (item,) = client.run_batch([{"task_id": "long"}])
    record = item.result
    assert record.status == "timeout"
    assert record.trajectory.turns[-1].finish_reason == "abort"
    assert engine.aborted_total == aborted + 1
