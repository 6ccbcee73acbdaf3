"""``rollway sim-server``: a simulated inference server for benchmarks and fault tests."""

from __future__ import annotations

import time
from typing import Annotated

import typer
import uvicorn

from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError
from rollway.simulators import Fault, create_sim_server_app

FAULTS = ("none", "drop", "5xx", "hang")
PROTOCOLS = ("sglang", "vllm", "openai")


def serve(
    protocol: Annotated[str, typer.Option(help="sglang | vllm | openai")] = "sglang",
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 30000,
    latency_s: Annotated[float, typer.Option(help="Seconds per generation.")] = 0.0,
    output_len: Annotated[int, typer.Option(help="Tokens per generation.")] = 16,
    fault: Annotated[str, typer.Option(help="none | drop | 5xx | hang")] = "none",
    fault_count: Annotated[int, typer.Option(help="How many requests the fault hits.")] = 1 << 30,
    slow_start_s: Annotated[float, typer.Option(help="Wait before listening.")] = 0.0,
    server_version: Annotated[
        str | None, typer.Option(help="The SGLang or vLLM release to imitate (default: newest).")
    ] = None,
    dev_mode: Annotated[
        bool, typer.Option(help="vLLM: as with VLLM_SERVER_DEV_MODE=1 (pause, weight routes).")
    ] = True,
) -> None:
    """Serve a simulated engine (a load generator, not a model) over a real protocol."""
    if protocol not in PROTOCOLS:
        raise ConfigError(f"unknown protocol {protocol!r}: {' | '.join(PROTOCOLS)}")
    if fault not in FAULTS:
        raise ConfigError(f"unknown fault {fault!r}: {' | '.join(FAULTS)}")
    chosen: Fault = fault  # type: ignore[assignment]  # checked against FAULTS above
    config = SimConfig(latency_s=latency_s, output_len=output_len)
    app = create_sim_server_app(
        config,
        protocol=protocol,  # type: ignore[arg-type]  # checked against PROTOCOLS above
        fault=chosen,
        fault_count=fault_count,
        server_version=server_version,
        dev_mode=dev_mode,
    )
    time.sleep(slow_start_s)
    typer.echo(f"simulated {protocol} server on http://{host}:{port} (fault: {fault})")
    uvicorn.run(app, host=host, port=port, log_level="warning")
