"""The in-process data types."""

from __future__ import annotations

import dataclasses

from rollway.types import SamplingParams


def test_sampling_params_to_dict_names_every_field() -> None:
    params = SamplingParams(temperature=0.5, stop=("x",), stop_token_ids=(3,), seed=9)
    assert params.to_dict() == {
        **{f.name: getattr(params, f.name) for f in dataclasses.fields(params)},
        "stop": ["x"],
        "stop_token_ids": [3],
    }
