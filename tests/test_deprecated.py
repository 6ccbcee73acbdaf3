"""Renamed public types still import under their old names for one release, with a warning."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest

import rollway
from rollway.agents.server import AgentServerConfig
from rollway.deprecated import MOVED_MODULES
from rollway.executors import WorkerConfig
from rollway.generation import ChatResult
from rollway.results import AgentResult
from rollway.rollouts import RolloutConfig
from rollway.simulators.sglang_server import SGLangSimConfig
from rollway.simulators.vllm_server import VLLMSimConfig


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("rollway", "RolloutResult", AgentResult),
        ("rollway.types", "RolloutResult", AgentResult),
        ("rollway", "ChatReply", ChatResult),
        ("rollway.agents", "ChatReply", ChatResult),
        ("rollway.agents.context", "ChatReply", ChatResult),
        ("rollway.rollouts", "RolloutSettings", RolloutConfig),
        ("rollway.rollouts.config", "RolloutSettings", RolloutConfig),
        ("rollway.executors", "WorkerSetup", WorkerConfig),
        ("rollway.executors.base", "WorkerSetup", WorkerConfig),
        ("rollway.agents.server", "ServiceConfig", AgentServerConfig),
        ("rollway.agents.server.service", "ServiceConfig", AgentServerConfig),
        ("rollway.simulators.vllm_server", "VLLMSimOptions", VLLMSimConfig),
        ("rollway.simulators.sglang_server", "SGLangSimOptions", SGLangSimConfig),
    ],
)
def test_an_old_name_gives_the_new_type_with_a_deprecation_warning(
    module: str, old: str, new: type
) -> None:
    warning = f"{module}.{old} is deprecated; use .*{new.__name__}"
    with pytest.warns(DeprecationWarning, match=warning):
        assert getattr(importlib.import_module(module), old) is new


def test_importing_an_old_name_warns_at_the_import() -> None:
    with pytest.warns(DeprecationWarning, match="RolloutResult is deprecated") as caught:
        from rollway import RolloutResult  # noqa: F401
    assert {w.filename for w in caught} == {__file__}


def test_other_unknown_names_are_still_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        _ = rollway.NoSuchThing  # type: ignore[attr-defined]
    assert "RolloutResult" not in rollway.__all__ and "ChatReply" not in rollway.__all__


@pytest.mark.parametrize(("old", "new"), sorted(MOVED_MODULES.items()))
def test_a_moved_module_imports_under_its_old_path_as_the_same_module(old: str, new: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated; use {new}"):
        moved = importlib.import_module(old)
    assert moved is importlib.import_module(new)
    assert moved.__spec__ is not None and moved.__spec__.name == new  # its own spec, unharmed
    assert importlib.util.find_spec(new) is not None


def test_from_an_old_path_a_class_is_the_same_class() -> None:
    sys.modules.pop("rollway.engines.vllm", None)  # an old path warns at its first import
    with pytest.warns(DeprecationWarning):
        from rollway.engines.vllm import VLLMEngine as Old  # type: ignore[import-not-found]
    from rollway.engines.remote.vllm import VLLMEngine

    assert Old is VLLMEngine


def test_a_module_that_never_existed_is_still_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("rollway.engines.no_such_module")
