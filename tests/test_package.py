"""The package's own checks: errors, the documented schema, the /metrics table (the public
surface: tests/test_public_api.py)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import rollway
from rollway import errors
from rollway.trajectory import Trajectory

ROOT = Path(__file__).parent.parent
SCHEMA = ROOT / "docs" / "trajectory.schema.json"


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


def test_every_error_a_caller_can_catch_is_exported() -> None:
    classes = {c.__name__ for c in errors.HTTP_STATUS}
    assert classes <= set(rollway.__all__)


def test_the_gateway_page_documents_every_metric_with_its_type_and_labels() -> None:
    from prometheus_client.metrics import MetricWrapperBase

    from rollway.gateway.metrics import GatewayMetrics

    page = (ROOT / "docs" / "gateway.md").read_text()
    rows = {
        cells[1].strip("` "): cells
        for line in page.splitlines()
        if line.startswith("| `rollway_") and len(cells := line.split("|")) > 4
    }
    for metric in vars(GatewayMetrics()).values():
        if not isinstance(metric, MetricWrapperBase):
            continue
        name = metric._name + ("_total" if metric._type == "counter" else "")
        assert name in rows, f"docs/gateway.md's /metrics table misses {name}"
        assert rows[name][2].strip() == metric._type, name
        for label in metric._labelnames:
            assert f"`{label}`" in rows[name][3], (name, label)
