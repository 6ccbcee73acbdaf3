"""``SamplingParams`` checks what it is given in-process as the HTTP schema does over the wire:
a ``record_entropy`` that is not a bool (``"no"`` is truthy) would silently record, or not,
what the caller did not mean; a ``temperature`` of ``"0.5"`` would fail deep in an engine, or
be sent on to a server, with nothing naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from rollway.errors import InvalidFieldsError
from rollway.generation import SamplingParams


@pytest.mark.parametrize("value", ["no", "true", 1, 0, None])
def test_record_entropy_that_is_not_a_bool_is_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(InvalidFieldsError, match="record_entropy") as raised:
        SamplingParams(record_entropy=value)
    assert raised.value.param == "record_entropy"


@pytest.mark.parametrize("value", [True, False])
def test_record_entropy_bools_are_taken_as_given(value: bool) -> None:
    assert SamplingParams(record_entropy=value).to_dict().get("record_entropy", False) is value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", "0.5"),
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("temperature", True),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", float("nan")),
        ("top_p", None),
        ("top_k", -2),
        ("top_k", 2.0),
        ("max_tokens", -1),
        ("max_tokens", 0),
        ("temperature", 2.5),
        ("max_tokens", "16"),
        ("seed", 1.5),
        ("seed", 2**63),
        ("stop", [""]),
        ("stop", ("</a>", "")),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [2**40]),
        ("stop_token_ids", [2**31]),
    ],
)
def test_sampling_fields_of_the_wrong_type_or_range_are_refused_naming_them(
    field: str, value: Any
) -> None:
    with pytest.raises(InvalidFieldsError, match=field) as raised:
        SamplingParams(**{field: value})
    assert raised.value.param == field


def test_the_edges_of_each_range_are_taken() -> None:
    edges = SamplingParams(temperature=0, top_p=1, top_k=0, max_tokens=1, seed=-(2**63))
    assert edges.to_dict()["temperature"] == 0 and edges.seed == -(2**63)
    assert SamplingParams(temperature=2.0, top_p=1e-9, seed=2**63 - 1).top_p == 1e-9
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM's "off", as the HTTP schema takes it


def test_the_edges_of_stop_ids_and_strings_are_taken() -> None:
    edges = SamplingParams(stop=" ", stop_token_ids=[0, 2**31 - 1])
    assert edges.stop == (" ",) and edges.stop_token_ids == (0, 2**31 - 1)
