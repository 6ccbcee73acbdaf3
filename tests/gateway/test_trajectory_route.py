"""The HTTP trajectory route: format 2 as the model dumps it, and on request the samples and
each turn's whole prompt, whatever the rollout's metadata holds (an integer past 64 bits, as a
task's field copied there may be)."""

from __future__ import annotations

import orjson
from starlette.testclient import TestClient

from rollway.engines.sim import SimConfig, SimEngine
from rollway.gateway import Gateway, create_app
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.trajectory import Trajectory

KEY = {"Authorization": "Bearer admin"}


async def test_samples_and_whole_prompts_come_on_request(renderer: ChatRenderer) -> None:
    gateway = Gateway(SimEngine(SimConfig(output_len=4)), renderer, model_name="sim")
    gateway.register("r", {"metadata": {"answer": 2**70}})
    messages = [{"role": "user", "content": "Start."}]
    reply = await gateway.chat("r", {"messages": messages})
    messages += [reply.message, {"role": "user", "content": "More."}]
    await gateway.chat("r", {"messages": messages})
    recorded = await gateway.trajectory("r")
    with TestClient(create_app(gateway, admin_key="admin", close_engine=False)) as client:
        plain = client.get("/v1/rollouts/r/trajectory", headers=KEY)
        full = client.get("/v1/rollouts/r/trajectory?samples=true&whole_prompts=true",
                          headers=KEY)  # fmt: skip
        bad = client.get("/v1/rollouts/r/trajectory?samples=maybe", headers=KEY)
    assert plain.status_code == full.status_code == 200, full.text[:300]
    assert Trajectory.model_validate_json(plain.content) == recorded
    body = orjson.loads(full.content.replace(str(2**70).encode(), b"0"))
    assert str(2**70).encode() in full.content
    assert body["samples"] == [s.model_dump(mode="json") for s in recorded.samples]
    assert [t["prompt_ids"] for t in body["turns"]] == [
        recorded.prompt_ids(i) for i in range(len(recorded.turns))
    ]
    assert bad.status_code == 422 and "samples" in bad.text
