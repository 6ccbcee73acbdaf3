"""How the records here were written: by rollway at commit 2d6975a (trajectory format 1),
``python make_records.py tests/store/records_v1`` from that commit's checkout. Kept to show
what they hold; run with this rollway it writes format-2 records instead."""

import shutil
import sys
from pathlib import Path

from rollway import RolloutClient, build_gateway
from rollway.agents.base import AgentLoop
from rollway.agents.context import RolloutContext
from rollway.results import AgentResult


class TwoConversations(AgentLoop):
    """Three turns of one conversation, then two of a fresh one: two segments."""

    name = "two-conversations"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [{"role": "user", "content": "Count to three."}]
        for step in range(3):
            answer = await ctx.chat(messages, max_tokens=6)
            observation = {"role": "user", "content": f"Observation {step}: go on."}
            messages += [answer.message, observation]
        fresh = [
            {"role": "system", "content": "Summary: counting."},
            {"role": "user", "content": "Again."},
        ]
        for _ in range(2):
            answer = await ctx.chat(fresh, max_tokens=5)
            fresh += [answer.message, {"role": "user", "content": "more"}]
        return ctx.complete(fresh[:-1])


ENGINES = {
    "embedded": ("embedded", {"temperature": 0.7, "top_p": 0.9}),
    "sim": ("sim://?latency_s=0&output_len=4", {}),
}

if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name, (spec, sampling) in ENGINES.items():
        root = Path("/tmp/v1store-" + name)
        shutil.rmtree(root, ignore_errors=True)
        agent, gateway = TwoConversations(), build_gateway(spec)
        with RolloutClient(agent, gateway, store=str(root), exp_id="v1", seed=3, **sampling) as c:
            record = c.invoke({"task_id": name}).result(120)
        assert record.status == "completed", record.reason
        (out / f"{name}.json").write_text(record.model_dump_json(indent=1))
