"""The options of ``rollway run``, as ``Annotated`` aliases (their defaults stay in ``run``'s
signature, where ``--help`` and the config file read them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollway.checks import MAX_SEQ_LEN
from rollway.errors import InvalidFieldsError
from rollway.sampling_settings import SETTING, SamplingSetting


def checked_stop(value: list[str] | None) -> list[str] | None:
    """``--stop`` (and a config file's ``stop``) by the rule every surface applies."""
    if value:
        try:
            SETTING["stop"].check(value)
        except InvalidFieldsError as exc:
            raise typer.BadParameter(_reason(exc)) from None
    return value


class SettingParser:
    """An option's value by its setting's rule: text from the command line or the environment
    is read as a number first; a config file's typed value is checked as it is
    (``check_typed``). A refusal is the setting's own, in its words."""

    setting: SamplingSetting

    def __init__(self, setting: SamplingSetting) -> None:
        self.setting = setting

    def __call__(self, value: object) -> object:
        if isinstance(value, str):
            value = _number(value, float if self.setting.kind == "number" else int)
        try:
            return self.check_typed(value)
        except InvalidFieldsError as exc:
            raise typer.BadParameter(_reason(exc)) from None

    def check_typed(self, value: object) -> object:
        """``value`` as the option holds it, or the setting's ``InvalidFieldsError``."""
        held = self.setting.check(value)
        return float(held) if self.setting.kind == "number" else held


def _shown(bound: float | None) -> float | None:
    """A bound as ``--help`` shows it: ``0<=x<=1``, not ``0.0<=x<=1.0``."""
    return int(bound) if isinstance(bound, float) and bound.is_integer() else bound


def _reason(refusal: InvalidFieldsError) -> str:
    """A setting's refusal without its field's name: click's message names the option."""
    return refusal.message.removeprefix(f"{refusal.param}: ")


def _number(text: str, kind: type[float] | type[int]) -> object:
    try:
        return kind(text)
    except ValueError:
        return text  # refused by the rule, as given


def sampling_option(name: str, *, help: str, show_range: bool = True) -> typer.models.OptionInfo:
    """The option of setting ``name``: its rule, and its range in ``--help``."""
    setting = SETTING[name]
    low, high = (_shown(setting.low), _shown(setting.high)) if show_range else (None, None)
    option: typer.models.OptionInfo = typer.Option(
        help=help, parser=SettingParser(setting), min=low, max=high
    )
    return option


# What to run, on what.
TasksOption = Annotated[
    str | None,
    typer.Option(
        help="A JSONL file, one task object per line, or a task source: "
        "reasoning-gym:NAME[?size=N&seed=S&OPTION=V] (required)."
    ),
]
AgentArgument = Annotated[
    str | None,
    typer.Argument(
        help="module:Class, path/to/file.py:Class, a name, or an agent server's http(s) URL "
        "(default: the built-in question agent, one model call on each task's messages)."
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
ExpIdOption = Annotated[
    str | None, typer.Option(help="Default: agent name + task file (or dataset) name.")
]
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

# Sampling: each option made from its setting's declaration (rollway.sampling_settings).
TemperatureOption = Annotated[float, sampling_option("temperature", help="Sampling temperature.")]
TopPOption = Annotated[float, sampling_option("top_p", help="Nucleus sampling (1: off).")]
TopKOption = Annotated[int, sampling_option("top_k", help="Top-k sampling (0 or -1: off).")]
StopOption = Annotated[
    list[str] | None,
    typer.Option(help="A stop string (repeat the option for more).", callback=checked_stop),
]
TopLogprobsOption = Annotated[
    int,
    sampling_option("top_logprobs", help="Record each sampled token's N most likely tokens."),
]
RecordEntropyOption = Annotated[
    bool, typer.Option(help="Record each sampled token's entropy (embedded engine).")
]
SeedOption = Annotated[
    int | None,
    sampling_option("seed", help="Run seed; rollouts derive theirs.", show_range=False),
]
MaxTokensOption = Annotated[int | None, sampling_option("max_tokens", help="Cap per model call.")]

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
