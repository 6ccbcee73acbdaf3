"""Simulated inference servers: SGLang's native API, vLLM's token-in/token-out completions and
a plain OpenAI chat-completions API, backed by the simulated engine, with fault injection. Load
generators and fault injectors for tests of remote-engine protocols, never a model.

Each counts generations per request id (``GET /rollway/stats``) so tests can prove that a
request ran exactly once and that nothing is left running after an abort.
"""

from __future__ import annotations

from typing import Literal

from starlette.applications import Starlette

from rollway.engines.sim import SimConfig
from rollway.simulators import openai, sglang, vllm
from rollway.simulators.common import Fault, SimServerState, Simulator, test_routes

Protocol = Literal["sglang", "vllm", "openai"]

__all__ = ["Fault", "Protocol", "SimServerState", "create_sim_server_app"]


def create_sim_server_app(
    config: SimConfig | None = None,
    *,
    protocol: Protocol = "sglang",
    fault: Fault = "none",
    fault_count: int = 1 << 30,
) -> Starlette:
    """``fault`` hits the first ``fault_count`` generate calls: ``drop`` cuts the response
    mid-body, ``5xx`` answers 503 after generating, ``hang`` never finishes until aborted."""
    sim = Simulator(config or SimConfig(), fault, fault_count)
    protocol_routes = {"sglang": sglang.routes, "vllm": vllm.routes, "openai": openai.routes}
    app = Starlette(routes=protocol_routes[protocol](sim) + test_routes(sim))
    app.state.sim = sim.state
    return app
