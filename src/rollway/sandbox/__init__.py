"""Sandboxes for program agents: run a command isolated, bounded, and always torn down."""

from rollway.sandbox.base import Sandbox, SandboxLimits, SandboxResult
from rollway.sandbox.local import LocalSandbox

__all__ = ["LocalSandbox", "Sandbox", "SandboxLimits", "SandboxResult"]
