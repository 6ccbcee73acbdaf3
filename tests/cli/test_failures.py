"""The one mapping from exceptions to what `rollway` prints."""

from __future__ import annotations

import errno

from rollway import errors
from rollway.cli.failures import HINTS, explain


def test_every_category_of_the_error_tree_has_its_own_hint() -> None:
    categories = set(errors.RollwayError.__subclasses__())
    assert categories == set(HINTS)
    for cls in errors.HTTP_STATUS:
        failure = explain(cls("went wrong"))
        assert failure.message == "went wrong" and failure.hint


def test_a_config_error_about_an_input_gets_that_inputs_hint() -> None:
    assert "rollway validate" in explain(errors.ConfigError("x", param="agent")).hint
    assert "JSON object per line" in explain(errors.ConfigError("x", param="tasks")).hint
    assert "--help" in explain(errors.ConfigError("x")).hint


def test_os_errors_name_the_path_and_say_what_to_do() -> None:
    full = explain(OSError(errno.ENOSPC, "No space left on device", "/runs/a.json"))
    assert full.message == "No space left on device: /runs/a.json" and "free space" in full.hint
    read_only = explain(OSError(errno.EROFS, "Read-only file system", "/runs"))
    assert "--out" in read_only.hint


def test_anything_else_is_called_a_possible_bug() -> None:
    failure = explain(ValueError("nope"))
    assert failure.message == "unexpected ValueError: nope" and "ROLLWAY_DEBUG=1" in failure.hint
