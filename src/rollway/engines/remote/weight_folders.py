"""A checkpoint folder checked before a server is asked to load it, without torch.

vLLM 0.32's CPU worker crashes on its next step after a refused ``reload_weights`` (a missing
folder, one without weights), so a bad folder must never reach it. The check reads the
safetensors headers only (an 8-byte length, then JSON: name -> dtype, shape, offsets), so a
135M model's folder is checked in about a millisecond.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rollway.errors import ConfigError

_SAFETENSORS = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"
_TORCH_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
_MAX_HEADER = 100 * 1024 * 1024  # safetensors' own limit on the JSON header

Shapes = dict[str, tuple[int, ...]]


def check_weights_folder(folder: Path, served: Path | None = None) -> None:
    """Refuse (``ConfigError``, param ``source``) a folder that is missing, holds no weights
    or holds a tensor whose shape differs from the served model's (``served``: its folder,
    when known here). A folder of ``pytorch_model.bin`` files is checked for presence only."""
    if not folder.is_dir():
        raise ConfigError(f"weights folder {str(folder)!r} does not exist", "source")
    shapes = safetensors_shapes(folder)
    if shapes is None:
        if any((folder / name).is_file() for name in _TORCH_FILES):
            return
        raise ConfigError(
            f"weights folder {str(folder)!r} holds no {_SAFETENSORS}, {_SAFETENSORS_INDEX} "
            f"or {_TORCH_FILES[0]}",
            "source",
        )
    if not shapes:
        raise ConfigError(f"weights folder {str(folder)!r} holds no tensors", "source")
    expected = safetensors_shapes(served) if served is not None and served.is_dir() else None
    if expected:
        _check_shapes(folder, shapes, expected)


def safetensors_shapes(folder: Path) -> Shapes | None:
    """Each tensor's shape in the folder's safetensors files; None when it has none."""
    if (folder / _SAFETENSORS).is_file():
        files = [folder / _SAFETENSORS]
    elif (folder / _SAFETENSORS_INDEX).is_file():
        weight_map = _json(folder / _SAFETENSORS_INDEX).get("weight_map")
        names = weight_map.values() if isinstance(weight_map, dict) else ()
        files = [folder / name for name in sorted(set(names))]
    else:
        return None
    shapes: Shapes = {}
    for file in files:
        shapes.update(_header_shapes(file))
    return shapes


def _header_shapes(file: Path) -> Shapes:
    try:
        with file.open("rb") as stream:
            (length,) = struct.unpack("<Q", stream.read(8))
            if length > _MAX_HEADER:
                raise ValueError(f"header of {length} bytes")
            header = json.loads(stream.read(length))
        return {
            name: tuple(int(n) for n in entry["shape"])
            for name, entry in header.items()
            if name != "__metadata__"
        }
    except (OSError, struct.error, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"weights file {str(file)!r} is not readable safetensors: {exc}", "source"
        ) from exc


def _check_shapes(folder: Path, shapes: Shapes, expected: Shapes) -> None:
    unknown = sorted(shapes.keys() - expected.keys())
    if unknown:
        raise ConfigError(
            f"weights folder {str(folder)!r} holds tensors the served model lacks: "
            f"{', '.join(unknown[:3])}",
            "source",
        )
    for name, shape in shapes.items():
        if shape != expected[name]:
            raise ConfigError(
                f"weight {name!r} in {str(folder)!r} has shape {shape}, the served model's "
                f"{expected[name]}",
                "source",
            )


def tied_embedding_changed(folder: Path, loaded: Path) -> bool:
    """Whether ``folder`` brings a tied input embedding (``tie_word_embeddings``: the output
    layer shares it) whose bytes differ from ``loaded``'s, the folder the server holds now.
    False where either folder lacks it (a folder without it leaves it as it is)."""
    config = folder / "config.json"
    if not config.is_file() or not _json(config).get("tie_word_embeddings", False):
        return False
    new, old = _embedding_bytes(folder), _embedding_bytes(loaded)
    return new is not None and old is not None and new != old


def _embedding_bytes(folder: Path) -> bytes | None:
    """The raw bytes of the ``embed_tokens`` tensor in ``model.safetensors``, if any."""
    file = folder / _SAFETENSORS
    if not file.is_file():
        return None
    with file.open("rb") as stream:
        (length,) = struct.unpack("<Q", stream.read(8))
        header = json.loads(stream.read(length))
        names = [name for name in header if name.endswith("embed_tokens.weight")]
        if not names:
            return None
        start, end = header[names[0]]["data_offsets"]
        stream.seek(8 + length + start)
        return stream.read(end - start)


def _json(path: Path) -> dict[str, object]:
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{str(path)!r} is not readable JSON: {exc}", "source") from exc
    return loaded if isinstance(loaded, dict) else {}
