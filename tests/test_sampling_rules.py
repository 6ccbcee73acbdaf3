"""One rule per sampling setting: the same bad value gets the same refusal, naming the field,
on every surface that takes sampling (in process, the client's mappings and keywords, the
gateway's register, chat completions, responses and Anthropic messages over HTTP, an agent
server's init, ``rollway run``'s options and its ``--config`` file), and the same good value is
taken, held alike. The rules are ``rollway.sampling_settings``; docs/agents.md shows its table."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from rollway.cli.main import app
from rollway.errors import RollwayError
from rollway.generation import SamplingParams
from rollway.rollouts.config import RolloutConfig
from rollway.sampling_settings import SETTING, SETTINGS, docs_table
from tests.agents.server.fixtures import AgentServer
from tests.conftest import Served

ROOT = Path(__file__).resolve().parents[1]

#: (setting, bad value): ranges, strings and bools for numbers, NaN, empty stop strings.
BAD: list[tuple[str, Any]] = [
    ("temperature", 5.0),
    ("temperature", -0.5),
    ("temperature", "0.5"),
    ("temperature", "hot"),
    ("temperature", True),
    ("temperature", math.nan),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", -2),
    ("top_k", 2.5),
    ("max_tokens", 0),
    ("max_tokens", True),
    ("seed", 1.5),
    ("seed", 2**63),
    ("top_logprobs", 21),
    ("top_logprobs", -1),
    ("top_logprobs", False),
    ("record_entropy", 1),
    ("record_entropy", "yes"),
    ("stop", [""]),
    ("stop_token_ids", [-1]),
]
#: A wire's own name for a setting (what its refusal names).
RESPONSES = {"temperature": "temperature", "top_p": "top_p", "top_logprobs": "top_logprobs"}
RESPONSES |= {"max_tokens": "max_output_tokens"}
ANTHROPIC = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
ANTHROPIC |= {"max_tokens": "max_tokens", "stop": "stop_sequences"}
#: ``rollway run``'s options (``record_entropy`` is a flag, ``stop_token_ids`` not an option).
CLI = ("temperature", "top_p", "top_k", "max_tokens", "seed", "top_logprobs", "stop")


def rule(name: str) -> str:
    return SETTING[name].rule


# In process.


@pytest.mark.parametrize(("name", "value"), BAD)
def test_in_process_surfaces_refuse_by_the_rule(name: str, value: Any) -> None:
    for make in (
        lambda: SamplingParams(**{name: value}),
        lambda: RolloutConfig.build("e", sampling={name: value}),
        lambda: RolloutConfig.build("e", options={name: value}),
    ):
        with pytest.raises(RollwayError) as raised:
            make()
        assert raised.value.message.startswith(f"{name}: {rule(name)}, not ")
        assert raised.value.param == name


# Over HTTP: the gateway and an agent server.


@pytest.fixture
def admin(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.url, headers=served.admin_headers, timeout=60) as client:
        yield client


def rollout(admin: httpx.Client) -> tuple[str, dict[str, str]]:
    rollout_id = f"rule-{uuid.uuid4().hex[:8]}"
    answer = admin.post(f"/v1/rollouts/{rollout_id}/register", json={})
    assert answer.status_code == 200, answer.text
    return rollout_id, {"Authorization": f"Bearer {answer.json()['api_key']}"}


def assert_refused(answer: httpx.Response, field: str, name: str) -> None:
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["param"] == field
    assert error["message"].startswith(f"{field}: {rule(name)}, not "), error["message"]


def http_bodies(name: str, value: Any) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(route, body, the field its refusal names) for each chat route taking ``name``."""
    user = [{"role": "user", "content": "hi"}]
    yield "chat/completions", {"messages": user, "logprobs": True, name: value}, name
    if name in RESPONSES:
        yield "responses", {"input": "hi", RESPONSES[name]: value}, RESPONSES[name]
    if name in ANTHROPIC and not (name == "stop" and isinstance(value, str)):
        body = {"messages": user, "max_tokens": 4, ANTHROPIC[name]: value}
        yield "messages", body, ANTHROPIC[name]


