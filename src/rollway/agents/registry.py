"""Find agents by name or by spec: ``module:Class``, ``path/to/file.py:Class``, or a name."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from rollway.agents.base import AgentLoop
from rollway.errors import ConfigError

_REGISTRY: dict[str, type[AgentLoop]] = {}


def register_agent(cls: type[AgentLoop]) -> type[AgentLoop]:
    """Register ``cls`` under its ``name`` (usable as a class decorator)."""
    known = _REGISTRY.get(cls.name)
    if known is not None and known is not cls:
        raise ConfigError(f"agent name {cls.name!r} is already taken by {known.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def load_agent(spec: str) -> type[AgentLoop]:
    """The agent class for ``spec``."""
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    target, sep, attr = spec.rpartition(":")
    if not sep:
        raise ConfigError(f"agent {spec!r}: use module:Class, path/to/file.py:Class or a name")
    module = import_target(target)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
        raise ConfigError(f"{attr!r} in {target!r} is not an AgentLoop subclass")
    return cls


def import_target(target: str) -> object:
    """Import a module by dotted name or from a ``.py`` file path."""
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise ConfigError(f"no agent file {target!r}")
        name = f"rollway_agent_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ImportError as exc:
        raise ConfigError(f"cannot import {target!r}: {exc}") from None
