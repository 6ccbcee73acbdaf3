from __future__ import annotations

import ast
import inspect
import json
import pickle
import re
from pathlib import Path

import pytest

import rollway
from rollway import errors
from rollway.trajectory import Trajectory

ROOT = Path(__file__).parent.parent
SCHEMA = ROOT / "docs" / "trajectory.schema.json"
PACKAGE = ROOT / "src" / "rollway"
#: What users read: their imports and the classes they are told to build must come from
#: where these say.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: Adapters whose trainer lives in its own venv (scripts/trainer_venvs.sh): here, importing
#: them must fail with an ImportError that says how to make that venv.
OWN_VENV = {
    "rollway.trainers.skyrl": "trainer_venvs.sh skyrl",
    "rollway.trainers.verl_steps": "trainer_venvs.sh verl",
}


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


def test_every_name_in_all_imports_from_the_root() -> None:
    namespace: dict[str, object] = {}
    exec("from rollway import *", namespace)
    assert set(rollway.__all__) <= namespace.keys()


def test_every_error_a_caller_can_catch_is_exported() -> None:
    classes = {c.__name__ for c in errors.HTTP_STATUS}
    assert classes <= set(rollway.__all__)


def _code(markdown: str) -> list[str]:
    """The text of every fenced block and inline code span."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, re.M | re.S)
    rest = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return [*blocks, *re.findall(r"`([^`]+)`", rest)]  # a span may wrap a line


def _imports_from_rollway(code: str) -> list[str]:
    """Each ``from rollway... import ...`` statement in ``code``, parentheses included."""
    return re.findall(r"^\s*(from rollway[\w.]* import (?:\([^)]*\)|[^\n]+))", code, re.M)


def test_every_import_the_docs_show_works() -> None:
    statements = [s for doc in DOCS for code in _code(doc.read_text())
                  for s in _imports_from_rollway(code)]  # fmt: skip
    assert "from rollway import AgentLoop, RolloutClient, execute_tool_calls, tool" in statements
    for statement in statements:
        hint = OWN_VENV.get(statement.split()[1])
        if hint is None:
            exec(statement, {})
            continue
        with pytest.raises(ImportError, match=hint):  # said to the user who lacks that venv
            exec(statement, {})


def test_every_rollway_class_the_docs_call_is_exported_from_the_root() -> None:
    """``PollPolicy(initial_s=...)`` in docs/agents.md means ``from rollway import PollPolicy``."""
    defined = {
        node.name
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_")
    }
    called = {name for doc in DOCS for code in _code(doc.read_text())
              for name in re.findall(r"\b([A-Z]\w+)\(", code)}  # fmt: skip
    # From rollway.trainers.trl, .skyrl and .verl_steps, as the docs say.
    imported_elsewhere = {"PromptAgent", "RollwayGenerator", "StepSourceManager"}
    assert {"PollPolicy", "RemoteGateway", "RolloutClient"} <= called
    assert sorted((called & defined) - imported_elsewhere - set(rollway.__all__)) == []


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
