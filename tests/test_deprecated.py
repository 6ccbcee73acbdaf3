"""Renamed public types still import under their old names for one release, with a warning."""

from __future__ import annotations

import importlib

import pytest

import rollway
from rollway.types import AgentResult, ChatResult


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        ("rollway", "RolloutResult", AgentResult),
        ("rollway.types", "RolloutResult", AgentResult),
        ("rollway", "ChatReply", ChatResult),
        ("rollway.agents", "ChatReply", ChatResult),
        ("rollway.agents.context", "ChatReply", ChatResult),
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
