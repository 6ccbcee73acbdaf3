"""Top logprobs and entropy from the embedded engine: per sampled token, the ``top_logprobs``
most likely ids of the distribution the token was drawn from (``log_softmax(logits / T)``) and
that distribution's entropy, checked against a fresh forward pass; streamed the same."""

from __future__ import annotations

import pytest
import torch

from rollway.engines.embedded import EmbeddedEngine
from rollway.engines.streaming import collect, stream_generation
from rollway.errors import InvalidFieldsError
from rollway.generation import SamplingParams
from tests.engines.embedded.test_embedded import prompt
from tests.engines.embedded.test_embedded_temperature import forward_logits


@pytest.mark.parametrize("temperature", [0.7, 1.0, 0.0])
async def test_top_logprobs_and_entropy_match_a_fresh_forward_pass(
    engine: EmbeddedEngine, temperature: float
) -> None:
    input_ids = prompt(engine, "Name three rivers.")
    sampling = SamplingParams(
        temperature=temperature, max_tokens=10, seed=4, top_logprobs=5, record_entropy=True
    )
    result = await engine.generate(input_ids, sampling, f"top-{temperature}")
    assert result.top_ids is not None and result.top_logprobs is not None
    assert result.entropy is not None
    assert len(result.top_ids) == len(result.entropy) == len(result.output_ids)
    logits = forward_logits(engine, input_ids, result.output_ids)
    scale = temperature if temperature not in (0.0, 1.0) else 1.0
    logprobs = torch.log_softmax(logits / scale, dim=-1)
    for row, token in enumerate(result.output_ids):
        expected = torch.topk(logprobs[row], 5)
        # Ties at the fifth place may order differently between passes; the values may not.
        assert result.top_logprobs[row] == pytest.approx(expected.values.tolist(), abs=1e-3)
        assert result.top_ids[row][0] == int(expected.indices[0])
        assert result.top_logprobs[row] == sorted(result.top_logprobs[row], reverse=True)
        probs = logprobs[row].exp()
        assert result.entropy[row] == pytest.approx(float(-(probs * logprobs[row]).sum()), abs=1e-3)
        # The sampled token's logprob is the one its top list gives it, when it is in the list.
        if token in result.top_ids[row]:
            at = result.top_ids[row].index(token)
            assert result.logprobs[row] == pytest.approx(result.top_logprobs[row][at], abs=1e-6)
    if temperature == 0.0:  # greedy: the sampled token is the most likely one
        assert [ids[0] for ids in result.top_ids] == result.output_ids


async def test_not_asked_nothing_is_recorded(engine: EmbeddedEngine) -> None:
    result = await engine.generate(
        prompt(engine, "Hi"), SamplingParams(temperature=0.7, max_tokens=4, seed=1), "plain"
    )
    assert result.top_ids is None and result.top_logprobs is None and result.entropy is None


async def test_streamed_chunks_carry_the_same_top_logprobs_and_entropy(
    engine: EmbeddedEngine,
) -> None:
    input_ids = prompt(engine, "Count to five.")
    sampling = SamplingParams(
        temperature=0.7, max_tokens=12, seed=9, top_logprobs=3, record_entropy=True
    )
    plain = await engine.generate(input_ids, sampling, "plain")
    chunks = [c async for c in stream_generation(engine, input_ids, sampling, "streamed")]
    streamed = collect(chunks)
    assert streamed.output_ids == plain.output_ids
    assert streamed.top_ids == plain.top_ids
    assert streamed.top_logprobs is not None and plain.top_logprobs is not None
    for got, want in zip(streamed.top_logprobs, plain.top_logprobs, strict=True):
        assert got == pytest.approx(want, abs=1e-4)
    assert streamed.entropy == pytest.approx(plain.entropy, abs=1e-4)


@pytest.mark.parametrize("bad", [-1, 21, 2.5, True, "5"])
def test_top_logprobs_outside_0_to_20_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(InvalidFieldsError, match="top_logprobs") as caught:
        SamplingParams(top_logprobs=bad)  # type: ignore[arg-type]
    assert caught.value.param == "top_logprobs"
