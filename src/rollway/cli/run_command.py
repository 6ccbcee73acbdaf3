"""``rollway run``: a batch of rollouts of an agent on a task file, into a results folder."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from rollway.agents.base import AgentLoop
from rollway.agents.program import ProgramAgent
from rollway.agents.registry import import_target
from rollway.agents.server.remote_agent import resolve_agent
from rollway.cli.failures import EXIT_INTERRUPTED
from rollway.cli.options import EngineOption, ModelOption
from rollway.cli.outcome import report_interrupt, require_a_completed_rollout, warn_about_reruns
from rollway.client import RolloutClient
from rollway.client.event_stream import JsonlEventLog
from rollway.client.progress import DEFAULT_STATUS_INTERVAL_S
from rollway.client.watchdog import DEFAULT_STUCK_AFTER_S
from rollway.errors import ConfigError
from rollway.executors import Executor, RayExecutor
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.ids import id_from
from rollway.rollouts.config import DEFAULT_TIMEOUT_S, RolloutLimits, ServingConfig
from rollway.rollouts.rewards import RewardFn
from rollway.sandbox import sandbox_factory


def run(
    tasks: Annotated[Path, typer.Option(help="JSONL file, one task object per line.")],
    agent: Annotated[
        str | None,
        typer.Argument(
            help="module:Class, path/to/file.py:Class, a name, or an agent server's http(s) URL."
        ),
    ] = None,
    cmd: Annotated[
        str | None, typer.Option(help="Run this program as the agent, in a sandbox, instead.")
    ] = None,
    sandbox: Annotated[
        str, typer.Option(help="For --cmd: local | namespace (no network but the gateway).")
    ] = "local",
    group_size: Annotated[int, typer.Option(min=1, help="Rollouts per task.")] = 1,
    limit: Annotated[int | None, typer.Option(min=1, help="Use the first N tasks.")] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Rollouts at once.")] = 16,
    engine: EngineOption = "embedded",
    model: ModelOption = None,
    out: Annotated[
        str,
        typer.Option(envvar="ROLLWAY_OUT", help="Results root: a folder or s3://bucket/prefix."),
    ] = "rollway-runs",
    exp_id: Annotated[str | None, typer.Option(help="Default: agent name + task file.")] = None,
    reward: Annotated[str | None, typer.Option(help="Reward: module:fn or file.py:fn.")] = None,
    timeout: Annotated[
        float, typer.Option(min=0, help="Seconds per rollout (0: no limit).")
    ] = DEFAULT_TIMEOUT_S,
    status_interval: Annotated[
        float,
        typer.Option(
            envvar="ROLLWAY_STATUS_INTERVAL",
            help="Seconds between status lines, whether or not a rollout finished.",
        ),
    ] = DEFAULT_STATUS_INTERVAL_S,
    temperature: Annotated[float, typer.Option()] = 1.0,
    seed: Annotated[int | None, typer.Option(help="Run seed; rollouts derive theirs.")] = None,
    resume: Annotated[bool, typer.Option(help="Skip rollouts already in the store.")] = True,
    agent_key: Annotated[
        str | None, typer.Option(envvar="ROLLWAY_AGENT_KEY", help="The agent server's key.")
    ] = None,
    http_host: Annotated[
        str, typer.Option(help="Serve the gateway and callbacks here (0.0.0.0 for other hosts).")
    ] = "127.0.0.1",
    gateway: Annotated[
        str | None,
        typer.Option(
            envvar="ROLLWAY_GATEWAY",
            help="Use this `rollway gateway` (http://host:port) instead of --engine.",
        ),
    ] = None,
    gateway_key: Annotated[
        str | None, typer.Option(envvar="ROLLWAY_ADMIN_KEY", help="That gateway's admin key.")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="Cap per model call.")] = None,
    http_port: Annotated[int, typer.Option(help="Port for that (0: any free port).")] = 0,
    public_url: Annotated[
        str | None, typer.Option(help="How agent servers reach this client, if not http_host.")
    ] = None,
    executor: Annotated[
        str, typer.Option(help="Where rollouts run: local (this process) or ray (a cluster).")
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="For --executor ray: the cluster (auto, ray://HOST:10001); default: "
            "$RAY_ADDRESS, else a local one started for this run."
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="For --executor ray: worker actors (default: cluster CPUs)."),
    ] = None,
    events: Annotated[
        Path | None,
        typer.Option(help="Write every rollout event to this file, one JSON line each."),
    ] = None,
    stuck_after: Annotated[
        float,
        typer.Option(min=0, help="Report a rollout without progress this long, in s (0: never)."),
    ] = DEFAULT_STUCK_AFTER_S,
    abort_stuck: Annotated[
        bool, typer.Option(help="End a stuck rollout, recorded as a timeout saying where.")
    ] = False,
    trace: Annotated[
        bool,
        typer.Option(
            envvar="ROLLWAY_TRACE",
            help="OpenTelemetry spans to the OTLP collector OTEL_EXPORTER_OTLP_ENDPOINT names.",
        ),
    ] = False,
) -> None:
    """Run AGENT on every task (x group size); write trajectories, groups and a summary."""
    rows = _read_tasks(tasks, limit)
    if (agent is None) == (cmd is None):
        raise ConfigError("name an AGENT or give --cmd (one of them)")
    chosen = _agent(agent, cmd, agent_key, sandbox)
    exp = exp_id or id_from(f"{chosen.name}-{tasks.stem}")
    sampling: dict[str, Any] = {"temperature": temperature}
    if seed is not None:
        sampling["seed"] = seed
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    with (
        _event_log(events) as on_event,
        RolloutClient(
            chosen,
            RemoteGateway(gateway, admin_key=gateway_key or "") if gateway else engine,
            model=model,
            store=out,
            exp_id=exp,
            reward=_load_reward(reward) if reward else None,
            sampling=sampling,
            limits=RolloutLimits(timeout=timeout or None),
            serving=ServingConfig(host=http_host, port=http_port, public_url=public_url),
            max_concurrent=concurrency,
            executor=_executor(executor, ray_address, workers),
            show_progress=True,
            status_interval=status_interval,
            on_event=on_event,
            stuck_after_s=stuck_after or None,
            abort_stuck=abort_stuck,
            trace=trace,
        ) as client,
    ):
        try:
            # list() drives the batch from C code, so a Ctrl-C lands inside run_batch, which
            # cancels what is running and writes the summary of what finished.
            items = list(client.run_batch(rows, group_size, resume=resume))
        except KeyboardInterrupt:
            report_interrupt(client.last_summary)
            raise typer.Exit(EXIT_INTERRUPTED) from None
    typer.echo(f"results in {out.rstrip('/')}/{exp}")
    require_a_completed_rollout(items)
    warn_about_reruns(items)


def _event_log(path: Path | None) -> AbstractContextManager[JsonlEventLog | None]:
    return contextlib.closing(JsonlEventLog(path)) if path else contextlib.nullcontext()


def _executor(name: str, ray_address: str | None, workers: int | None) -> str | Executor:
    if name != "ray":
        if ray_address or workers:
            raise ConfigError("--ray-address and --workers go with --executor ray")
        return name
    return RayExecutor(address=ray_address, num_workers=workers)


def _agent(agent: str | None, cmd: str | None, agent_key: str | None, sandbox: str) -> AgentLoop:
    if cmd:
        return ProgramAgent(cmd, sandbox=sandbox_factory(sandbox))
    assert agent is not None
    return resolve_agent(agent, agent_key)


def _read_tasks(path: Path, limit: int | None) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ConfigError(f"no task file {path}", param="tasks")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{number}: not JSON: {exc}", param="tasks") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: a task must be a JSON object", param="tasks")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path} holds no tasks", param="tasks")
    return rows[:limit] if limit else rows


def _load_reward(spec: str) -> RewardFn:
    target, _, attr = spec.rpartition(":")
    fn = getattr(import_target(target, "reward"), attr, None)
    if not callable(fn):
        raise ConfigError(f"reward {spec!r} is not a callable", param="reward")
    return fn
