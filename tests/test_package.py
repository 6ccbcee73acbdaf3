from __future__ import annotations

import inspect
import json
import pickle
from pathlib import Path

import rollway
from rollway import errors
from rollway.types import Trajectory

SCHEMA = Path(__file__).parent.parent / "docs" / "trajectory.schema.json"


def test_all_lists_every_public_name() -> None:
    public = {n for n in vars(rollway) if not n.startswith("_") and n != "annotations"}
    modules = {n for n in public if inspect.ismodule(getattr(rollway, n))}
    assert sorted(rollway.__all__) == rollway.__all__
    assert set(rollway.__all__) == public - modules


def test_every_error_class_has_an_http_status_and_pickles() -> None:
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.RollwayError)
    ]
    assert set(classes) == set(errors.HTTP_STATUS)
    for cls in classes:
        error = cls("message", "param")
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is cls and again.message == "message" and again.param == "param"


def test_documented_trajectory_schema_is_current() -> None:
    assert json.loads(SCHEMA.read_text()) == Trajectory.model_json_schema()
