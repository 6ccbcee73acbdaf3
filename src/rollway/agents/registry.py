"""Find agents by name or by spec: ``module:Class``, ``path/to/file.py:Class``, or a name."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from pathlib import Path

from rollway.agents.base import AgentLoop
from rollway.errors import ConfigError

_REGISTRY: dict[str, type[AgentLoop]] = {}
#: Frames in here are rollway's own, not the user's code.
_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


def register_agent(cls: type[AgentLoop]) -> type[AgentLoop]:
    """Register ``cls`` under its ``name`` (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
        raise ConfigError(f"only AgentLoop subclasses can be registered, not {cls!r}")
    known = _REGISTRY.get(cls.name)
    if known is not None and known is not cls:
        raise ConfigError(f"agent name {cls.name!r} is already taken by {known.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def unregister_agent(name: str) -> type[AgentLoop]:
    """Remove the agent registered as ``name``; the class it was."""
    try:
        return _REGISTRY.pop(name)
    except KeyError:
        raise ConfigError(f"no agent is registered as {name!r}; {_registered()}") from None


def list_agents() -> dict[str, type[AgentLoop]]:
    """The registered agents by name, sorted by name."""
    return dict(sorted(_REGISTRY.items()))


def load_agent(spec: str) -> type[AgentLoop]:
    """The agent class for ``spec``."""
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    target, sep, attr = spec.rpartition(":")
    if not sep:
        raise ConfigError(
            f"agent {spec!r} is not a registered name ({_registered()}): use module:Class, "
            "path/to/file.py:Class or a registered name",
            param="agent",
        )
    module = import_target(target)
    cls = getattr(module, attr, None)
    if isinstance(cls, type) and issubclass(cls, AgentLoop):
        return cls
    names = ", ".join(c.__name__ for c in agent_classes(module)) or "none"
    what = "does not exist" if cls is None else "is not an AgentLoop subclass"
    raise ConfigError(
        f"{attr!r} in {target!r} {what}; its AgentLoop classes: {names}", param="agent"
    )


def agent_classes(module: object) -> list[type[AgentLoop]]:
    """The agent classes ``module`` defines (not those it imports). An abstract class without
    a name is a base for others; with one, it is an agent."""
    return [
        value
        for value in vars(module).values()
        if isinstance(value, type)
        and issubclass(value, AgentLoop)
        and value.__module__ == getattr(module, "__name__", None)
        and (value.name or not inspect.isabstract(value))
    ]


def _registered() -> str:
    names = ", ".join(list_agents())
    return f"registered: {names}" if names else "none is registered"


def import_target(target: str, what: str = "agent") -> object:
    """Import a module by dotted name or from a ``.py`` file path. A module that fails to load
    (a syntax error, an agent class without ``name``) is a ``ConfigError`` naming the line of
    the user's code that failed; ``what`` ("agent", "reward") says what was being loaded."""
    try:
        if target.endswith(".py"):
            return _import_file(target, what)
        return importlib.import_module(target)
    except ConfigError:
        raise
    except ImportError as exc:
        raise ConfigError(f"cannot import {target!r}: {exc}", param=what) from exc
    except Exception as exc:
        raise ConfigError(f"{_failed_line(exc, target)}: {_describe(exc)}", param=what) from exc


def _import_file(target: str, what: str) -> object:
    path = Path(target).resolve()
    if not path.is_file():
        raise ConfigError(f"no {what} file {target!r}", param=what)
    name = f"rollway_agent_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # half a module must not satisfy the next import
        raise
    return module


def _describe(exc: Exception) -> str:
    if isinstance(exc, SyntaxError):
        return f"syntax error: {exc.msg}"
    return f"{type(exc).__name__}: {exc}"


def _failed_line(exc: Exception, target: str) -> str:
    """``file:line`` of the user's code that raised ``exc``: for a syntax error the place the
    parser names, else the innermost frame outside rollway and the import machinery."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{_shown(exc.filename)}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if not f.filename.startswith((_PACKAGE_DIR, "<frozen"))]
    if not ours:
        return target
    return f"{_shown(ours[-1].filename)}:{ours[-1].lineno}"


def _shown(filename: str) -> str:
    """A path as the user most likely wrote it: relative to the working folder when inside it."""
    relative = os.path.relpath(filename)
    return filename if relative.startswith("..") else relative
