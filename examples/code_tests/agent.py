"""A program agent that writes code: it asks the model for a Python function and saves the
reply's code as ``solution.py`` in its working folder (its sandbox's). It scores nothing
itself: ``reward.py`` runs the task's tests against that file, in the same sandbox, before the
sandbox is torn down. Nothing in it knows about rollway but the environment variables:

    rollway run --cmd "python examples/code_tests/agent.py" \
        --tasks examples/code_tests/tasks.jsonl --reward examples/code_tests/reward.py:passing_tests
"""

from __future__ import annotations

import json
import os
import re

from openai import OpenAI

SYSTEM = "You write Python. Reply with one ```python code block and nothing else."
_BLOCK = re.compile(r"```(?:python)?\n(.*?)(?:```|$)", re.DOTALL)


def code_of(reply: str) -> str:
    """The reply's first code block; the whole reply when it has none."""
    found = _BLOCK.search(reply)
    return found.group(1) if found else reply


def main() -> None:
    with open(os.environ["ROLLWAY_TASK_FILE"]) as f:
        task = json.load(f)
    client = OpenAI()  # reads OPENAI_BASE_URL and OPENAI_API_KEY
    reply = client.chat.completions.create(
        model=os.environ["OPENAI_MODEL"],
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task["prompt"]},
        ],
        max_tokens=96,
    )
    with open("solution.py", "w") as f:  # the working folder: the sandbox's
        f.write(code_of(reply.choices[0].message.content or ""))


if __name__ == "__main__":
    main()
