"""New weights for an in-process model: read a checkpoint folder, check a state dict, copy it in.

A source is an HF checkpoint folder (``model.safetensors``, sharded safetensors with their
``model.safetensors.index.json``, or ``pytorch_model.bin`` and its sharded form) or an
in-memory state dict. ``check_state_dict`` refuses a source that does not fit the model
(a missing, unexpected or misshapen key) before anything is written, so a refused update
leaves the old weights whole; ``copy_weights`` then copies every tensor into the existing
parameters, so the caller may change its tensors afterwards (an optimizer step) without
touching the engine's weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from rollway.engines.base import WeightSource
from rollway.errors import ConfigError


def read_state_dict(source: WeightSource) -> Mapping[str, Any]:
    """The tensors of ``source``: the mapping itself, or those in a checkpoint folder (on CPU)."""
    if isinstance(source, Mapping):
        return source
    if not isinstance(source, str | os.PathLike):
        raise ConfigError(
            f"weights come as a checkpoint folder or a state dict, not {type(source).__name__}",
            "source",
        )
    from transformers.modeling_utils import load_state_dict

    state: dict[str, Any] = {}
    for file in checkpoint_files(Path(os.fspath(source))):
        state.update(load_state_dict(file, map_location="cpu"))
    return state


def checkpoint_files(folder: Path) -> list[Path]:
    """The weight files of an HF checkpoint folder, safetensors first (as ``from_pretrained``)."""
    if not folder.is_dir():
        raise ConfigError(f"weights source {str(folder)!r} is not a folder", "source")
    files = weight_files(folder)
    if not files:
        raise ConfigError(f"weights folder {str(folder)!r} holds no {weight_names()}", "source")
    return files


def weight_files(folder: Path) -> list[Path]:
    """The weight files in ``folder``, safetensors first; none: it holds no weights."""
    from transformers.utils import (
        SAFE_WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_NAME,
        WEIGHTS_INDEX_NAME,
        WEIGHTS_NAME,
    )

    for single, index in (
        (SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME),
        (WEIGHTS_NAME, WEIGHTS_INDEX_NAME),
    ):
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            weight_map = json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"]
            return [folder / name for name in sorted(set(weight_map.values()))]
    return []


def weight_names() -> str:
    """The files a folder's weights may be in, for a message."""
    from transformers.utils import (
        SAFE_WEIGHTS_INDEX_NAME,
        SAFE_WEIGHTS_NAME,
        WEIGHTS_INDEX_NAME,
        WEIGHTS_NAME,
    )

    return f"{SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, {WEIGHTS_NAME} or {WEIGHTS_INDEX_NAME}"


def check_state_dict(model: torch.nn.Module, state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """``state`` completed for ``model.load_state_dict(strict=True)`` and staged: each tensor
    copied to its parameter's device and dtype, so the copy into the model that follows cannot
    fail half-way. A ``ConfigError`` names the first key that does not fit (missing, unknown,
    not a tensor, wrong shape, not readable: a meta tensor, say)."""
    expected = model.state_dict()
    full = _fill_tied(model, expected.keys(), dict(state))
    missing = sorted(expected.keys() - full.keys())
    if missing:
        raise ConfigError(f"weights miss {_names(missing)}", "source")
    unexpected = sorted(full.keys() - expected.keys())
    if unexpected:
        raise ConfigError(f"weights hold unknown {_names(unexpected)}", "source")
    staged: dict[str, torch.Tensor] = {}
    for key, current in expected.items():
        _check_tensor(key, full[key], current)
        staged[key] = _staged(key, full[key], current)
    return staged


def _staged(key: str, given: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    try:
        with torch.no_grad():
            return given.detach().to(device=current.device, dtype=current.dtype, copy=True)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        raise ConfigError(f"weight {key!r} cannot be read: {exc}", "source") from exc


def _fill_tied(model: torch.nn.Module, keys: Iterable[str], full: dict[str, Any]) -> dict[str, Any]:
    """Give both keys of each tied pair (``lm_head.weight`` sharing ``embed_tokens.weight``).

    A checkpoint from ``save_pretrained`` holds one of the pair, ``state_dict()`` both; both
    with different values are refused, since which one would win is arbitrary.
    """
    known = set(keys)
    # {tied key: the key whose storage it shares}, as transformers records it.
    tied: dict[str, str] = dict(getattr(model, "all_tied_weights_keys", None) or {})
    for target, source in tied.items():
        if target not in known or source not in known:
            continue
        if target in full and source in full and _differ(full[target], full[source]):
            raise ConfigError(
                f"weights {target!r} and {source!r} are tied in this model but differ", "source"
            )
        if target in full:
            full.setdefault(source, full[target])
        elif source in full:
            full[target] = full[source]
    return full


def _check_tensor(key: str, given: Any, current: torch.Tensor) -> None:
    if not isinstance(given, torch.Tensor):
        raise ConfigError(f"weight {key!r} is a {type(given).__name__}, not a tensor", "source")
    if given.shape != current.shape:
        raise ConfigError(
            f"weight {key!r} has shape {tuple(given.shape)}, expected {tuple(current.shape)}",
            "source",
        )
    if given.is_floating_point() != current.is_floating_point():
        raise ConfigError(
            f"weight {key!r} has dtype {given.dtype}, expected {current.dtype}", "source"
        )


def copy_weights(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy a checked state dict into ``model``'s own parameters (no new module, no aliasing)."""
    with torch.no_grad():
        model.load_state_dict(state, strict=True, assign=False)


def _differ(a: Any, b: Any) -> bool:
    tensors = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    if not tensors or a.shape != b.shape or a.is_meta or b.is_meta:
        return False  # the per-key checks name the problem
    return not torch.equal(a.cpu(), b.to(a.dtype).cpu())


def _names(keys: list[str]) -> str:
    shown = ", ".join(repr(k) for k in keys[:5])
    return f"{shown} and {len(keys) - 5} more" if len(keys) > 5 else shown
