"""An LLM judge as the reward: the calculator's answers graded by a model, through rollway's
own gateway (the policy's engine here; ``engine="embedded"`` or ``"vllm://host:port"`` for
another), each judge call kept in the record's ``reward_info["judge_calls"]``.

Run it on the embedded model:
    rollway run examples/calculator/agent.py:CalculatorAgent \
        --tasks examples/calculator/tasks.jsonl --limit 4 --reward examples/judge/reward.py:judge
or in Python, ``python -m examples.judge.reward``, which prints each judge call.
"""

from __future__ import annotations

from rollway import Judge, RolloutClient, Rubric
from rollway.trajectory import Trajectory

PROMPT = (
    "Question: {question}\nThe right answer is {task[answer]}.\nA student answered: {answer}\n\n"
    'Is the student right? Reply with one line "Score: 10" if so, "Score: 0" if not.'
)


def grade(task: dict[str, object], trajectory: Trajectory) -> float:
    """The exact check, for comparison with the judge's opinion."""
    answer = trajectory.turns[-1].content if trajectory.turns else None
    return 1.0 if str(task["answer"]) in (answer or "") else 0.0


#: The judge alone: a score of 0 to 10, read as 0 to 1.
judge = Judge(PROMPT, sampling={"max_tokens": 16})
#: The judge and the exact check, each a component of the reward.
rubric = Rubric({"judge": judge, "exact": grade}, weights={"judge": 0.5})


def main() -> None:
    from examples.calculator.agent import CalculatorAgent

    tasks = [{"question": "What is 6 * 7?", "answer": 42}]
    with RolloutClient(CalculatorAgent, "embedded", reward=rubric, exp_id="judge-demo") as client:
        for item in client.run_batch(tasks):
            record = item.result
            print(record.status, record.reward, record.reward_components)
            for call in record.reward_info.get("judge_calls", []):
                print(f"  judge said {call['answer']!r} -> {call.get('score')}")


if __name__ == "__main__":
    main()
