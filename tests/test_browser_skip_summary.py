"""A run whose browser tests skipped (no Chromium) says so in its last lines, with the install
command: `make test`'s skips are otherwise listed only under ``-rs``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.conftest import NO_CHROMIUM, pytest_terminal_summary


@dataclass
class Terminal:
    """What pytest's terminal reporter is to the hook: its reports, and what it writes."""

    stats: dict[str, list[Any]]
    lines: list[str] = field(default_factory=list)

    def write_sep(self, sep: str, title: str, **markup: bool) -> None:
        self.lines.append(f"{sep * 3} {title} {sep * 3}")

    def write_line(self, line: str, **markup: bool) -> None:
        self.lines.append(line)


def skipped(reason: str) -> pytest.TestReport:
    return pytest.TestReport(
        "t.py::t", ("t.py", 1, "t"), {}, "skipped", ("t.py", 1, reason), "setup"
    )


def test_skipped_browser_tests_are_counted_in_the_last_lines_with_the_install_command() -> None:
    terminal = Terminal({"skipped": [skipped(f"Skipped: {NO_CHROMIUM}")] * 14 + [skipped("other")]})
    pytest_terminal_summary(terminal)
    said = "14 browser tests skipped: Chromium not found; install with: apt-get install chromium"
    assert terminal.lines[-1] == said


def test_a_run_with_its_browser_tests_says_nothing_of_them() -> None:
    terminal = Terminal({"skipped": [skipped("other")], "passed": []})
    pytest_terminal_summary(terminal)
    assert terminal.lines == []
