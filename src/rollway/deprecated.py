"""Old names kept for one release: a module whose public names were renamed answers the old
ones from its ``__getattr__`` with the new object and a ``DeprecationWarning``."""

from __future__ import annotations

import warnings
from typing import Any


def deprecated_alias(module: str, name: str, renamed: dict[str, tuple[str, Any]]) -> Any:
    """``module.name`` looked up after the usual attributes missed: ``renamed`` maps each old
    name to its new name and object; any other name is an ``AttributeError``, as usual."""
    if name not in renamed:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new_name, value = renamed[name]
    # stacklevel 3: past this helper and the module's __getattr__, at the importing line.
    warnings.warn(f"{module}.{name} is deprecated; use {new_name}", DeprecationWarning, 3)
    return value
