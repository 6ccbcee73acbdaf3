"""The one mapping from exceptions to what `rollway` prints."""

from __future__ import annotations

import errno

import pytest

from rollway import errors
from rollway.cli.failures import HINTS, explain
from rollway.executors.ray_executor import ray_start_error


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


@pytest.mark.parametrize(
    "said",
    [  # Ray 2.60's own words, from its GCS and from its driver-side check
        "InvalidAuthToken: Authentication token is missing or incorrect",
        "AuthenticationError: Token authentication is enabled but no authentication token was "
        "found",
    ],
)
def test_a_ray_cluster_that_wants_a_token_gets_a_hint_naming_rays_token_auth(said: str) -> None:
    failure = explain(ray_start_error(ConnectionError(said), "ray://head:10001"))
    assert "Authentication token" in failure.message or "authentication token" in failure.message
    assert "RAY_AUTH_MODE=token" in failure.hint and "RAY_AUTH_TOKEN" in failure.hint
    assert "docs/ray.md" in failure.hint and "--help" not in failure.hint


def test_any_other_failure_to_reach_ray_points_at_the_address() -> None:
    failure = explain(ray_start_error(ConnectionError("Could not connect to 1.2.3.4:6379"), None))
    assert "RAY_ADDRESS" in failure.message and "--ray-address" in failure.hint
