"""``rollway run``: a batch of rollouts of an agent on tasks (a file or a task source), into a
results folder."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import typer

from rollway.agents.base import AgentLoop
from rollway.agents.program import ProgramAgent
from rollway.agents.question import QuestionAgent
from rollway.agents.registry import import_target
from rollway.agents.server.remote_agent import resolve_agent
from rollway.cli import run_options as o
from rollway.cli.config_file import as_toml, merged_settings
from rollway.cli.options import EngineOption, ModelOption
from rollway.cli.outcome import report_interrupt, require_a_completed_rollout, warn_about_reruns
from rollway.cli.run_settings import RunSettings
from rollway.cli.stopping import exit_status, sigterm_as_interrupt
from rollway.client import BatchItem, RolloutClient
from rollway.client.event_stream import JsonlEventLog
from rollway.client.progress import DEFAULT_STATUS_INTERVAL_S
from rollway.client.task_sources import read_tasks, tasks_name
from rollway.client.watchdog import DEFAULT_STUCK_AFTER_S
from rollway.errors import ConfigError
from rollway.gateway.remote_gateway import RemoteGateway
from rollway.generation import SamplingParams
from rollway.ids import id_from
from rollway.rollouts.config import DEFAULT_TIMEOUT_S
from rollway.rollouts.rewards import RewardFn
from rollway.sampling_settings import SAMPLING_NAMES
from rollway.sandbox import SandboxLimits, sandbox_factory


def run(
    ctx: typer.Context,
    tasks: o.TasksOption = None,
    agent: o.AgentArgument = None,
    cmd: o.CmdOption = None,
    sandbox: o.SandboxOption = "local",
    sandbox_writable: o.SandboxWritableOption = None,
    group_size: o.GroupSizeOption = 1,
    limit: o.LimitOption = None,
    concurrency: o.ConcurrencyOption = 16,
    engine: EngineOption = "embedded",
    model: ModelOption = None,
    out: o.OutOption = "rollway-runs",
    exp_id: o.ExpIdOption = None,
    reward: o.RewardOption = None,
    timeout: o.TimeoutOption = DEFAULT_TIMEOUT_S,
    status_interval: o.StatusIntervalOption = DEFAULT_STATUS_INTERVAL_S,
    temperature: o.TemperatureOption = 1.0,
    top_p: o.TopPOption = 1.0,
    top_k: o.TopKOption = 0,
    stop: o.StopOption = None,
    top_logprobs: o.TopLogprobsOption = 0,
    record_entropy: o.RecordEntropyOption = False,
    max_turns: o.MaxTurnsOption = None,
    max_seq_len: o.MaxSeqLenOption = None,
    max_attempts: o.MaxAttemptsOption = None,
    reward_timeout: o.RewardTimeoutOption = 30.0,
    reward_retries: o.RewardRetriesOption = 2,
    stop_grace: o.StopGraceOption = 2.0,
    seed: o.SeedOption = None,
    resume: o.ResumeOption = True,
    agent_key: o.AgentKeyOption = None,
    http_host: o.HttpHostOption = "127.0.0.1",
    gateway: o.GatewayOption = None,
    gateway_key: o.GatewayKeyOption = None,
    max_tokens: o.MaxTokensOption = None,
    http_port: o.HttpPortOption = 0,
    public_url: o.PublicUrlOption = None,
    executor: o.ExecutorOption = "local",
    ray_address: o.RayAddressOption = None,
    workers: o.WorkersOption = None,
    workers_per_node: o.WorkersPerNodeOption = None,
    events: o.EventsOption = None,
    stuck_after: o.StuckAfterOption = DEFAULT_STUCK_AFTER_S,
    abort_stuck: o.AbortStuckOption = False,
    trace: o.TraceOption = False,
    config: o.ConfigOption = None,
    print_config: o.PrintConfigOption = False,
) -> None:
    """Run AGENT on every task (x group size); write trajectories, groups and a summary."""
    merged = merged_settings(ctx, config)
    if print_config:
        typer.echo(as_toml(merged), nl=False)
        return
    try:
        with sigterm_as_interrupt():
            _run_settings(RunSettings.of(merged))
    except KeyboardInterrupt as stop:  # before the batch: nothing ran, nothing to report
        report_interrupt(None, stop)
        raise typer.Exit(exit_status(stop)) from None


def _run_settings(s: RunSettings) -> None:
    """The run the settings describe, from the task file to the results line."""
    if s.tasks is None:
        raise ConfigError("give --tasks (or `tasks` in the config file)", param="tasks")
    rows = list(read_tasks(s.tasks))[: s.limit]
    if s.agent is not None and s.cmd is not None:
        raise ConfigError("name an AGENT or give --cmd (one of them)")
    chosen = _agent(s.agent, s.cmd, s.agent_key, s.sandbox, s.sandbox_writable)
    exp = s.exp_id or id_from(f"{chosen.name}-{tasks_name(s.tasks)}")
    with (
        _event_log(s.events) as on_event,
        _client(s, chosen, exp, on_event) as client,
    ):
        items = _run_batch(client, rows, s)
    results = f"{s.out.rstrip('/')}/{exp}"
    typer.echo(f"results in {results}")
    require_a_completed_rollout(items, results, s.reward)
    warn_about_reruns(items)


def _client(
    s: RunSettings, agent: AgentLoop, exp_id: str, on_event: JsonlEventLog | None
) -> RolloutClient:
    """The client the settings describe, with a progress bar and status lines."""
    return RolloutClient(
        agent,
        RemoteGateway(s.gateway, admin_key=s.gateway_key or "") if s.gateway else s.engine,
        model=s.model,
        store=s.out,
        exp_id=exp_id,
        reward=load_reward(s.reward) if s.reward else None,
        sampling=_sampling(s),
        limits=s.limits(),
        retry=s.retry(),
        serving=s.serving(),
        max_concurrent=s.concurrency,
        executor=s.where_to_run(),
        show_progress=True,
        status_interval=s.status_interval,
        on_event=on_event,
        stuck_after_s=s.stuck_after or None,
        abort_stuck=s.abort_stuck,
        trace=s.trace,
    )


def _run_batch(
    client: RolloutClient, rows: list[dict[str, Any]], s: RunSettings
) -> list[BatchItem]:
    try:
        # list() drives the batch from C code, so a Ctrl-C (or SIGTERM) lands inside
        # run_batch, which cancels what is running and writes the summary of what finished.
        with sigterm_as_interrupt():  # again: a Ray executor's start set its own handler
            return list(client.run_batch(rows, s.group_size, resume=s.resume))
    except KeyboardInterrupt as stop:
        report_interrupt(client.last_summary, stop)
        raise typer.Exit(exit_status(stop)) from None


def _sampling(s: RunSettings) -> SamplingParams:
    """The sampling the settings give, typed once here: it fixes temperature, top_p and top_k,
    and the others where given (a turn records the most top logprobs either side asked).
    A sampling setting without a ``rollway run`` option (``stop_token_ids``) is not given."""
    given = {name: getattr(s, name, None) for name in SAMPLING_NAMES}
    return SamplingParams(**{name: value for name, value in given.items() if value is not None})


def _event_log(path: Path | None) -> AbstractContextManager[JsonlEventLog | None]:
    return contextlib.closing(JsonlEventLog(path)) if path else contextlib.nullcontext()


def _agent(
    agent: str | None,
    cmd: str | None,
    agent_key: str | None,
    sandbox: str,
    writable: list[str] | None,
) -> AgentLoop:
    if cmd:
        limits = SandboxLimits(writable_paths=tuple(writable or ()))
        return ProgramAgent(cmd, limits=limits, sandbox=sandbox_factory(sandbox))
    return resolve_agent(agent, agent_key) if agent else QuestionAgent()


def load_reward(spec: str) -> RewardFn:
    target, _, attr = spec.rpartition(":")
    fn = getattr(import_target(target, "reward"), attr, None)
    if not callable(fn):
        raise ConfigError(f"reward {spec!r} is not a callable", param="reward")
    reward: RewardFn = fn  # the user's function: its signature is checked when it is called
    return reward
