"""The public surface: each public module's exact ``__all__``, every name in it importing, the
docs and examples importing only from it, and a trainer's imports staying light
(docs/architecture.md, "Public and internal").

A name added to or taken from the public surface is changed here on purpose; anything else is
internal and may move without an alias left behind.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import rollway

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "src" / "rollway"
#: What users read: their imports and the classes they are told to build must come from
#: the public surface.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))
#: Adapters whose trainer lives in its own venv (scripts/trainer_venvs.sh): here, importing
#: them must fail with an ImportError that says how to make that venv.
OWN_VENV = {
    "rollway.trainers.skyrl": "trainer_venvs.sh skyrl",
    "rollway.trainers.skyrl_steps": "trainer_venvs.sh skyrl",
    "rollway.trainers.verl": "trainer_venvs.sh verl",
    "rollway.trainers.verl_steps": "trainer_venvs.sh verl",
}

ROOT_NAMES = {
    # errors
    "AgentError", "AuthError", "BadRecordError", "ConfigError", "EngineConnectError",
    "EngineError", "ExperimentInUseError", "InfrastructureError", "InvalidFieldsError",
    "JudgeAnswerError", "MalformedBodyError", "OverloadedError", "PayloadTooLargeError",
    "RequestError", "RewardError", "RolloutClosedError", "RollwayError", "StoredDataError",
    "UnknownRolloutError", "UnsupportedMediaTypeError",
    # agents
    "AgentLoop", "ContextFolding", "DropToolOutputs", "KeepLastTurns", "PollPolicy",
    "ProgramAgent", "QuestionAgent", "RolloutContext", "SummarizeOlder", "Tool",
    "execute_tool_calls", "tool",
    # client, executors, settings, rewards
    "BatchItem", "RolloutClient", "RolloutFuture", "LocalExecutor", "RayExecutor", "Backoff",
    "RetryPolicy", "RolloutLimits", "RolloutOptions", "ServingConfig", "Judge", "Rubric",
    "RewardFn", "parse_score", "rescore", "rescore_async", "RolloutEnvironment",
    "uses_environment",
    # engines, gateway, model folders
    "Engine", "ScriptedEngine", "SimConfig", "SimEngine", "engine_from_spec", "Gateway",
    "RemoteGateway", "build_gateway", "create_app", "resolve_model_path",
    # sandboxes, stores
    "LocalSandbox", "Sandbox", "SandboxLimits", "SandboxResult", "FileStore", "Store",
    "export_records", "store_from_uri",
    # data
    "ChatResult", "GenerationResult", "SamplingParams", "AgentResult", "RolloutMetrics",
    "RolloutRecord", "Drift", "Sample", "Trajectory", "Turn",
}  # fmt: skip

#: Every public module and its exact ``__all__``.
PUBLIC: dict[str, set[str]] = {
    "rollway": ROOT_NAMES,
    "rollway.agents": {
        "AgentLoop", "ContextFolding", "DropToolOutputs", "IssueCode", "KeepLastTurns",
        "ProgramAgent", "QuestionAgent", "RolloutContext", "SummarizeOlder", "Tool",
        "ValidationIssue",
        "ValidationResult", "execute_tool_calls", "list_agents", "load_agent", "register_agent",
        "tool", "unregister_agent", "validate",
    },
    "rollway.client": {
        "BatchItem", "GroupStats", "RolloutClient", "RolloutFuture", "RunSummary", "StepBatch",
        "StepMetrics", "StepSource",
    },
    "rollway.sandbox": {
        "SANDBOXES", "LocalSandbox", "NamespaceSandbox", "Sandbox", "SandboxLimits",
        "SandboxResult", "namespaces_available", "remove_leftovers", "sandbox_factory",
    },
    "rollway.events": {
        "EventBus", "EventSink", "EventsDropped", "RewardScored", "RolloutEvent",
        "RolloutFinished", "RolloutStarted", "RolloutStuck", "StepHandedOver", "ToolCalled",
        "TurnFinished", "TurnStarted",
    },
    "rollway.generation": {
        "MAX_TOP_LOGPROBS", "PER_TOKEN_EXTRAS", "ChatGeneration", "ChatResult", "FinishReason",
        "GenerationChunk", "GenerationResult", "LogprobKind", "Message", "SamplingParams",
    },
    "rollway.trajectory": {
        "Drift", "Sample", "StepDistribution", "Trajectory", "Turn", "build_samples",
    },
    "rollway.results": {
        "AgentReport", "AgentResult", "ReportStatus", "RolloutMetrics", "RolloutRecord",
        "Status", "TrajectoryStats",
    },
    "rollway.trainers": set(),
    "rollway.trainers.trl": {
        "Prompt", "PromptAgent", "TaskFn", "prompt_task", "rollway_reward",
        "rollway_rollout_func", "trainer_sampling",
    },
    "rollway.trainers.trl_steps": {"StepRolloutFunc", "step_rollout_func"},
    "rollway.trainers.mismatch": {"RATIO_BAND", "mismatch_metrics"},
    "rollway.trainers.skyrl": {"RollwayGenerator", "skyrl_engine_spec", "skyrl_sampling"},
    "rollway.trainers.skyrl_steps": {"StepSourceGenerator"},
    "rollway.trainers.verl": {
        "ROW_FIELDS", "RollwayAgentLoop", "RowAgent", "agent_loop_output", "close_clients",
        "rollout_options", "use_client",
    },
    "rollway.trainers.verl_steps": {"StepSourceManager"},
}  # fmt: skip

#: What a trainer's process must be able to import without the server stack.
TRAINER_IMPORTS = "import rollway.generation, rollway.trajectory, rollway.results"
HEAVY = ("starlette", "uvicorn", "httpx", "aiohttp", "ray", "torch", "transformers", "fastapi")


def _source(module: str) -> Path:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _declared_all(module: str) -> list[str]:
    """``__all__`` as the module's source writes it (read, not imported: some adapters import
    only in their trainer's venv)."""
    for node in ast.parse(_source(module).read_text()).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{module} declares no __all__")


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_public_module_declares_exactly_its_public_names(module: str) -> None:
    declared = _declared_all(module)
    assert len(declared) == len(set(declared)), f"{module}.__all__ repeats a name"
    assert set(declared) == PUBLIC[module]


