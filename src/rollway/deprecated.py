"""Old names kept for one release: a module whose public names were renamed answers the old
ones from its ``__getattr__`` with the new object and a ``DeprecationWarning``; a module that
moved answers its old dotted path the same way (``MOVED_MODULES``)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
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


#: Modules that moved into sub-packages, by their old dotted path; the old path imports the new
#: module, with a ``DeprecationWarning``, for one release.
MOVED_MODULES = {
    "rollway.engines.batch_runner": "rollway.engines.embedded.batch_runner",
    "rollway.engines.decode_batch": "rollway.engines.embedded.decode_batch",
    "rollway.engines.kv_cache": "rollway.engines.embedded.kv_cache",
    "rollway.engines.sampling": "rollway.engines.embedded.sampling",
    "rollway.engines.state_dicts": "rollway.engines.embedded.state_dicts",
    "rollway.engines.remote_client": "rollway.engines.remote.connection",
    "rollway.engines.sse": "rollway.engines.remote.sse",
    "rollway.engines.sglang": "rollway.engines.remote.sglang",
    "rollway.engines.sglang_wire": "rollway.engines.remote.sglang_wire",
    "rollway.engines.sglang_stream": "rollway.engines.remote.sglang_stream",
    "rollway.engines.vllm": "rollway.engines.remote.vllm",
    "rollway.engines.vllm_wire": "rollway.engines.remote.vllm_wire",
    "rollway.engines.vllm_stream": "rollway.engines.remote.vllm_stream",
    "rollway.engines.openai_chat": "rollway.engines.remote.openai_chat",
    "rollway.engines.pause_gate": "rollway.engines.remote.pause_gate",
    "rollway.engines.weight_folders": "rollway.engines.remote.weight_folders",
    "rollway.engines.router": "rollway.engines.remote.router",
    "rollway.engines.models": "rollway.model_folders",
    "rollway.store.s3": "rollway.store.object_store",
    "rollway.gateway.http_app": "rollway.gateway.http.gateway_app",
    "rollway.gateway.sse_response": "rollway.gateway.http.sse_response",
    "rollway.gateway.lease_routes": "rollway.gateway.http.lease_routes",
    "rollway.gateway.chat_bodies": "rollway.gateway.http.chat_completions_api",
    "rollway.gateway.responses_api": "rollway.gateway.http.responses_api",
    "rollway.gateway.anthropic": "rollway.gateway.http.messages_api",
    "rollway.gateway.chat_template": "rollway.gateway.render.chat_template",
    "rollway.gateway.message_template": "rollway.gateway.render.message_template",
    "rollway.gateway.token_bound": "rollway.gateway.render.token_bound",
    "rollway.gateway.tool_calls": "rollway.gateway.render.tool_calls",
    "rollway.gateway.turn_stream": "rollway.gateway.render.turn_stream",
}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds a moved module under its old path and loads it as the new module itself, so both
    names share one module object (its classes stay the same classes)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED_MODULES[spec.name]
        # stacklevel past importlib's frames is not stable; the message names both paths.
        warnings.warn(f"{spec.name} is deprecated; use {new}", DeprecationWarning, 2)
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run (the new module ran when it was imported); importlib has just set the
        old path's spec on it, so its own goes back."""
        module.__spec__ = self._specs.pop(module.__spec__.name if module.__spec__ else "", None)


def install_moved_module_finder() -> None:
    """Lets the old paths of ``MOVED_MODULES`` import (once per process)."""
    if not any(isinstance(finder, _MovedModule) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModule())
