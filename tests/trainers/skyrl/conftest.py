"""SkyRL's adapter is tested in SkyRL's own venv (``make test-skyrl``: .venv-skyrl, made by
``scripts/trainer_venvs.sh skyrl``), whose pins conflict with rollway's. Elsewhere this folder
is left out of collection; inside that venv it never is, so a SkyRL that does not import fails
the run instead of skipping it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SKYRL_VENV = ".venv-skyrl"


def _skyrl_expected() -> bool:
    return Path(sys.prefix).name == SKYRL_VENV or importlib.util.find_spec("skyrl") is not None


collect_ignore_glob = [] if _skyrl_expected() else ["test_*.py"]
