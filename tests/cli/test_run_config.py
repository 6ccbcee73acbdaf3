"""`rollway run` reaches every rollout setting: sampling, limits and retries as options, the
same settings from a TOML file (`--config`), the command line and the environment winning over
it, and `--print-config` showing the merged result."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import orjson
import pytest

from rollway.cli.config_file import OWN_OPTIONS
from rollway.cli.run_command import run
from rollway.cli.run_settings import RunSettings
from rollway.errors import ConfigError
from rollway.rollouts.config import RolloutLimits, ServingConfig
from tests.cli.test_run_failures import assert_one_error, rollway
from tests.cli.test_run_settings import AGENTS

CONFIG = """\
agent = "agents.py:Quick"
tasks = "tasks.jsonl"
engine = "sim"
out = "from-file"
group-size = 2
temperature = 0.7
top_p = 0.9
top_k = 20
stop = ["</answer>", "STOP"]
top_logprobs = 4
record_entropy = true
max_turns = 3
max_seq_len = 2048
max_attempts = 5
reward_timeout = 7.5
reward_retries = 4
stop_grace = 0.5
gateway_key = "sk-secret"
"""


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "agents.py").write_text(AGENTS)
    (tmp_path / "tasks.jsonl").write_text('{"task_id": "t"}\n')
    (tmp_path / "run.toml").write_text(CONFIG)
    return tmp_path


def test_a_run_takes_its_settings_from_the_file_and_the_command_line_wins(
    workdir: Path,
) -> None:
    ran = rollway("run", "--config", "run.toml", "--temperature", "0.3", "--gateway-key", "",
                  cwd=workdir, env={"ROLLWAY_OUT": "from-env"})  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert not (workdir / "from-file").exists()  # the environment won over the file
    config = orjson.loads((workdir / "from-env" / "quick-tasks" / "config.json").read_bytes())
    assert config["group_size"] == 2
    assert config["sampling"] == {
        "temperature": 0.3, "top_p": 0.9, "top_k": 20, "stop": ["</answer>", "STOP"],
        "top_logprobs": 4, "record_entropy": True,
    }  # fmt: skip
    assert config["limits"] == {
        "max_turns": 3, "max_seq_len": 2048, "timeout": 900.0, "reward_timeout": 7.5,
        "stop_grace_s": 0.5, "reward_retries": 4,
    }  # fmt: skip
    assert config["retry"]["attempts"] == 5


def test_print_config_shows_the_merged_settings_as_toml_without_secrets(workdir: Path) -> None:
    ran = rollway("run", "--config", "run.toml", "--top-k", "5", "--print-config", cwd=workdir)
    assert ran.returncode == 0, ran.stderr
    assert "sk-secret" not in ran.stdout and "# gateway_key = (set, not shown)" in ran.stdout
    printed = tomllib.loads(ran.stdout)
    assert printed["top_k"] == 5 and printed["top_p"] == 0.9 and printed["group_size"] == 2
    assert printed["stop"] == ["</answer>", "STOP"] and printed["timeout"] == 900.0
    assert "seed" not in printed  # unset: a comment, as TOML has no null
    assert not (workdir / "from-file").exists()  # printing runs nothing
    # What it printed is a config file that gives the same settings back.
    (workdir / "printed.toml").write_text(ran.stdout)
    again = rollway("run", "--config", "printed.toml", "--print-config", cwd=workdir)
    assert tomllib.loads(again.stdout) == printed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("groupsize = 2\n", "unknown setting 'groupsize'"),
        ("group_size = 0\n", "group_size"),
        ("top_p = 'high'\n", "top_p"),
        ("temperature = \n", "is not TOML"),
    ],
)
def test_a_bad_config_file_is_one_error_naming_the_setting(
    workdir: Path, text: str, expected: str
) -> None:
    (workdir / "bad.toml").write_text(text)
    assert_one_error(rollway("run", "--config", "bad.toml", cwd=workdir), "bad.toml", expected)


def test_tasks_are_required_from_one_place_or_the_other(workdir: Path) -> None:
    ran = rollway("run", "agents.py:Quick", "--engine", "sim", cwd=workdir)
    assert_one_error(ran, "--tasks")


def test_help_names_every_option_whole_at_80_columns(workdir: Path) -> None:
    ran = rollway("run", "--help", cwd=workdir, env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"})
    assert ran.returncode == 0, ran.stderr
    assert "…" not in ran.stdout  # nothing cut to fit a column
    for option in ("--top-p", "--top-k", "--stop", "--max-turns", "--max-seq-len",
                   "--max-attempts", "--reward-timeout", "--reward-retries", "--stop-grace",
                   "--config",
                   "--print-config", "--top-logprobs", "--record-entropy",
                   "ROLLWAY_STATUS_INTERVAL"):  # fmt: skip
        assert option in ran.stdout
    assert max(len(line) for line in ran.stdout.splitlines()) <= 80


def test_every_run_option_is_one_field_of_the_typed_settings() -> None:
    parameters = inspect.signature(run).parameters
    options = {n: p.default for n, p in parameters.items() if n not in ("ctx", *OWN_OPTIONS)}
    assert sorted(RunSettings.names()) == sorted(options)
    settings = RunSettings.of(options)  # the defaults, as the merged settings hold them
    assert settings.limits() == RolloutLimits(reward_timeout=30.0, reward_retries=2)
    assert settings.serving() == ServingConfig(host="127.0.0.1", port=0)
    assert (settings.retry(), settings.where_to_run()) == (None, "local")
    with pytest.raises(TypeError, match="unexpected keyword argument 'tempreature'"):
        RunSettings.of({**options, "tempreature": 0.5})
    with pytest.raises(ConfigError, match="--workers and --workers-per-node go with --executor"):
        RunSettings.of({**options, "workers": 2, "workers_per_node": 2}).where_to_run()
