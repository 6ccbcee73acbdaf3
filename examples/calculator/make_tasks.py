"""Generate tasks.jsonl: arithmetic questions with their answers (seeded, reproducible)."""

from __future__ import annotations

import json
import random
from pathlib import Path

OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def make_tasks(count: int = 40, seed: int = 7) -> list[dict[str, object]]:
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        symbol = rng.choice(sorted(OPERATIONS))
        a, b = rng.randint(2, 60), rng.randint(2, 30)
        tasks.append(
            {
                "task_id": f"calc-{index:03d}",
                "question": f"What is {a} {symbol} {b}?",
                "answer": OPERATIONS[symbol](a, b),
            }
        )
    return tasks


if __name__ == "__main__":
    out = Path(__file__).with_name("tasks.jsonl")
    out.write_text("".join(json.dumps(t) + "\n" for t in make_tasks()))
    print(f"wrote {out}")
