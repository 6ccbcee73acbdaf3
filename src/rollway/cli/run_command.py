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
from rollway.cli.config_file import as_toml, merged_settings
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
    ctx: typer.Context,
    tasks: Annotated[
        Path | None, typer.Option(help="JSONL file, one task object per line (required).")
    ] = None,
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
    temperature: Annotated[float, typer.Option(min=0, help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(min=0, max=1, help="Nucleus sampling (1: off).")] = 1.0,
    top_k: Annotated[int, typer.Option(min=0, help="Top-k sampling (0: off).")] = 0,
    stop: Annotated[
        list[str] | None, typer.Option(help="A stop string (repeat the option for more).")
    ] = None,
    top_logprobs: Annotated[
        int,
        typer.Option(min=0, max=20, help="Record each sampled token's N most likely tokens."),
    ] = 0,
    record_entropy: Annotated[
        bool, typer.Option(help="Record each sampled token's entropy (embedded engine).")
    ] = False,
    max_turns: Annotated[
        int | None, typer.Option(min=1, help="Model calls per rollout; past them: truncated.")
    ] = None,
    max_seq_len: Annotated[
        int | None, typer.Option(min=2, help="Tokens per rollout; past them: truncated.")
    ] = None,
    max_attempts: Annotated[
        int | None, typer.Option(min=1, help="Attempts at a rollout failed by infrastructure.")
    ] = None,
    reward_timeout: Annotated[
        float, typer.Option(min=0, help="Seconds the reward function may take.")
    ] = 30.0,
    stop_grace: Annotated[
        float, typer.Option(min=0, help="Seconds an agent has to stop at a timeout or cancel.")
    ] = 2.0,
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
    config: Annotated[
        Path | None,
        typer.Option(
            help="A TOML file of these settings (option names as keys); the command line and "
            "the environment win over it."
        ),
    ] = None,
    print_config: Annotated[
        bool, typer.Option(help="Print the merged settings as TOML and exit.")
    ] = False,
) -> None:
    """Run AGENT on every task (x group size); write trajectories, groups and a summary."""
    s = merged_settings(ctx, config)
    if print_config:
        typer.echo(as_toml(s), nl=False)
        return
    if s["tasks"] is None:
        raise ConfigError("give --tasks (or `tasks` in the config file)", param="tasks")
    rows = _read_tasks(Path(s["tasks"]), s["limit"])
    if (s["agent"] is None) == (s["cmd"] is None):
        raise ConfigError("name an AGENT or give --cmd (one of them)")
    chosen = _agent(s["agent"], s["cmd"], s["agent_key"], s["sandbox"])
    exp = s["exp_id"] or id_from(f"{chosen.name}-{Path(s['tasks']).stem}")
    gateway = s["gateway"]
    with (
        _event_log(Path(s["events"]) if s["events"] else None) as on_event,
        RolloutClient(
            chosen,
            RemoteGateway(gateway, admin_key=s["gateway_key"] or "") if gateway else s["engine"],
            model=s["model"],
            store=s["out"],
            exp_id=exp,
            reward=_load_reward(s["reward"]) if s["reward"] else None,
            sampling=_sampling(s),
            limits=_limits(s),
            retry={"attempts": s["max_attempts"]} if s["max_attempts"] else None,
            serving=ServingConfig(
                host=s["http_host"], port=s["http_port"], public_url=s["public_url"]
            ),
            max_concurrent=s["concurrency"],
            executor=_executor(s["executor"], s["ray_address"], s["workers"]),
            show_progress=True,
            status_interval=s["status_interval"],
            on_event=on_event,
            stuck_after_s=s["stuck_after"] or None,
            abort_stuck=s["abort_stuck"],
            trace=s["trace"],
        ) as client,
    ):
        try:
            # list() drives the batch from C code, so a Ctrl-C lands inside run_batch, which
            # cancels what is running and writes the summary of what finished.
            items = list(client.run_batch(rows, s["group_size"], resume=s["resume"]))
        except KeyboardInterrupt:
            report_interrupt(client.last_summary)
            raise typer.Exit(EXIT_INTERRUPTED) from None
    typer.echo(f"results in {s['out'].rstrip('/')}/{exp}")
    require_a_completed_rollout(items)
    warn_about_reruns(items)


def _sampling(s: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings given (None: the engine's default)."""
    sampling = {"temperature": s["temperature"], "top_p": s["top_p"], "top_k": s["top_k"]}
    for name in ("seed", "max_tokens"):
        if s[name] is not None:
            sampling[name] = s[name]
    if s["stop"]:
        sampling["stop"] = tuple(s["stop"])
    # Fixed only when asked: a fixed 0 would also refuse an agent's own top_logprobs request.
    if s["top_logprobs"]:
        sampling["top_logprobs"] = s["top_logprobs"]
    if s["record_entropy"]:
        sampling["record_entropy"] = True
    return sampling


def _limits(s: dict[str, Any]) -> RolloutLimits:
    return RolloutLimits(
        max_turns=s["max_turns"],
        max_seq_len=s["max_seq_len"],
        timeout=s["timeout"] or None,
        reward_timeout=s["reward_timeout"],
        stop_grace_s=s["stop_grace"],
    )


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
    reward: RewardFn = fn  # the user's function: its signature is checked when it is called
    return reward
