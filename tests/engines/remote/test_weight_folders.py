"""A checkpoint folder is checked before a server is asked to load it (vLLM 0.32's CPU worker
dies on its next step after a refused load)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rollway.engines.remote.weight_folders import check_weights_folder
from rollway.errors import ConfigError

SERVED = {"model.norm.weight": torch.ones(4), "model.embed.weight": torch.ones(2, 3)}


def folder_with(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    return path


@pytest.fixture
def served(tmp_path: Path) -> Path:
    return folder_with(tmp_path / "served", SERVED)


def test_a_folder_with_the_served_shapes_or_some_of_them_passes(
    tmp_path: Path, served: Path
) -> None:
    check_weights_folder(folder_with(tmp_path / "all", SERVED), served)
    check_weights_folder(folder_with(tmp_path / "some", {"model.norm.weight": torch.zeros(4)}))
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    save_file({"model.norm.weight": torch.ones(4)}, str(sharded / "part-1.safetensors"))
    index = {"weight_map": {"model.norm.weight": "part-1.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    check_weights_folder(sharded, served)
    torch_only = tmp_path / "torch-only"
    torch_only.mkdir()
    (torch_only / "pytorch_model.bin").write_bytes(b"checked for presence only")
    check_weights_folder(torch_only, served)


@pytest.mark.parametrize(
    ("name", "cause"),
    [
        ("missing", "does not exist"),
        ("empty", "holds no model.safetensors"),
        ("config only", "holds no model.safetensors"),
        ("garbled", "is not readable safetensors"),
        ("index without a map", "holds no tensors"),
        ("misshapen", "'model.norm.weight' in .* has shape \\(3,\\), the served model's \\(4,\\)"),
        ("unknown", "tensors the served model lacks: lm_head.weight"),
    ],
)
def test_a_bad_folder_is_refused_naming_why(
    tmp_path: Path, served: Path, name: str, cause: str
) -> None:
    folder = tmp_path / name
    if name != "missing":
        folder.mkdir()
    if name == "config only":
        (folder / "config.json").write_text("{}")
    elif name == "garbled":
        (folder / "model.safetensors").write_bytes(b"\xff" * 16)
    elif name == "index without a map":  # weight_map must map names to files
        (folder / "model.safetensors.index.json").write_text('{"weight_map": ["a"]}')
    elif name == "misshapen":
        save_file({"model.norm.weight": torch.ones(3)}, str(folder / "model.safetensors"))
    elif name == "unknown":
        save_file({"lm_head.weight": torch.ones(3)}, str(folder / "model.safetensors"))
    with pytest.raises(ConfigError, match=cause) as refused:
        check_weights_folder(folder, served)
    assert refused.value.param == "source"
