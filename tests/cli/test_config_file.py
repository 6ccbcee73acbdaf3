"""A `--config` TOML file holds real TOML values: a string or a boolean where an option takes a
number (or a number or string where it takes a flag) is an error naming the setting, never
coerced as a command-line string would be (`top_logprobs = true` is not 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_run_failures import assert_one_error, rollway


@pytest.mark.parametrize(
    ("text", "setting"),
    [
        ('top_logprobs = "3"\n', "top_logprobs"),
        ("top_logprobs = true\n", "top_logprobs"),
        ('record_entropy = "yes"\n', "record_entropy"),
        ("record_entropy = 1\n", "record_entropy"),
        ("temperature = true\n", "temperature"),
        # One rule with the gateway's: an empty stop string is refused, naming the setting.
        ('stop = [""]\n', "stop"),
        ("max_seq_len = 9223372036854775807\n", "max_seq_len"),
        # A table or a nested list is never a setting's value (not the string "{'x': 1}").
        ("[engine]\nx = 1\n", "engine"),
        ("engine = { x = 1 }\n", "engine"),
        ("stop = [['a']]\n", "stop"),
        ("engine = ['sim']\n", "engine"),
    ],
)
def test_a_toml_value_of_the_wrong_type_is_an_error_naming_the_setting(
    tmp_path: Path, text: str, setting: str
) -> None:
    (tmp_path / "bad.toml").write_text(text)
    ran = rollway("run", "--config", "bad.toml", "--print-config", cwd=tmp_path)
    assert_one_error(ran, "bad.toml", setting)


def test_toml_values_of_the_right_type_are_taken(tmp_path: Path) -> None:
    (tmp_path / "good.toml").write_text(
        "top_logprobs = 20\nrecord_entropy = true\ntemperature = 1\nstop = ['</a>']\n"
    )
    ran = rollway("run", "--config", "good.toml", "--print-config", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "top_logprobs = 20" in ran.stdout and "record_entropy = true" in ran.stdout
    assert "temperature = 1.0" in ran.stdout


def test_an_empty_stop_string_on_the_command_line_is_refused_naming_it(tmp_path: Path) -> None:
    ran = rollway("run", "--stop", "", "--print-config", cwd=tmp_path)
    assert ran.returncode == 2 and "--stop" in ran.stderr and "empty" in ran.stderr
