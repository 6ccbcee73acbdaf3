"""The in-process data types."""

from __future__ import annotations

import dataclasses

from rollway.generation import SamplingParams


def test_sampling_params_to_dict_names_every_field() -> None:
    params = SamplingParams(temperature=0.5, stop=("x",), stop_token_ids=(3,), seed=9,
                            top_logprobs=2, record_entropy=True)  # fmt: skip
    assert params.to_dict() == {
        **{f.name: getattr(params, f.name) for f in dataclasses.fields(params)},
        "stop": ["x"],
        "stop_token_ids": [3],
    }
    # What to record beside the tokens appears only where asked (a dict per recorded turn).
    plain = SamplingParams().to_dict()
    assert "top_logprobs" not in plain and "record_entropy" not in plain
