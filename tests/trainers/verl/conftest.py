"""verl's adapter is tested in verl's own venv (``make test-verl``: .venv-verl, made by
``scripts/trainer_venvs.sh verl``), whose transformers pin conflicts with rollway's. Elsewhere
this folder is left out of collection; inside that venv it never is, so a verl that does not
import fails the run instead of skipping it."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from pathlib import Path

VERL_VENV = ".venv-verl"


def _verl_expected() -> bool:
    return Path(sys.prefix).name == VERL_VENV or importlib.util.find_spec("verl") is not None


collect_ignore_glob = [] if _verl_expected() else ["test_*.py"]


def _import_verl() -> None:
    """verl 0.9.1 imports ``ray.experimental.state.api``, which Ray 2.60 deprecates with a
    warning that this suite would turn into an error, and its trainer warns for each optional
    training engine that is not installed (torchtitan, veomni, ...): those warnings of verl's
    import are let through, here, before the tests import verl (then from the module cache)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", "Ray state API is no longer experimental", DeprecationWarning
        )
        warnings.filterwarnings("ignore", r"\w+ engine is not available", UserWarning)
        importlib.import_module("verl.experimental.agent_loop")
        importlib.import_module("verl.trainer.ppo.ray_trainer")


if _verl_expected():
    _import_verl()