@pytest.mark.parametrize(("name", "value"), [b for b in BAD if b[1] is not math.nan])
def test_http_surfaces_refuse_by_the_rule(
    admin: httpx.Client, agent_server: Callable[..., AgentServer], name: str, value: Any
) -> None:
    # (NaN is no JSON: a body holding it is a 400 before any field is read.)
    register = admin.post(f"/v1/rollouts/rule-{uuid.uuid4().hex[:8]}/register", json={name: value})
    assert_refused(register, name, name)
    rollout_id, key = rollout(admin)
    for route, body, field in http_bodies(name, value):
        answer = admin.post(f"/v1/rollouts/{rollout_id}/{route}", json=body, headers=key)
        assert_refused(answer, field, name)
    init = agent_server().init("r1", sampling={name: value})
    assert_refused(init, f"sampling.{name}", name)


# rollway run: its options and its --config file.


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(app, ["run", *args, "--print-config"])


def cli_text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


@pytest.mark.parametrize(("name", "value"), [b for b in BAD if b[0] in CLI])
def test_run_options_refuse_by_the_rule(name: str, value: Any) -> None:
    if name == "stop":
        value = value[0]
    elif value == "0.5":
        value = "half"  # a number as text is what a command line holds
    result = run_cli(f"--{name.replace('_', '-')}", cli_text(value))
    assert result.exit_code == 2, result.output
    said = re.sub(r"[\s│]+", " ", result.output)  # as the terminal wrapped it
    option = f"--{name.replace('_', '-')}"
    assert f"'{option}': {rule(name)}, not " in said, said


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value) if not isinstance(value, list) else f"[{toml_value(value[0])}]"


@pytest.mark.parametrize(("name", "value"), [b for b in BAD if b[0] != "stop_token_ids"])
def test_a_config_file_refuses_by_the_rule(tmp_path: Path, name: str, value: Any) -> None:
    (tmp_path / "run.toml").write_text(f"{name} = {toml_value(value)}\n")
    result = run_cli("--config", str(tmp_path / "run.toml"))
    assert isinstance(result.exception, RollwayError), result.output
    message = result.exception.message
    assert message.startswith(f"{tmp_path / 'run.toml'}: {name}: "), message
    # A flag's refusal says its rule in the file's own words (the TOML type it got).
    wanted = rule(name) if name != "record_entropy" else "must be true or false, not "
    assert wanted in message and result.exception.param == name


# Good values: taken by every surface, held alike.

GOOD = {"temperature": 2.0, "top_p": 1e-9, "top_k": -1, "max_tokens": 1, "seed": 2**63 - 1}
GOOD |= {"top_logprobs": 20, "stop": ["</a>"]}
HELD = {**GOOD, "top_k": 0, "stop": ("</a>",)}


def test_good_values_are_taken_alike_everywhere(served: Served, admin: httpx.Client) -> None:
    assert SamplingParams(**GOOD) == SamplingParams(**HELD)
    assert RolloutConfig.build("e", sampling=GOOD).sampling == SamplingParams(**HELD)
    registered = admin.post("/v1/rollouts/rule-good/register", json=GOOD)
    assert registered.status_code == 200, registered.text
    state = served.gateway._rollouts["rule-good"]
    assert state.sampling == SamplingParams(**HELD)
    options = [
        f"--{k.replace('_', '-')}={cli_text(v if k != 'stop' else v[0])}" for k, v in GOOD.items()
    ]
    printed = run_cli(*options)
    assert printed.exit_code == 0, printed.output
    assert "top_k = 0\n" in printed.output and "temperature = 2.0\n" in printed.output


def test_the_docs_show_the_declared_table() -> None:
    assert docs_table() in (ROOT / "docs" / "agents.md").read_text()
    assert [s.name for s in SETTINGS] == list(SamplingParams.__dataclass_fields__)
    assert SamplingParams() == SamplingParams(**{s.name: s.default for s in SETTINGS})
