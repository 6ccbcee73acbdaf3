"""The options of ``rollway run``, as ``Annotated`` aliases (their defaults stay in ``run``'s
signature, where ``--help`` and the config file read them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollway.checks import MAX_SEQ_LEN
from rollway.errors import InvalidFieldsError
from rollway.generation import stop_strings


def checked_stop(value: list[str] | None) -> list[str] | None:
    """``--stop`` (and a config file's ``stop``) by the rule every surface applies."""
    if value:
        try:
            stop_strings(value)
        except InvalidFieldsError as exc:
            raise typer.BadParameter(exc.message) from None
    return value


# What to run, on what.
TasksOption = Annotated[
    Path | None, typer.Option(help="JSONL file, one task object per line (required).")
]
AgentArgument = Annotated[
    str | None,
    typer.Argument(
        help="module:Class, path/to/file.py:Class, a name, or an agent server's http(s) URL."
    ),
]
CmdOption = Annotated[
    str | None, typer.Option(help="Run this program as the agent, in a sandbox, instead.")
]
SandboxOption = Annotated[
    str, typer.Option(help="For --cmd: local | namespace (no network but the gateway).")
]
SandboxWritableOption = Annotated[
    list[str] | None,
    typer.Option(
        help="For --cmd --sandbox namespace: a host folder (absolute, existing) the program may "
        "write; repeat for more. The rest of the host's file system is read-only to it."
    ),
]
GroupSizeOption = Annotated[int, typer.Option(min=1, help="Rollouts per task.")]
LimitOption = Annotated[int | None, typer.Option(min=1, help="Use the first N tasks.")]
ConcurrencyOption = Annotated[int, typer.Option(min=1, help="Rollouts at once.")]

# Where results go.
OutOption = Annotated[
    str, typer.Option(envvar="ROLLWAY_OUT", help="Results root: a folder or s3://bucket/prefix.")
]
ExpIdOption = Annotated[str | None, typer.Option(help="Default: agent name + task file.")]
RewardOption = Annotated[
    str | None,
    typer.Option(
        help="Reward: module:fn or file.py:fn. Wins over a reward the agent sets itself "
        "(kept in reward_info as agent_reward)."
    ),
]
TimeoutOption = Annotated[float, typer.Option(min=0, help="Seconds per rollout (0: no limit).")]
StatusIntervalOption = Annotated[
    float,
    typer.Option(
        envvar="ROLLWAY_STATUS_INTERVAL",
        help="Seconds between status lines, whether or not a rollout finished.",
    ),
]

# Sampling.
TemperatureOption = Annotated[float, typer.Option(min=0, help="Sampling temperature.")]
TopPOption = Annotated[float, typer.Option(min=0, max=1, help="Nucleus sampling (1: off).")]
TopKOption = Annotated[int, typer.Option(min=0, help="Top-k sampling (0: off).")]
StopOption = Annotated[
    list[str] | None,
    typer.Option(help="A stop string (repeat the option for more).", callback=checked_stop),
]
TopLogprobsOption = Annotated[
    int, typer.Option(min=0, max=20, help="Record each sampled token's N most likely tokens.")
]
RecordEntropyOption = Annotated[
    bool, typer.Option(help="Record each sampled token's entropy (embedded engine).")
]

# Limits and retries.
MaxTurnsOption = Annotated[
    int | None, typer.Option(min=1, help="Model calls per rollout; past them: truncated.")
]
MaxSeqLenOption = Annotated[
    int | None,
    typer.Option(min=2, max=MAX_SEQ_LEN, help="Tokens per rollout; past them: truncated."),
]
MaxAttemptsOption = Annotated[
    int | None, typer.Option(min=1, help="Attempts at a rollout failed by infrastructure.")
]
RewardTimeoutOption = Annotated[
    float, typer.Option(min=0, help="Seconds the reward function may take.")
]
RewardRetriesOption = Annotated[
    int,
    typer.Option(min=0, max=20, help="Tries again a reward function that raised or timed out."),
]
StopGraceOption = Annotated[
    float, typer.Option(min=0, help="Seconds an agent has to stop at a timeout or cancel.")
]
SeedOption = Annotated[int | None, typer.Option(help="Run seed; rollouts derive theirs.")]
ResumeOption = Annotated[bool, typer.Option(help="Skip rollouts already in the store.")]

# Agent servers, gateways, serving.
AgentKeyOption = Annotated[
    str | None, typer.Option(envvar="ROLLWAY_AGENT_KEY", help="The agent server's key.")
]
HttpHostOption = Annotated[
    str, typer.Option(help="Serve the gateway and callbacks here (0.0.0.0 for other hosts).")
]
GatewayOption = Annotated[
    str | None,
    typer.Option(
        envvar="ROLLWAY_GATEWAY",
        help="Use this `rollway gateway` (http://host:port) instead of --engine.",
    ),
]
GatewayKeyOption = Annotated[
    str | None, typer.Option(envvar="ROLLWAY_ADMIN_KEY", help="That gateway's admin key.")
]
MaxTokensOption = Annotated[int | None, typer.Option(min=1, help="Cap per model call.")]
HttpPortOption = Annotated[int, typer.Option(help="Port for that (0: any free port).")]
PublicUrlOption = Annotated[
    str | None, typer.Option(help="How agent servers reach this client, if not http_host.")
]

# Executors.
ExecutorOption = Annotated[
    str, typer.Option(help="Where rollouts run: local (this process) or ray (a cluster).")
]
RayAddressOption = Annotated[
    str | None,
    typer.Option(
        help="For --executor ray: the cluster (auto, ray://HOST:10001); default: "
        "$RAY_ADDRESS, else a local one started for this run."
    ),
]
WorkersOption = Annotated[
    int | None,
    typer.Option(min=1, help="For --executor ray: worker actors (default: cluster CPUs)."),
]
WorkersPerNodeOption = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="For --executor ray, instead of --workers: this many workers pinned to each live "
        "node with room for one (a lost node takes only its own).",
    ),
]

# Watching a run.
EventsOption = Annotated[
    Path | None, typer.Option(help="Write every rollout event to this file, one JSON line each.")
]
StuckAfterOption = Annotated[
    float,
    typer.Option(min=0, help="Report a rollout without progress this long, in s (0: never)."),
]
AbortStuckOption = Annotated[
    bool, typer.Option(help="End a stuck rollout, recorded as a timeout saying where.")
]
TraceOption = Annotated[
    bool,
    typer.Option(
        envvar="ROLLWAY_TRACE",
        help="OpenTelemetry spans to the OTLP collector OTEL_EXPORTER_OTLP_ENDPOINT names.",
    ),
]

# The settings themselves.
ConfigOption = Annotated[
    Path | None,
    typer.Option(
        help="A TOML file of these settings (option names as keys); the command line and "
        "the environment win over it."
    ),
]
PrintConfigOption = Annotated[
    bool, typer.Option(help="Print the merged settings as TOML and exit.")
]
