"""``SamplingParams`` checks what it records beside the tokens: a ``record_entropy`` that is not
a bool (``"no"`` is truthy) would silently record, or not, what the caller did not mean."""

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
