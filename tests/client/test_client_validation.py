"""What a client refuses, naming the argument (a ``ConfigError``, not a hang or a raw
``TypeError`` later), what it accepts in place of a config object (a mapping of its fields), and
a closed client refusing new work."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from rollway import RetryPolicy, RolloutLimits, SamplingParams
from rollway.client import RolloutClient
from rollway.client.client_config import Pacing
from rollway.client.watchdog import DEFAULT_STUCK_AFTER_S
from rollway.errors import ConfigError, InvalidFieldsError
from rollway.retry import Backoff
from rollway.rollouts import ServingConfig

MakeClient = Callable[..., RolloutClient]
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"max_concurrent": 0}, "max_concurrent"),
        ({"max_concurrent": -1}, "max_concurrent"),
        ({"max_concurrent": "4"}, "max_concurrent"),
        ({"max_concurrent": True}, "max_concurrent"),
        ({"tps_limit": -1}, "tps_limit"),
        ({"tps_limit": 0}, "tps_limit"),
        ({"tps_limit": NAN}, "tps_limit"),
        ({"tps_limit": INF}, "tps_limit"),
        ({"tps_limit": "5"}, "tps_limit"),
        ({"status_interval": "30"}, "status_interval"),
        ({"status_interval": NAN}, "status_interval"),
        ({"stuck_after_s": "10"}, "stuck_after_s"),
        ({"stuck_after_s": -1}, "stuck_after_s"),
        ({"stuck_after_s": NAN}, "stuck_after_s"),
        ({"limits": 5}, "limits"),
        ({"limits": {"timout": 5}}, "timout"),
        ({"limits": {"timeout": -1}}, "timeout"),
        ({"limits": {"max_seq_len": 2**63}}, "max_seq_len"),
        ({"limits": {"max_seq_len": 2**31}}, "max_seq_len"),
        ({"retry": {"attempts": 0}}, "attempts"),
        ({"retry": {"backoff": {"first_s": -5}}}, "first_s"),
        ({"serving": {"port": "80"}}, "port"),
        ({"serving": {"prot": 80}}, "prot"),
    ],
)
def test_a_bad_argument_is_refused_at_construction_naming_it(
    make_client: MakeClient, kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        make_client(**kwargs)
    assert raised.value.param == param
    assert param in str(raised.value)


def test_an_unknown_config_field_suggests_the_right_one(make_client: MakeClient) -> None:
    with pytest.raises(ConfigError, match="unknown limits field 'timout': did you mean 'timeout'"):
        make_client(limits={"timout": 5})


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"port": "80"}, "port"),
        ({"port": -1}, "port"),
        ({"port": 70000}, "port"),
        ({"port": True}, "port"),
        ({"host": 5}, "host"),
        ({"host": ""}, "host"),
        ({"public_url": "localhost:8200"}, "public_url"),
        ({"public_url": "ftp://host"}, "public_url"),
        ({"public_url": "http://"}, "public_url"),
        ({"callback": "no"}, "callback"),
    ],
)
def test_a_bad_serving_config_is_refused_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        ServingConfig(**fields)
    assert raised.value.param == param


def test_a_serving_config_takes_what_is_valid() -> None:
    config = ServingConfig(host="0.0.0.0", port=65535, public_url="https://runs.example:8200/x")
    assert (config.port, config.public_url) == (65535, "https://runs.example:8200/x")


def test_config_objects_may_be_given_as_mappings(make_client: MakeClient) -> None:
    client = make_client(
        limits={"timeout": 5, "max_turns": 1},
        retry={"attempts": 2, "backoff": {"first_s": 0.1}},
        serving={"port": 0},
    )
    assert client.settings.limits == RolloutLimits(timeout=5, max_turns=1)
    assert (client.settings.retry.attempts, client.settings.retry.backoff) == (2, Backoff(0.1))
    record = client.invoke({"task_id": "m", "chats": 2}).result(timeout=30)
    assert record.status == "truncated" and len(record.trajectory.turns) == 1  # max_turns held


def test_a_retry_mapping_retries_like_the_policy_it_names(make_client: MakeClient) -> None:
    by_mapping = make_client(retry={"attempts": 1}).settings.retry
    assert by_mapping == make_client(retry=RetryPolicy(attempts=1)).settings.retry


@pytest.mark.parametrize(
    "options",
    [
        {"temperature": "0.5"},
        {"temperature": True},
        {"max_tokens": True},
        {"top_k": "3"},
        {"seed": False},
        {"sampling": {"top_p": "0.9"}},
    ],
)
def test_sampling_numbers_are_not_coerced_from_strings_or_bools(
    make_client: MakeClient, options: dict[str, Any]
) -> None:
    (name,) = options.get("sampling", options)
    with pytest.raises(InvalidFieldsError, match=f"^{name}: must be a (whole )?number") as raised:
        make_client(**options)
    assert raised.value.param == name
    client = make_client()
    if "sampling" not in options:  # per call too
        with pytest.raises(InvalidFieldsError, match=f"^{name}"):
            client.invoke({"task_id": "s"}, **options)


def test_sampling_numbers_still_take_ints_for_floats(make_client: MakeClient) -> None:
    assert make_client(temperature=1, top_p=1).settings.sampling == SamplingParams(
        temperature=1.0, top_p=1.0
    )


@pytest.mark.parametrize("group_size", ["2", 0, -1, 1.5, True])
def test_a_bad_group_size_is_refused_before_the_batch_starts(
    make_client: MakeClient, group_size: Any
) -> None:
    client = make_client()
    for run in (client.run_batch, client.run_batch_async):
        with pytest.raises(ConfigError, match="group_size must be a whole number") as raised:
            run([{"task_id": "g"}], group_size)
        assert raised.value.param == "group_size"
    assert not list(client.store.records())


def test_a_task_that_is_not_a_dict_is_refused_naming_its_index(make_client: MakeClient) -> None:
    client = make_client()
    for run in (client.run_batch, client.run_batch_async):
        with pytest.raises(ConfigError, match=r"^tasks\[1\] must be a dict, not int") as raised:
            run([{"task_id": "ok"}, 5])
        assert raised.value.param == "tasks"
    with pytest.raises(ConfigError, match=r"^task must be a dict, not str") as raised:
        client.invoke("what is 2 + 2?")  # type: ignore[arg-type]
    assert raised.value.param == "task"
    assert not list(client.store.records())


def test_a_listener_queue_must_hold_something(make_client: MakeClient) -> None:
    with pytest.raises(ConfigError, match="max_queued must be") as raised:
        make_client().events(max_queued=0)
    assert raised.value.param == "max_queued"


def test_a_closed_client_refuses_new_rollouts_clearly(make_client: MakeClient) -> None:
    client = make_client()
    client.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls: list[Callable[[], Any]] = [
            lambda: client.invoke({"task_id": "late"}),
            lambda: client.run_batch([{"task_id": "late"}]),
            lambda: client.run_batch_async([{"task_id": "late"}]),
            lambda: asyncio.run(client.invoke_async({"task_id": "late"})),
            lambda: client.update_weights({}),
        ]
        for call in calls:
            with pytest.raises(ConfigError, match=r"^this client is closed: make a new one"):
                call()
        gc.collect()  # a coroutine never awaited would warn now
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]


def test_pacing_is_one_value_checked_where_it_is_made() -> None:
    assert Pacing().watch_after_s == DEFAULT_STUCK_AFTER_S
    assert Pacing(stuck_after_s=0).watch_after_s is None  # as --stuck-after 0: never
    bad: list[dict[str, Any]] = [
        {"max_concurrent": 0},
        {"tps_limit": 0.0},
        {"status_interval": -1.0},
        {"stuck_after_s": -1.0},
    ]
    for fields in bad:
        with pytest.raises(ConfigError, match=next(iter(fields))):
            Pacing(**fields)


def test_the_client_keeps_its_keywords_and_groups_them(make_client: MakeClient) -> None:
    client = make_client(max_concurrent=3, tps_limit=50.0, abort_stuck=True)
    assert client.pacing == Pacing(max_concurrent=3, tps_limit=50.0, abort_stuck=True)
