"""Simulated inference servers: SGLang's native API, vLLM's token-in/token-out completions and
a plain OpenAI chat-completions API, backed by the simulated engine, with fault injection. Load
generators and fault injectors for tests of remote-engine protocols, never a model.

Each counts generations per request id (``GET /rollway/stats``) so tests can prove that a
request ran exactly once and that nothing is left running after an abort.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from starlette.applications import Starlette

from rollway.engines.sim import SimConfig
from rollway.simulators import openai_server, sglang_server, vllm_server
from rollway.simulators.common import Fault, SimServerState, Simulator, test_routes

Protocol = Literal["sglang", "vllm", "openai"]

__all__ = ["Fault", "Protocol", "SimServerState", "create_sim_server_app"]


def create_sim_server_app(
    config: SimConfig | None = None,
    *,
    protocol: Protocol = "sglang",
    fault: Fault = "none",
    fault_count: int = 1 << 30,
    server_version: str | None = None,
    dev_mode: bool = True,
) -> Starlette:
    """``fault`` hits the first ``fault_count`` generate calls: ``drop`` cuts the response
    mid-body, ``5xx`` answers 503 after generating, ``hang`` never finishes until aborted.
    ``server_version``: the SGLang or vLLM release to imitate (default: the newest);
    ``dev_mode``: vLLM run with ``VLLM_SERVER_DEV_MODE=1`` (its pause and weight routes)."""
    sim = Simulator(config or SimConfig(), fault, fault_count)
    if protocol == "sglang":
        sglang_options = sglang_server.SGLangSimConfig(version=server_version or "latest")
        served = sglang_server.routes(sim, sglang_options)
    elif protocol == "vllm":
        vllm_options = vllm_server.VLLMSimConfig(dev_mode=dev_mode)
        if server_version:
            vllm_options = dataclasses.replace(vllm_options, version=server_version)
        served = vllm_server.routes(sim, vllm_options)
    else:
        served = openai_server.routes(sim)
    app = Starlette(routes=served + test_routes(sim))
    app.state.sim = sim.state
    return app
