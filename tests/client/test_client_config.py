"""The client's settings: config objects and their keyword sugar, typed sampling, per-call and
per-batch overrides that really change the rollout (or are refused by name), the default
timeout, and status lines on a timer."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_type_hints

import orjson
import pytest

from rollway import RetryPolicy, RolloutLimits, SamplingParams
from rollway.agents import AgentLoop, RolloutContext
from rollway.client import RolloutClient
from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.sim import SimConfig
from rollway.errors import ConfigError, InvalidFieldsError
from rollway.gateway import Gateway
from rollway.gateway.render.chat_template import ChatRenderer
from rollway.results import AgentResult
from rollway.rollouts.config import (
    LIMIT_NAMES,
    RETRY_NAMES,
    ROLLOUT_ATTEMPTS,
    SAMPLING_NAMES,
    RolloutOptions,
)
from tests.client.conftest import ScriptedAgent

MakeClient = Callable[..., RolloutClient]


class AskingAgent(AgentLoop):
    """Asks for its own sampling on every call: what the client fixed must win, the rest not."""

    name = "asking"

    async def run(self, ctx: RolloutContext) -> AgentResult:
        messages = [{"role": "user", "content": "hi"}]
        reply = await ctx.chat(messages, temperature=0.9, top_p=0.5, stop=["\n\n"])
        return ctx.complete([*messages, reply.message])


def test_invoke_max_turns_override_stops_the_rollout_after_one_turn(
    make_client: MakeClient,
) -> None:
    client = make_client()
    task = {"task_id": "talk", "chats": 3}
    whole = client.invoke(task).result(timeout=30)
    assert (whole.status, len(whole.trajectory.turns)) == ("completed", 3)
    cut = client.invoke(task, max_turns=1).result(timeout=30)
    assert cut.status == "truncated" and cut.trajectory.is_truncated
    assert len(cut.trajectory.turns) == 1


def test_invoke_sampling_override_reaches_the_turn_and_that_rollout_alone(
    make_client: MakeClient,
) -> None:
    client = make_client(temperature=0.7, max_tokens=4)
    hot = client.invoke({"task_id": "hot"}, temperature=0.25).result(timeout=30)
    plain = client.invoke({"task_id": "plain"}).result(timeout=30)
    assert hot.trajectory.turns[0].sampling["temperature"] == 0.25
    assert hot.trajectory.turns[0].sampling["max_tokens"] == 4  # the client's, kept
    assert plain.trajectory.turns[0].sampling["temperature"] == 0.7


def test_invoke_timeout_override_times_out_that_rollout(make_client: MakeClient) -> None:
    client = make_client(sim=SimConfig(latency_s=60.0))
    record = client.invoke({"task_id": "slow"}, timeout=0.3).result(timeout=30)
    assert record.status == "timeout" and "0.3" in record.reason


def test_run_batch_overrides_apply_to_the_batch_and_its_config(make_client: MakeClient) -> None:
    client = make_client()
    tasks = [{"task_id": f"b{i}", "chats": 2} for i in range(2)]
    records = [i.result for i in client.run_batch(tasks, temperature=0.25, max_turns=1)]
    assert {r.status for r in records} == {"truncated"}
    assert [len(r.trajectory.turns) for r in records] == [1, 1]
    assert {r.trajectory.turns[0].sampling["temperature"] for r in records} == {0.25}
    config = orjson.loads((client.store.path / "config.json").read_bytes())
    assert config["sampling"] == {"temperature": 0.25} and config["limits"]["max_turns"] == 1


CALLS = {
    "invoke": lambda client, **options: client.invoke({"task_id": "x"}, **options),
    "run_batch": lambda client, **options: client.run_batch([{"task_id": "x"}], **options),
    "run_batch_async": lambda client, **options: client.run_batch_async(
        [{"task_id": "x"}], **options
    ),
}


@pytest.mark.parametrize("call", CALLS)
def test_a_model_override_is_refused_by_name(make_client: MakeClient, call: str) -> None:
    client = make_client()
    with pytest.raises(ConfigError, match="model cannot change per call") as raised:
        CALLS[call](client, model="other")
    assert raised.value.param == "model"


@pytest.mark.parametrize("call", CALLS)
def test_an_unknown_override_is_refused_by_name_before_anything_runs(
    make_client: MakeClient, call: str
) -> None:
    client = make_client()
    with pytest.raises(ConfigError, match="unknown option 'max_turn': did you mean 'max_turns'"):
        CALLS[call](client, max_turn=1)
    assert not list(client.store.records())


def test_a_bad_override_value_is_refused_naming_the_field(make_client: MakeClient) -> None:
    client = make_client()
    with pytest.raises(InvalidFieldsError, match="top_p"):
        client.invoke({"task_id": "v"}, top_p=0.0)
    with pytest.raises(ConfigError, match="max_turns must be a whole number of at least 1"):
        client.invoke({"task_id": "v"}, max_turns=0)


def test_a_rollout_times_out_after_900_s_unless_told_otherwise(make_client: MakeClient) -> None:
    assert make_client().settings.limits.timeout == 900.0
    assert make_client(timeout=None).settings.limits.timeout is None
    assert make_client(limits=RolloutLimits(timeout=None)).settings.limits.timeout is None
    client = make_client()
    list(client.run_batch([{"task_id": "d"}]))
    config = orjson.loads((client.store.path / "config.json").read_bytes())
    assert config["limits"]["timeout"] == 900.0


def test_config_objects_and_their_keywords_build_the_same_settings(
    make_client: MakeClient,
) -> None:
    by_keywords = make_client(
        temperature=0.5, max_turns=3, timeout=20.0, stop_grace_s=0.5, max_retry_attempts=2
    ).settings
    by_objects = make_client(
        sampling={"temperature": 0.5},
        limits=RolloutLimits(max_turns=3, timeout=20.0, stop_grace_s=0.5),
        retry=dataclasses.replace(ROLLOUT_ATTEMPTS, attempts=2),
    ).settings
    assert by_keywords == by_objects
    assert by_objects.sampling == SamplingParams(temperature=0.5)
    assert by_objects.sampling_fixed == {"temperature"}


@pytest.mark.parametrize(
    ("objects", "keyword"),
    [
        ({"limits": RolloutLimits()}, {"timeout": 3.0}),
        ({"sampling": {"top_p": 0.9}}, {"temperature": 0.5}),
        ({"retry": RetryPolicy()}, {"max_retry_attempts": 1}),
    ],
)
def test_a_setting_given_both_ways_is_an_error_naming_it(
    make_client: MakeClient, objects: dict[str, Any], keyword: dict[str, Any]
) -> None:
    (name,) = keyword
    with pytest.raises(ConfigError, match=f"{name} is given twice"):
        make_client(**objects, **keyword)


def test_a_retry_policy_bounds_the_attempts(make_client: MakeClient) -> None:
    client = make_client(retry=RetryPolicy(attempts=1))
    (item,) = client.run_batch([{"task_id": "flaky", "end": "flaky"}])
    assert (item.result.error_kind, item.result.attempts) == ("infrastructure", 1)


def test_keyword_sampling_fixes_only_what_it_names(make_client: MakeClient) -> None:
    client = make_client(agent=AskingAgent, temperature=0.3)
    turn = client.invoke({"task_id": "k"}).result(timeout=30).trajectory.turns[0]
    assert turn.sampling["temperature"] == 0.3  # fixed by the client: the agent's 0.9 loses
    assert turn.sampling["top_p"] == 0.5 and turn.sampling["stop"] == ["\n\n"]  # the agent's


def test_a_whole_sampling_params_fixes_every_field_it_sets(make_client: MakeClient) -> None:
    client = make_client(agent=AskingAgent, sampling=SamplingParams(temperature=0.3, max_tokens=5))
    assert client.settings.sampling == SamplingParams(temperature=0.3, max_tokens=5)
    turn = client.invoke({"task_id": "w"}).result(timeout=30).trajectory.turns[0]
    assert (turn.sampling["temperature"], turn.sampling["top_p"]) == (0.3, 1.0)
    assert turn.sampling["max_tokens"] == 5 and len(turn.completion_ids) <= 5
    assert turn.sampling["stop"] == ["\n\n"]  # left unset by the client: the agent's


@pytest.mark.parametrize(
    "sampling", [{"temperature": 9.0}, {"temperature": True}, {"temprature": 1.0}]
)
def test_bad_sampling_fails_at_construction_naming_the_field(
    make_client: MakeClient, sampling: Any
) -> None:
    with pytest.raises(InvalidFieldsError, match=r"^temp"):
        make_client(sampling=sampling)


def test_the_keyword_options_are_exactly_the_settings_fields() -> None:
    names = set(get_type_hints(RolloutOptions))
    assert names == {*SAMPLING_NAMES, *LIMIT_NAMES, *RETRY_NAMES}


def status_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m for m in caplog.messages if m.startswith("batch status: 0/1 done")]


def test_a_hanging_batch_still_reports_on_a_timer(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(timeout=0.6, status_interval=0.1)
    with caplog.at_level(logging.INFO, logger="rollway.client"):
        batch = client.run_batch([{"task_id": "hang", "wait": 60}])
        item = next(batch)  # only when the timeout ends the one rollout
        before_it_ended = status_lines(caplog)
        list(batch)
    assert item.result.status == "timeout"
    assert len(before_it_ended) >= 2


async def test_a_hanging_async_batch_still_reports_on_a_timer(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(timeout=0.6, status_interval=0.1)
    with caplog.at_level(logging.INFO, logger="rollway.client"):
        seen = []
        async for item in client.run_batch_async([{"task_id": "hang", "wait": 60}]):
            seen.append((item.result.status, len(status_lines(caplog))))
    ((status, lines),) = seen
    assert status == "timeout" and lines >= 2


def test_a_status_interval_that_is_not_positive_fails_at_construction(
    make_client: MakeClient,
) -> None:
    with pytest.raises(ConfigError, match="status_interval must be a positive"):
        make_client(status_interval=0)


def test_top_logprobs_and_entropy_are_client_settings_every_turn_records(
    engine: EmbeddedEngine, renderer: ChatRenderer, tmp_path: Path
) -> None:
    gateway = Gateway(engine, renderer, model_name="smollm2")
    with RolloutClient(ScriptedAgent, gateway, store=str(tmp_path), top_logprobs=2,
                       record_entropy=True, max_tokens=6) as client:  # fmt: skip
        turn = client.invoke({"task_id": "w"}).result(timeout=60).trajectory.turns[0]
    assert turn.sampling["top_logprobs"] == 2 and turn.sampling["record_entropy"] is True
    assert turn.top_ids is not None and turn.entropy is not None
    assert [len(ids) for ids in turn.top_ids] == [2] * len(turn.completion_ids)
    assert len(turn.entropy) == len(turn.completion_ids)


def test_record_entropy_must_be_a_bool(make_client: MakeClient) -> None:
    with pytest.raises(InvalidFieldsError, match="record_entropy"):
        make_client(record_entropy="yes")
