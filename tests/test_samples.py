"""Samples are built in one place (``rollway.samples``): what a trainer, the export, the viewer
and the gateway's drift read is the same code's, and the public names stay where users import
them (``rollway.trajectory``)."""

from __future__ import annotations

import ast
from pathlib import Path

import rollway.samples
import rollway.trajectory

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "rollway"
#: Calls that make a ``Sample``: the class itself, or one of pydantic's constructors on it.
BUILDERS = {"Sample", "model_construct", "model_validate", "model_validate_json"}


def _builds_a_sample(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Name):
        return func.id == "Sample"
    return (
        isinstance(func, ast.Attribute)
        and func.attr in BUILDERS
        and isinstance(func.value, ast.Name)
        and func.value.id == "Sample"
    )


def test_samples_are_built_only_in_rollway_samples() -> None:
    builders = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if any(map(_builds_a_sample, ast.walk(ast.parse(path.read_text()))))
    )
    assert builders == ["samples.py"]


def test_the_public_names_are_the_one_builder() -> None:
    assert rollway.trajectory.build_samples is rollway.samples.build_samples
    assert rollway.trajectory.Sample is rollway.samples.Sample