@pytest.mark.parametrize("module", sorted(set(PUBLIC) - set(OWN_VENV)))
def test_every_public_name_imports(module: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module} import *", namespace)
    assert PUBLIC[module] <= namespace.keys()


@pytest.mark.parametrize("module", sorted(OWN_VENV))
def test_an_adapter_of_another_venv_says_how_to_make_it(module: str) -> None:
    with pytest.raises(ImportError, match=OWN_VENV[module]):
        importlib.import_module(module)


def test_the_root_names_each_public_name_by_its_module_and_types_it_for_mypy() -> None:
    """The lazy table, ``__all__`` and the ``TYPE_CHECKING`` imports (what mypy and IDEs see)
    name the same things, from the same modules, and each is what its module defines."""
    tree = ast.parse(_source("rollway").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If))
    typed = {
        alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert typed == rollway._WHERE
    assert sorted(rollway.__all__) == rollway.__all__
    for name, module in rollway._WHERE.items():
        assert getattr(rollway, name) is getattr(importlib.import_module(module), name)


def test_an_unknown_root_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'ChatReply'"):
        _ = rollway.ChatReply  # a name renamed before 0.1.0: no alias kept
    assert set(rollway.__all__) <= set(dir(rollway))


def _code(markdown: str) -> list[str]:
    """The text of every fenced block and inline code span."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", markdown, re.M | re.S)
    rest = re.sub(r"^```.*?^```", "", markdown, flags=re.M | re.S)
    return [*blocks, *re.findall(r"`([^`]+)`", rest)]  # a span may wrap a line


def _imports_from_rollway(code: str) -> list[str]:
    """Each ``from rollway... import ...`` or ``import rollway...`` statement in ``code``."""
    return re.findall(
        r"^\s*((?:from rollway[\w.]* import (?:\([^)]*\)|[^\n]+))|import rollway[\w.]*)",
        code,
        re.M,
    )


def _shown_imports() -> dict[str, list[str]]:
    """Every rollway import a page or an example shows, by where it is shown."""
    shown = {
        str(doc.relative_to(ROOT)): [s for code in _code(doc.read_text())
                                     for s in _imports_from_rollway(code)]
        for doc in DOCS
    }  # fmt: skip
    for example in EXAMPLES:
        tree = ast.parse(example.read_text())
        shown[str(example.relative_to(ROOT))] = [
            ast.unparse(node)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom | ast.Import)
            and any(m.split(".")[0] == "rollway" for m in _modules(node))
        ]
    return shown


def _modules(node: ast.ImportFrom | ast.Import) -> list[str]:
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return [alias.name for alias in node.names]


def _private_names(statement: str) -> list[str]:
    """What a statement imports from outside the public surface."""
    node = ast.parse(statement.strip()).body[0]
    assert isinstance(node, ast.ImportFrom | ast.Import), statement
    if isinstance(node, ast.Import):
        return [m for m in _modules(node) if m not in PUBLIC]
    module = node.module or ""
    if module not in PUBLIC:
        return [module]
    return [f"{module}.{a.name}" for a in node.names if a.name not in PUBLIC[module]]


def test_the_docs_and_examples_import_only_public_names() -> None:
    shown = _shown_imports()
    assert (
        "from rollway import AgentLoop, RolloutClient, execute_tool_calls, tool"
        in (shown["README.md"])
    )
    assert any("rollway.agents" in s for s in shown["examples/calculator/agent.py"])
    private = {where: names for where, statements in shown.items()
               if (names := [n for s in statements for n in _private_names(s)])}  # fmt: skip
    assert private == {}, f"internal imports shown to users: {private}"


def test_every_import_the_docs_show_works() -> None:
    statements = [s for doc in DOCS for code in _code(doc.read_text())
                  for s in _imports_from_rollway(code)]  # fmt: skip
    for statement in statements:
        hint = OWN_VENV.get(statement.split()[1])
        if hint is None:
            exec(statement, {})
            continue
        with pytest.raises(ImportError, match=hint):  # said to the user who lacks that venv
            exec(statement, {})


def test_private_names_are_caught() -> None:
    """The check above can fail: an internal module or a name outside ``__all__`` is named."""
    assert _private_names("from rollway.agents.folding import ContextFolding") == [
        "rollway.agents.folding"
    ]
    assert _private_names("from rollway.generation import stop_strings") == [
        "rollway.generation.stop_strings"
    ]
    assert _private_names("import rollway.gateway") == ["rollway.gateway"]
    assert _private_names("from rollway import (\n  Rubric,\n  Judge)") == []


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


def _fresh_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a new interpreter that imports this checkout's rollway."""
    env = {**os.environ, "PYTHONPATH": str(Path(inspect.getfile(rollway)).parents[1])}
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_a_trainer_imports_the_data_types_without_the_server_stack() -> None:
    code = (
        f"{TRAINER_IMPORTS}\n"
        "from rollway import AgentResult, RolloutRecord, Sample, SamplingParams, Trajectory\n"
        "import sys\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
        "print(sorted(m for m in sys.modules if m.startswith('rollway.')))"
    )
    ran = _fresh_python(code)
    assert ran.returncode == 0, ran.stderr
    heavy, modules = ran.stdout.splitlines()
    assert heavy == "[]"
    assert not any(
        m.startswith(("rollway.gateway", "rollway.engines", "rollway.client"))
        for m in ast.literal_eval(modules)
    ), modules


def test_the_root_still_answers_every_public_name() -> None:
    ran = _fresh_python(
        "import rollway, sys\n"
        "assert 'rollway.client' not in sys.modules\n"
        "print(rollway.RolloutClient.__module__, 'starlette' in sys.modules)"
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["rollway.client.rollout_client", "True"]
