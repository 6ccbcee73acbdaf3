"""Without verl (rollway's own venv: verl's transformers pin conflicts with rollway's), the verl
adapter's import fails saying where verl lives; its real tests run in .venv-verl."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("verl") is not None, reason="verl is installed")
def test_import_without_verl_names_its_venv_and_script(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "rollway.trainers.verl", raising=False)
    with pytest.raises(ImportError, match=r"scripts/trainer_venvs\.sh verl.*\.venv-verl"):
        importlib.import_module("rollway.trainers.verl")
