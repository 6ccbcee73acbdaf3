"""Sandboxes for program agents: run a command isolated, bounded, and always torn down."""

from collections.abc import Callable

from rollway.errors import ConfigError
from rollway.sandbox.base import Sandbox, SandboxLimits, SandboxResult
from rollway.sandbox.leftovers import remove_leftovers
from rollway.sandbox.local_sandbox import LocalSandbox
from rollway.sandbox.namespace import NamespaceSandbox, namespaces_available

SANDBOXES: dict[str, type[Sandbox]] = {"local": LocalSandbox, "namespace": NamespaceSandbox}


def sandbox_factory(name: str) -> Callable[[SandboxLimits], Sandbox]:
    """The sandbox class named ``local`` or ``namespace``."""
    if name not in SANDBOXES:
        raise ConfigError(f"unknown sandbox {name!r}: choose from {', '.join(SANDBOXES)}")
    return SANDBOXES[name]


__all__ = [
    "SANDBOXES",
    "LocalSandbox",
    "NamespaceSandbox",
    "Sandbox",
    "SandboxLimits",
    "SandboxResult",
    "namespaces_available",
    "remove_leftovers",
    "sandbox_factory",
]
